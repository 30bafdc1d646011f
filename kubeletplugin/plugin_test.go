package kubeletplugin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const resource = "nvidia.com/gpu"

func gpus(healthy ...bool) []annotation.Device {
	var out []annotation.Device
	for i, h := range healthy {
		out = append(out, annotation.Device{ID: "GPU-" + string(rune('a'+i)), Index: uint(i), Count: 3, Numa: i % 2, Health: h})
	}
	return out
}

// runPlugin starts Run in the background; the returned func cancels it and returns Run's error.
func runPlugin(t *testing.T, opts kubeletplugin.Options, devices []annotation.Device) (*kubeletplugin.Plugin, func() error) {
	t.Helper()
	p, err := kubeletplugin.New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	p.SetDevices(devices)
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	stopped := false
	var runErr error
	stop := func() error {
		if !stopped {
			cancel()
			runErr = <-done
			stopped = true
		}
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return p, stop
}

func waitFor(t *testing.T, k *kubelettest.Kubelet, what string, cond func(kubelettest.State) bool) kubelettest.State {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	s, err := k.WaitFor(ctx, cond)
	if err != nil {
		t.Fatalf("waiting for %s: %v; state: %+v", what, err, s)
	}
	return s
}

// waitForStats polls p.Stats (the plugin's counters move after the kubelet has seen the
// effect, so they are polled, not read once).
func waitForStats(t *testing.T, p *kubeletplugin.Plugin, cond func(kubeletplugin.Stats) bool) {
	t.Helper()
	for range 2000 {
		if cond(p.Stats()) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("Stats = %+v, condition not met", p.Stats())
}

func devicesWithHealthy(total, healthy int) func(kubelettest.State) bool {
	return func(s kubelettest.State) bool {
		p, ok := s.Resource(resource)
		return ok && len(p.Devices) == total && p.Healthy() == healthy
	}
}

func TestNewValidation(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		opts    kubeletplugin.Options
		wantErr bool
	}{
		"zero":                    {},
		"plugin watcher":          {opts: kubeletplugin.Options{Mode: kubeletplugin.ModePluginWatcher}},
		"unknown mode":            {opts: kubeletplugin.Options{Mode: 7}, wantErr: true},
		"socket with slash":       {opts: kubeletplugin.Options{SocketName: "a/b.sock"}, wantErr: true},
		"not .sock":               {opts: kubeletplugin.Options{SocketName: "gpu"}, wantErr: true},
		"kubelet.sock":            {opts: kubeletplugin.Options{SocketName: "kubelet.sock"}, wantErr: true},
		"path too long":           {opts: kubeletplugin.Options{PluginDir: "/" + strings.Repeat("d", 100)}, wantErr: true},
		"vendor without resource": {opts: kubeletplugin.Options{Vendor: annotation.Vendor{Name: "X", RegisterKey: "x"}}, wantErr: true},
		"negative backoff":        {opts: kubeletplugin.Options{InitialBackoff: -time.Second}, wantErr: true},
		"max below initial":       {opts: kubeletplugin.Options{InitialBackoff: time.Minute, MaxBackoff: time.Second}, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := kubeletplugin.New(tc.opts)
			if (err != nil) != tc.wantErr {
				t.Fatalf("New: err = %v, want error %v", err, tc.wantErr)
			}
			if err != nil && !errors.Is(err, kubeletplugin.ErrInvalidOptions) {
				t.Errorf("err = %v, want ErrInvalidOptions", err)
			}
		})
	}
}

// The socket name follows the vendor, so that agents of two vendors on one node do not collide.
func TestSocketNameFromVendor(t *testing.T) {
	t.Parallel()
	for _, v := range []annotation.Vendor{annotation.NVIDIA(), annotation.Ascend("Ascend910B3"), annotation.NewVendor("ACME", "acme.example/npu")} {
		dir := t.TempDir()
		p, err := kubeletplugin.New(kubeletplugin.Options{Vendor: v, PluginDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := p.SocketPath(), filepath.Join(dir, v.SocketName()); got != want {
			t.Errorf("vendor %s: socket %s, want %s", v.Name, got, want)
		}
	}
	if got := annotation.NVIDIA().SocketName(); got != kubeletplugin.DefaultSocketName {
		t.Errorf("NVIDIA's socket %s, want DefaultSocketName %s", got, kubeletplugin.DefaultSocketName)
	}
	_, err := kubeletplugin.New(kubeletplugin.Options{Vendor: annotation.Vendor{Name: "X", ResourceName: "gpu"}})
	if !errors.Is(err, annotation.ErrIncompleteVendor) || !strings.Contains(err.Error(), "<domain>/<name>") {
		t.Errorf("New with resource gpu: %v, want ErrIncompleteVendor naming the form", err)
	}
}

func TestVirtualDevices(t *testing.T) {
	t.Parallel()
	topo := func(n int64) *pluginapi.TopologyInfo {
		return &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: n}}}
	}
	tests := map[string]struct {
		devices []annotation.Device
		numa    bool
		want    []*pluginapi.Device
	}{
		"none":           {want: []*pluginapi.Device{}},
		"none with numa": {numa: true, devices: []annotation.Device{}, want: []*pluginapi.Device{}},
		"count wins, canonical order, health; no numa by default": {
			devices: []annotation.Device{
				{ID: "GPU-b", Index: 1, Count: 1, Numa: 1, Health: false},
				{ID: "GPU-a", Index: 0, Count: 2, Numa: 0, Health: true},
			},
			want: []*pluginapi.Device{
				{ID: "GPU-a-0", Health: pluginapi.Healthy},
				{ID: "GPU-a-1", Health: pluginapi.Healthy},
				{ID: "GPU-b-0", Health: pluginapi.Unhealthy},
			},
		},
		"numa on: each replica carries its GPU's node": {
			numa: true,
			devices: []annotation.Device{
				{ID: "GPU-b", Index: 1, Count: 1, Numa: 1, Health: false},
				{ID: "GPU-a", Index: 0, Count: 2, Numa: 0, Health: true},
			},
			want: []*pluginapi.Device{
				{ID: "GPU-a-0", Health: pluginapi.Healthy, Topology: topo(0)},
				{ID: "GPU-a-1", Health: pluginapi.Healthy, Topology: topo(0)},
				{ID: "GPU-b-0", Health: pluginapi.Unhealthy, Topology: topo(1)},
			},
		},
		"numa on, unknown node: no topology": {
			numa:    true,
			devices: []annotation.Device{{ID: "GPU-a", Count: 1, Numa: -1, Health: true}},
			want:    []*pluginapi.Device{{ID: "GPU-a-0", Health: pluginapi.Healthy}},
		},
		"MIG devices: once, unsplit, topology whatever the flag": {
			devices: []annotation.Device{
				{ID: "MIG-b", Index: 0, Count: 7, Numa: 1, Health: true},
				{ID: "MIG-c", Index: 0, Count: 0, Numa: -1, Health: false},
				{ID: "GPU-a", Index: 1, Count: 1, Numa: 1, Health: true},
			},
			want: []*pluginapi.Device{
				{ID: "MIG-b", Health: pluginapi.Healthy, Topology: topo(1)},
				{ID: "MIG-c", Health: pluginapi.Unhealthy},
				{ID: "GPU-a-0", Health: pluginapi.Healthy},
			},
		},
		"count is trusted: zero and negative publish nothing": {
			numa:    true,
			devices: []annotation.Device{{ID: "GPU-a", Health: true}, {ID: "GPU-b", Index: 1, Count: -3, Health: true}, {ID: "GPU-c", Index: 2, Count: 1}},
			want:    []*pluginapi.Device{{ID: "GPU-c-0", Health: pluginapi.Unhealthy, Topology: topo(0)}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got := kubeletplugin.VirtualDevices(tc.devices, tc.numa)
			if diff := cmp.Diff(tc.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("VirtualDevices (-want +got):\n%s", diff)
			}
		})
	}
}

// The constants that are the kubelet's stay in step with k8s.io/kubelet.
func TestKubeletConstants(t *testing.T) {
	t.Parallel()
	if got, want := kubeletplugin.KubeletSocketName, filepath.Base(pluginapi.KubeletSocket); got != want {
		t.Errorf("KubeletSocketName = %q, want %q", got, want)
	}
	if got, want := filepath.Join(kubeletplugin.DefaultPluginDir, kubeletplugin.KubeletSocketName), pluginapi.KubeletSocket; got != want {
		t.Errorf("default kubelet socket %q, want %q", got, want)
	}
	if got, want := kubeletplugin.PluginDirFromRootDir("/var/lib/kubelet"), filepath.Clean(kubeletplugin.DefaultPluginDir); got != want {
		t.Errorf("PluginDirFromRootDir(default root) = %q, want %q", got, want)
	}
}

func TestPluginDirFromRootDir(t *testing.T) {
	t.Parallel()
	if got, want := kubeletplugin.PluginDirFromRootDir("/var/lib/k0s/kubelet"), "/var/lib/k0s/kubelet/device-plugins"; got != want {
		t.Errorf("PluginDirFromRootDir = %q, want %q", got, want)
	}
	if got, want := kubeletplugin.RegistryDirFromRootDir("/data/kubelet"), "/data/kubelet/plugins_registry"; got != want {
		t.Errorf("RegistryDirFromRootDir = %q, want %q", got, want)
	}
}

func TestRunRegistersAndStreamsHealth(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	p, stop := runPlugin(t, kubeletplugin.Options{PluginDir: k.Dir(), SocketName: "hami.sock"}, gpus(true, false))

	s := waitFor(t, k, "3 of 6 healthy", devicesWithHealthy(6, 3))
	want := &pluginapi.RegisterRequest{Version: "v1beta1", Endpoint: "hami.sock", ResourceName: resource, Options: &pluginapi.DevicePluginOptions{}}
	if diff := cmp.Diff([]*pluginapi.RegisterRequest{want}, s.Requests, protocmp.Transform()); diff != "" {
		t.Errorf("Register requests (-want +got):\n%s", diff)
	}
	if got := p.SocketPath(); got != filepath.Join(k.Dir(), "hami.sock") {
		t.Errorf("SocketPath = %q", got)
	}

	p.SetDevices(gpus(true, true)) // recovery
	waitFor(t, k, "6 of 6 healthy", devicesWithHealthy(6, 6))
	p.SetDevices(gpus(true, true)) // no change: no resend
	p.SetDevices(gpus(false, false, true))
	waitFor(t, k, "3 of 9 healthy", devicesWithHealthy(9, 3))
	waitForStats(t, p, func(st kubeletplugin.Stats) bool { return st.Registrations == 1 && st.Streams == 1 && st.Sends == 3 })

	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	waitFor(t, k, "stream closed", func(s kubelettest.State) bool { _, ok := s.Resource(resource); return !ok })
	if _, err := os.Stat(p.SocketPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after Run: %v, want removed", err)
	}
}

func TestRunReregistersAfterKubeletRestart(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	p, _ := runPlugin(t, kubeletplugin.Options{PluginDir: k.Dir(), ResyncPeriod: time.Hour}, gpus(true))
	waitFor(t, k, "registration", devicesWithHealthy(3, 3))
	for i := range 3 {
		if err := k.Restart(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, k, "re-registration", func(s kubelettest.State) bool {
			return s.Restarts == i+1 && devicesWithHealthy(3, 3)(s)
		})
	}
	s := k.State()
	if s.Duplicates != 0 {
		t.Errorf("Duplicates = %d, want 0", s.Duplicates)
	}
	// Every kubelet got a Register call. A restart can cut a Register the kubelet had already
	// accepted: the plugin sees an error, but the kubelet's stream proves the registration, so
	// it is counted as a failure and not repeated (a repeat would be the duplicate-Register
	// trap). So count calls, successful or cut.
	waitForStats(t, p, func(st kubeletplugin.Stats) bool { return st.Registrations+st.RegistrationFailures >= 4 })
}

func TestRunRecreatesDeletedSocket(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	p, _ := runPlugin(t, kubeletplugin.Options{PluginDir: k.Dir()}, gpus(true))
	waitFor(t, k, "registration", devicesWithHealthy(3, 3))
	if err := os.Remove(p.SocketPath()); err != nil {
		t.Fatal(err)
	}
	s := waitFor(t, k, "re-registration", func(s kubelettest.State) bool {
		return s.Registrations == 2 && devicesWithHealthy(3, 3)(s)
	})
	if s.Duplicates != 0 {
		t.Errorf("Duplicates = %d, want 0: registered again while the stream was open", s.Duplicates)
	}
}

func TestRunKubeletSocketMissing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, pluginDir := range map[string]string{"empty folder": dir, "no folder": filepath.Join(dir, "nope")} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p, err := kubeletplugin.New(kubeletplugin.Options{PluginDir: pluginDir})
			if err != nil {
				t.Fatal(err)
			}
			err = p.Run(t.Context())
			var kerr *kubeletplugin.KubeletSocketError
			if !errors.Is(err, kubeletplugin.ErrKubeletSocketMissing) || !errors.As(err, &kerr) || kerr.Dir != pluginDir {
				t.Fatalf("Run: %v, want a KubeletSocketError for %s", err, pluginDir)
			}
			for _, s := range []string{pluginDir, "ps aux | grep kubelet", "--root-dir"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestRunRejected(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	k.Reject(errors.New("no GPUs on this node, says the kubelet"))
	p, err := kubeletplugin.New(kubeletplugin.Options{PluginDir: k.Dir()})
	if err != nil {
		t.Fatal(err)
	}
	err = p.Run(t.Context())
	var rerr *kubeletplugin.RegistrationError
	if !errors.Is(err, kubeletplugin.ErrRegistrationRejected) || !errors.As(err, &rerr) {
		t.Fatalf("Run: %v, want a RegistrationError", err)
	}
	if !strings.Contains(err.Error(), "says the kubelet") || rerr.ResourceName != resource {
		t.Errorf("error %q lacks the kubelet's message or the resource", err)
	}
	if _, err := os.Stat(p.SocketPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after a rejected Run: %v, want removed", err)
	}
}

func TestRunRetriesTransientFailure(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	k.Reject(status.Error(codes.Unavailable, "kubelet busy"))
	p, _ := runPlugin(t, kubeletplugin.Options{PluginDir: k.Dir(), InitialBackoff: 10 * time.Millisecond}, gpus(true))
	waitFor(t, k, "two attempts", func(s kubelettest.State) bool { return len(s.Requests) >= 2 })
	k.Reject(nil)
	waitFor(t, k, "registration after retries", devicesWithHealthy(3, 3))
	waitForStats(t, p, func(st kubeletplugin.Stats) bool { return st.RegistrationFailures >= 2 && st.Registrations == 1 })
}

func TestSecondPluginOnSameSocket(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	opts := kubeletplugin.Options{PluginDir: k.Dir()}
	runPlugin(t, opts, gpus(true))
	waitFor(t, k, "registration", devicesWithHealthy(3, 3))
	p2, err := kubeletplugin.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := p2.Run(t.Context()); !errors.Is(err, kubeletplugin.ErrSocketInUse) {
		t.Fatalf("second Run: %v, want ErrSocketInUse", err)
	}
	if s := k.State(); len(s.Requests) != 1 || s.Duplicates != 0 {
		t.Errorf("kubelet saw %d requests, %d duplicates; want 1, 0", len(s.Requests), s.Duplicates)
	}
}

func TestRunTwice(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	p, _ := runPlugin(t, kubeletplugin.Options{PluginDir: k.Dir()}, gpus(true))
	waitFor(t, k, "registration", devicesWithHealthy(3, 3))
	if err := p.Run(t.Context()); !errors.Is(err, kubeletplugin.ErrAlreadyRunning) {
		t.Fatalf("second Run: %v, want ErrAlreadyRunning", err)
	}
}

func dialPlugin(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func TestCallbacks(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	var got []string
	p, _ := runPlugin(t, kubeletplugin.Options{
		PluginDir: k.Dir(),
		Allocate: func(_ context.Context, devs []annotation.Device, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
			if len(devs) != 1 || devs[0].ID != "GPU-a" {
				return nil, fmt.Errorf("callback saw devices %v, want the published GPU-a", devs)
			}
			resp := &pluginapi.AllocateResponse{}
			for _, c := range req.GetContainerRequests() {
				got = append(got, c.GetDevicesIds()...)
				resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"X": "1"}})
			}
			return resp, nil
		},
		GetPreferredAllocation: func(_ context.Context, _ []annotation.Device, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
			return &pluginapi.PreferredAllocationResponse{ContainerResponses: []*pluginapi.ContainerPreferredAllocationResponse{{DeviceIDs: req.GetContainerRequests()[0].GetAvailableDeviceIDs()[:1]}}}, nil
		},
	}, gpus(true))
	s := waitFor(t, k, "registration", devicesWithHealthy(3, 3))
	plug, _ := s.Resource(resource)
	if !plug.Options.GetGetPreferredAllocationAvailable() || plug.Options.GetPreStartRequired() {
		t.Errorf("options = %v, want preferred allocation only", plug.Options)
	}
	c := pluginapi.NewDevicePluginClient(dialPlugin(t, p.SocketPath()))
	resp, err := c.Allocate(t.Context(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-a-0"}}}})
	if err != nil || resp.GetContainerResponses()[0].GetEnvs()["X"] != "1" || !cmp.Equal(got, []string{"GPU-a-0"}) {
		t.Errorf("Allocate = %v, %v (callback saw %v)", resp, err, got)
	}
	pref, err := c.GetPreferredAllocation(t.Context(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: []string{"GPU-a-2", "GPU-a-1"}, AllocationSize: 1}}})
	if err != nil || !cmp.Equal(pref.GetContainerResponses()[0].GetDeviceIDs(), []string{"GPU-a-2"}) {
		t.Errorf("GetPreferredAllocation = %v, %v", pref, err)
	}
	if _, err := c.PreStartContainer(t.Context(), &pluginapi.PreStartContainerRequest{}); err != nil {
		t.Errorf("PreStartContainer: %v", err)
	}
}

func TestDefaultAllocateAndNoPreferredAllocation(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	p, _ := runPlugin(t, kubeletplugin.Options{PluginDir: k.Dir()}, gpus(true))
	waitFor(t, k, "registration", devicesWithHealthy(3, 3))
	c := pluginapi.NewDevicePluginClient(dialPlugin(t, p.SocketPath()))
	resp, err := c.Allocate(t.Context(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{}, {}}})
	if err != nil || len(resp.GetContainerResponses()) != 2 {
		t.Errorf("Allocate = %v, %v; want 2 empty responses", resp, err)
	}
	if _, err := c.GetPreferredAllocation(t.Context(), &pluginapi.PreferredAllocationRequest{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("GetPreferredAllocation: %v, want Unimplemented", err)
	}
}

func TestPluginWatcherMode(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "kp") //nolint:usetesting // unix socket paths must stay under 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	p, stop := runPlugin(t, kubeletplugin.Options{Mode: kubeletplugin.ModePluginWatcher, RegistryDir: dir, Endpoint: "/host/gpu.sock"}, gpus(true, false))
	conn := dialPlugin(t, filepath.Join(dir, kubeletplugin.DefaultSocketName))
	reg := registerapi.NewRegistrationClient(conn)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("GetInfo: %v", err)
	}
	want := &registerapi.PluginInfo{Type: "DevicePlugin", Name: resource, Endpoint: "/host/gpu.sock", SupportedVersions: []string{"v1beta1"}}
	if diff := cmp.Diff(want, info, protocmp.Transform()); diff != "" {
		t.Errorf("GetInfo (-want +got):\n%s", diff)
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.Recv()
	if err != nil || len(msg.GetDevices()) != 6 {
		t.Fatalf("ListAndWatch: %v, %v", msg, err)
	}
	if st := p.Stats(); st.Registrations != 1 {
		t.Errorf("Registrations = %d, want 1", st.Registrations)
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{Error: "bad name"}); err != nil {
		t.Fatal(err)
	}
	if err := stop(); !errors.Is(err, kubeletplugin.ErrRegistrationRejected) || !strings.Contains(err.Error(), "bad name") {
		t.Errorf("Run: %v, want the rejection", err)
	}
}
