package kubelettest_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// rawPlugin is a minimal device plugin that streams two devices and never ends the stream
// on its own; it registers whenever the test says so (duplicates included).
type rawPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	path string
}

func (rawPlugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	err := s.Send(&pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{
		{ID: "a", Health: pluginapi.Healthy}, {ID: "b", Health: pluginapi.Unhealthy},
	}})
	if err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func (rawPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{PreStartRequired: true}, nil
}

func startRawPlugin(t *testing.T, dir string) *rawPlugin {
	t.Helper()
	p := &rawPlugin{path: filepath.Join(dir, "p.sock")}
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "unix", p.path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return p
}

func register(t *testing.T, k *kubelettest.Kubelet, req *pluginapi.RegisterRequest) error {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+k.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_, err = pluginapi.NewRegistrationClient(conn).Register(t.Context(), req)
	return err
}

func wait(t *testing.T, k *kubelettest.Kubelet, cond func(kubelettest.State) bool) kubelettest.State {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := k.WaitFor(ctx, cond)
	if err != nil {
		t.Fatalf("%v; state %+v", err, s)
	}
	return s
}

func TestRegisterValidation(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		req     *pluginapi.RegisterRequest
		reject  error
		wantErr string
	}{
		"valid":              {req: &pluginapi.RegisterRequest{Version: "v1beta1", ResourceName: "vendor.com/gpu"}},
		"no slash":           {req: &pluginapi.RegisterRequest{Version: "v1beta1", ResourceName: "gpu"}, wantErr: `the ResourceName "gpu" is invalid`},
		"kubernetes.io":      {req: &pluginapi.RegisterRequest{Version: "v1beta1", ResourceName: "kubernetes.io/gpu"}, wantErr: "is invalid"},
		"requests. prefix":   {req: &pluginapi.RegisterRequest{Version: "v1beta1", ResourceName: "requests.vendor.com/gpu"}, wantErr: "is invalid"},
		"old version":        {req: &pluginapi.RegisterRequest{Version: "v1alpha", ResourceName: "vendor.com/gpu"}, wantErr: `requested API version "v1alpha" is not supported by kubelet`},
		"rejected on demand": {req: &pluginapi.RegisterRequest{Version: "v1beta1", ResourceName: "vendor.com/gpu"}, reject: errors.New("go away"), wantErr: "go away"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			k := kubelettest.Start(t)
			startRawPlugin(t, k.Dir())
			k.Reject(tc.reject)
			tc.req.Endpoint = "p.sock"
			err := register(t, k, tc.req)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Register: %v, want error containing %q", err, tc.wantErr)
			}
			s := k.State()
			if len(s.Requests) != 1 || s.Requests[0].GetResourceName() != tc.req.GetResourceName() {
				t.Errorf("Requests = %v", s.Requests)
			}
			if want := 0; tc.wantErr == "" {
				want = 1
				if s.Registrations != want {
					t.Errorf("Registrations = %d, want %d", s.Registrations, want)
				}
			}
		})
	}
}

func TestReadsStreamAndDetectsDuplicates(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	startRawPlugin(t, k.Dir())
	req := &pluginapi.RegisterRequest{Version: "v1beta1", Endpoint: "p.sock", ResourceName: "vendor.com/gpu"}
	if err := register(t, k, req); err != nil {
		t.Fatal(err)
	}
	s := wait(t, k, func(s kubelettest.State) bool {
		p, ok := s.Resource("vendor.com/gpu")
		return ok && p.Messages == 1
	})
	p, _ := s.Resource("vendor.com/gpu")
	if len(p.Devices) != 2 || p.Healthy() != 1 || !p.Options.GetPreStartRequired() || p.SocketPath != filepath.Join(k.Dir(), "p.sock") {
		t.Errorf("plugin = %+v", p)
	}
	err := register(t, k, req)
	if err == nil || !strings.Contains(err.Error(), "device plugin already connected") {
		t.Fatalf("second Register: %v, want the kubelet's duplicate error", err)
	}
	if s := k.State(); s.Duplicates != 1 || s.Registrations != 1 {
		t.Errorf("Duplicates, Registrations = %d, %d; want 1, 1", s.Duplicates, s.Registrations)
	}
}

func TestRestart(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	plug := startRawPlugin(t, k.Dir())
	if err := os.WriteFile(filepath.Join(k.Dir(), "checkpoint"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := register(t, k, &pluginapi.RegisterRequest{Version: "v1beta1", Endpoint: "p.sock", ResourceName: "vendor.com/gpu"}); err != nil {
		t.Fatal(err)
	}
	wait(t, k, func(s kubelettest.State) bool { _, ok := s.Resource("vendor.com/gpu"); return ok })
	if err := k.Restart(); err != nil {
		t.Fatal(err)
	}
	s := k.State()
	if _, ok := s.Resource("vendor.com/gpu"); ok || s.Restarts != 1 {
		t.Errorf("after Restart: plugin still connected or Restarts = %d", s.Restarts)
	}
	if _, err := os.Stat(plug.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("plugin socket after Restart: %v, want deleted", err)
	}
	if _, err := os.Stat(filepath.Join(k.Dir(), "checkpoint")); err != nil {
		t.Errorf("regular file after Restart: %v, want kept", err)
	}
	// A new kubelet.sock (the inode may be reused, so it is proven by serving).
	startRawPlugin(t, k.Dir())
	if err := register(t, k, &pluginapi.RegisterRequest{Version: "v1beta1", Endpoint: "p.sock", ResourceName: "vendor.com/gpu"}); err != nil {
		t.Fatalf("Register after Restart: %v", err)
	}
	if s := k.State(); s.Registrations != 2 {
		t.Errorf("Registrations = %d, want 2", s.Registrations)
	}
	if len(k.SocketPath()) >= 108 {
		t.Errorf("socket path %d bytes", len(k.SocketPath()))
	}
}
