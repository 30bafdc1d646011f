package kubelet_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/test/e2e/harness"
	"github.com/hamireg/hamireg/test/e2e/internal/testplugin"
)

func startRegistrationServer(t *testing.T) *kubeletpeer.RegistrationServer {
	t.Helper()
	srv, err := kubeletpeer.StartRegistrationServer(t.Context(), harness.ShortTempDir(t))
	if err != nil {
		t.Fatalf("start registration server: %v", err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	return srv
}

func waitForEvent(t *testing.T, srv *kubeletpeer.RegistrationServer, kind kubeletpeer.EventKind) kubeletpeer.Event {
	t.Helper()
	return harness.WaitForEvent(t, srv, string(kind), func(e kubeletpeer.Event) bool { return e.Kind == kind && e.Resource == resource })
}

// A minimal plugin registers; the kubelet dials back to <dir>/<Endpoint>, asks for the
// options, streams the device list and sees the stream end when the plugin stops.
func TestRegistrationServerAcceptsMinimalPlugin(t *testing.T) {
	t.Parallel()
	srv := startRegistrationServer(t)
	p := startPlugin(t, srv.Dir(), testplugin.Devices(1, 1))

	if err := p.Register(t.Context(), srv.SocketPath(), resource); err != nil {
		t.Fatalf("Register: %v", err)
	}
	conn := waitForEvent(t, srv, kubeletpeer.EventConnected)
	if conn.SocketPath != p.SocketPath() {
		t.Errorf("kubelet dialled %s, want the plugin's socket %s", conn.SocketPath, p.SocketPath())
	}
	lw := waitForEvent(t, srv, kubeletpeer.EventListAndWatch)
	if len(lw.Devices) != 2 || lw.Healthy() != 1 {
		t.Errorf("ListAndWatch: %d devices, %d healthy; want 2 and 1", len(lw.Devices), lw.Healthy())
	}

	p.SetDevices(testplugin.Devices(3, 0))
	if lw := waitForEvent(t, srv, kubeletpeer.EventListAndWatch); lw.Healthy() != 3 {
		t.Errorf("after update: %d healthy, want 3", lw.Healthy())
	}

	p.Stop()
	waitForEvent(t, srv, kubeletpeer.EventDisconnected)
	if err := srv.Check(); err != nil {
		t.Errorf("kubelet healthz check: %v", err)
	}
}

// The kubelet validates Register with its own rules and answers with plain errors, which a
// plugin sees as gRPC code Unknown carrying the kubelet's message.
func TestRegistrationServerRejectsInvalidRequests(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		resource, version string
		want              string
	}{
		"name without a domain":    {resource: "gpu", want: `the ResourceName "gpu" is invalid`},
		"kubernetes.io namespace":  {resource: "kubernetes.io/gpu", want: `the ResourceName "kubernetes.io/gpu" is invalid`},
		"requests. prefix":         {resource: "requests.vendor.example.com/gpu", want: `the ResourceName "requests.vendor.example.com/gpu" is invalid`},
		"unsupported API version":  {resource: resource, version: "v1alpha1", want: `requested API version "v1alpha1" is not supported by kubelet. Supported version is ["v1beta1"]`},
		"empty resource name":      {resource: "", want: `the ResourceName "" is invalid`},
		"name with two slashes":    {resource: "a.example.com/b/c", want: `the ResourceName "a.example.com/b/c" is invalid`},
		"upper case domain prefix": {resource: "Vendor.Example.com/gpu", want: `the ResourceName "Vendor.Example.com/gpu" is invalid`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := startRegistrationServer(t)
			p := startPlugin(t, srv.Dir(), testplugin.Devices(1, 0))
			version := tc.version
			if version == "" {
				version = "v1beta1"
			}
			err := p.RegisterVersion(t.Context(), srv.SocketPath(), tc.resource, version)
			if err == nil {
				t.Fatal("Register succeeded, want an error")
			}
			st, ok := status.FromError(err)
			if !ok || st.Code() != codes.Unknown {
				t.Errorf("error %v: want gRPC code Unknown", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %q, want it to contain %q", err, tc.want)
			}
			select {
			case ev := <-srv.Events():
				t.Errorf("kubelet reacted to a rejected Register: %+v", ev)
			default:
			}
		})
	}
}

// A kubelet restart deletes the plugin's socket, disconnects it and re-creates
// kubelet.sock; a plugin that serves again and re-registers is connected again.
func TestRegistrationServerRestartDeletesPluginSockets(t *testing.T) {
	t.Parallel()
	srv := startRegistrationServer(t)
	p := startPlugin(t, srv.Dir(), testplugin.Devices(2, 0))
	if err := p.Register(t.Context(), srv.SocketPath(), resource); err != nil {
		t.Fatalf("Register: %v", err)
	}
	waitForEvent(t, srv, kubeletpeer.EventListAndWatch)

	if err := srv.Restart(); err != nil {
		t.Fatalf("restart: %v", err)
	}
	waitForEvent(t, srv, kubeletpeer.EventDisconnected)
	if _, err := os.Stat(p.SocketPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("plugin socket after kubelet restart: stat err = %v, want it deleted", err)
	}
	if _, err := os.Stat(srv.SocketPath()); err != nil {
		t.Errorf("kubelet.sock after restart: %v", err)
	}

	if err := p.Restart(); err != nil {
		t.Fatalf("plugin restart: %v", err)
	}
	if err := p.Register(t.Context(), srv.SocketPath(), resource); err != nil {
		t.Fatalf("re-Register: %v", err)
	}
	if lw := waitForEvent(t, srv, kubeletpeer.EventListAndWatch); lw.Healthy() != 2 {
		t.Errorf("after re-registration: %d healthy, want 2", lw.Healthy())
	}
}
