package draplugin

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/hamireg/hamireg/annotation"
)

// healthOf is the health each device of r reads, by device name.
func healthOf(r kubeletplugin.DeviceHealthReport) map[string]kubeletplugin.HealthStatus {
	out := map[string]kubeletplugin.HealthStatus{}
	for _, d := range r.Devices {
		out[d.DeviceName] = d.Health
	}
	return out
}

// unhealthyGPU1 are testGPUs with GPU 1 marked unhealthy, as a scan after its XID.
func unhealthyGPU1() []annotation.Device {
	g := testGPUs()
	g[1].Health = false
	return g
}

// watch runs p.WatchHealthStatus on a new channel until the returned cancel is called; cancel
// returns WatchHealthStatus's error.
func watch(ctx context.Context, p *Plugin) (<-chan kubeletplugin.DeviceHealthReport, func() error) {
	ctx, cancel := context.WithCancel(ctx)
	reports := make(chan kubeletplugin.DeviceHealthReport)
	done := make(chan error, 1)
	go func() { done <- p.WatchHealthStatus(ctx, reports) }()
	return reports, func() error { cancel(); return <-done }
}

// TestWatchHealthStatus: the current state at once, a change at once, nothing for a scan
// that changes no health, the full state again every third of the lease, and a clean return
// when the stream ends.
func TestWatchHealthStatus(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		opts := testOptions(t, newClient())
		p := newPlugin(t, opts)
		gpus := testGPUs()
		p.SetDevices(gpus, testDevices(t, opts.Profile, gpus))

		start := time.Now()
		reports, stop := watch(t.Context(), p)
		first := <-reports
		want := kubeletplugin.DeviceHealthReport{Devices: []kubeletplugin.DeviceHealth{
			{PoolName: testNode, DeviceName: "gpu-0", Health: kubeletplugin.HealthStatusHealthy, LastUpdated: start, HealthCheckTimeout: DefaultHealthCheckTimeout},
			{PoolName: testNode, DeviceName: "gpu-1", Health: kubeletplugin.HealthStatusHealthy, LastUpdated: start, HealthCheckTimeout: DefaultHealthCheckTimeout},
		}}
		if diff := cmp.Diff(want, first); diff != "" {
			t.Fatalf("first report (-want +got):\n%s", diff)
		}

		// The scan after an XID on GPU 1: its device is tainted and Unhealthy at once.
		bad := unhealthyGPU1()
		p.SetDevices(bad, testDevices(t, opts.Profile, bad))
		second := <-reports
		if time.Since(start) != 0 {
			t.Errorf("the change came after %v, want at once", time.Since(start))
		}
		if got := healthOf(second); got["gpu-0"] != kubeletplugin.HealthStatusHealthy || got["gpu-1"] != kubeletplugin.HealthStatusUnhealthy {
			t.Fatalf("after GPU 1's XID: %v", got)
		}
		if msg := second.Devices[1].Message; !strings.Contains(msg, bad[1].ID) || !strings.Contains(msg, opts.Profile.UnhealthyTaint()) {
			t.Errorf("message %q names neither the GPU nor the taint", msg)
		}
		if second.Devices[0].Message != "" {
			t.Errorf("healthy device has message %q", second.Devices[0].Message)
		}

		// The same scan again changes no health: no report before the re-send.
		p.SetDevices(bad, testDevices(t, opts.Profile, bad))
		synctest.Wait()
		select {
		case r := <-reports:
			t.Fatalf("report %v for a scan that changed no health", healthOf(r))
		default:
		}

		// The lease is refreshed every third of it, with the same state.
		third := <-reports
		if d := time.Since(start); d != DefaultHealthCheckTimeout/3 {
			t.Errorf("re-send after %v, want %v", d, DefaultHealthCheckTimeout/3)
		}
		if diff := cmp.Diff(second, third, cmpopts.IgnoreFields(kubeletplugin.DeviceHealth{}, "LastUpdated")); diff != "" {
			t.Errorf("re-send differs (-before +after):\n%s", diff)
		}
		if !third.Devices[0].LastUpdated.Equal(time.Now()) {
			t.Errorf("re-send LastUpdated %v, want now %v", third.Devices[0].LastUpdated, time.Now())
		}

		// Recovery: Healthy again at once.
		p.SetDevices(gpus, testDevices(t, opts.Profile, gpus))
		if got := healthOf(<-reports); got["gpu-1"] != kubeletplugin.HealthStatusHealthy {
			t.Errorf("after recovery: %v", got)
		}
		if n := p.HealthWatchers(); n != 1 {
			t.Errorf("HealthWatchers = %d, want 1", n)
		}
		if err := stop(); err != nil {
			t.Errorf("WatchHealthStatus returned %v when its stream ended, want nil", err)
		}
		if n := p.HealthWatchers(); n != 0 {
			t.Errorf("HealthWatchers = %d after the stream ended, want 0", n)
		}
		if n := p.Stats().HealthReports; n != 4 {
			t.Errorf("Stats().HealthReports = %d, want 4", n)
		}
	})
}

// TestWatchHealthStatusBeforeScan: before the first SetDevices nothing is sent; every
// subscriber gets the first scan's state at once, and each change.
func TestWatchHealthStatusBeforeScan(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		opts := testOptions(t, newClient())
		opts.HealthCheckTimeout = time.Hour
		p := newPlugin(t, opts)
		r1, stop1 := watch(t.Context(), p)
		r2, stop2 := watch(t.Context(), p)
		synctest.Wait()
		for i, r := range []<-chan kubeletplugin.DeviceHealthReport{r1, r2} {
			select {
			case rep := <-r:
				t.Fatalf("subscriber %d got %v before any scan", i, healthOf(rep))
			default:
			}
		}
		bad := unhealthyGPU1()
		p.SetDevices(bad, testDevices(t, opts.Profile, bad))
		for i, r := range []<-chan kubeletplugin.DeviceHealthReport{r1, r2} {
			rep := <-r
			if got := healthOf(rep); len(got) != 2 || got["gpu-1"] != kubeletplugin.HealthStatusUnhealthy {
				t.Errorf("subscriber %d: %v", i, got)
			}
			if rep.Devices[0].HealthCheckTimeout != time.Hour {
				t.Errorf("subscriber %d: HealthCheckTimeout %v, want Options.HealthCheckTimeout", i, rep.Devices[0].HealthCheckTimeout)
			}
		}
		// A third subscriber gets the current state, not the history.
		r3, stop3 := watch(t.Context(), p)
		if got := healthOf(<-r3); got["gpu-1"] != kubeletplugin.HealthStatusUnhealthy {
			t.Errorf("late subscriber: %v", got)
		}
		for _, stop := range []func() error{stop1, stop2, stop3} {
			if err := stop(); err != nil {
				t.Error(err)
			}
		}
	})
}

// TestWatchHealthStatusSenderBlocked: a subscriber that does not read does not block
// SetDevices, and its call returns when its stream ends.
func TestWatchHealthStatusSenderBlocked(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		opts := testOptions(t, newClient())
		p := newPlugin(t, opts)
		_, stop := watch(t.Context(), p)
		for range 3 {
			p.SetDevices(unhealthyGPU1(), testDevices(t, opts.Profile, unhealthyGPU1()))
			p.SetDevices(testGPUs(), testDevices(t, opts.Profile, testGPUs()))
		}
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
}

func TestNewHealthOptions(t *testing.T) {
	t.Parallel()
	opts := testOptions(t, newClient())
	opts.HealthCheckTimeout = 500 * time.Millisecond
	if _, err := New(opts); !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), "Options.HealthCheckTimeout") {
		t.Errorf("New with a 500ms HealthCheckTimeout: %v, want ErrInvalidOptions naming the field", err)
	}
	opts.HealthCheckTimeout = -time.Second
	if _, err := New(opts); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("New with a negative HealthCheckTimeout: %v, want ErrInvalidOptions", err)
	}
}

// dialHealth is the kubelet's DRAResourceHealth v1 client on the plugin's dra.sock.
func dialHealth(tb testing.TB, pluginDir string) drahealthv1.DRAResourceHealthClient {
	tb.Helper()
	dialPlugin(tb, pluginDir) // waits for the socket
	conn, err := grpc.NewClient("unix://"+filepath.Join(pluginDir, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	return drahealthv1.NewDRAResourceHealthClient(conn)
}

// TestHealthOverGRPC is the kubelet's side: NodeWatchResources streams the state at once and
// the XID's change; a stream the kubelet closes ends its WatchHealthStatus, and so does Run's
// end for a stream still open (the package's goleak check covers the rest).
func TestHealthOverGRPC(t *testing.T) {
	t.Parallel()
	opts := testOptions(t, newClient())
	p := newPlugin(t, opts)
	p.SetDevices(testGPUs(), testDevices(t, opts.Profile, testGPUs()))
	ctx, cancelRun := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	client := dialHealth(t, opts.PluginDir)

	recv := func(stream drahealthv1.DRAResourceHealth_NodeWatchResourcesClient) map[string]drahealthv1.HealthStatus {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		out := map[string]drahealthv1.HealthStatus{}
		for _, d := range resp.GetDevices() {
			if d.GetDevice().GetPoolName() != testNode || d.GetHealthCheckTimeoutSeconds() != 30 || d.GetLastUpdatedTime() == 0 {
				t.Errorf("device %v: want pool %s, a 30 s timeout and a time", d, testNode)
			}
			out[d.GetDevice().GetDeviceName()] = d.GetHealth()
		}
		return out
	}

	sctx, cancelStream := context.WithCancel(t.Context())
	stream, err := client.NodeWatchResources(sctx, &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := recv(stream); len(got) != 2 || got["gpu-1"] != drahealthv1.HealthStatus_HEALTHY {
		t.Fatalf("first message %v", got)
	}
	p.SetDevices(unhealthyGPU1(), testDevices(t, opts.Profile, unhealthyGPU1()))
	if got := recv(stream); got["gpu-1"] != drahealthv1.HealthStatus_UNHEALTHY || got["gpu-0"] != drahealthv1.HealthStatus_HEALTHY {
		t.Fatalf("after the XID %v", got)
	}
	cancelStream()
	waitFor(t, "WatchHealthStatus to return after the kubelet closed its stream", func() bool { return p.HealthWatchers() == 0 })

	// A second stream, open when Run ends.
	stream, err = client.NodeWatchResources(t.Context(), &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := recv(stream); got["gpu-1"] != drahealthv1.HealthStatus_UNHEALTHY {
		t.Fatalf("second stream's first message %v", got)
	}
	cancelRun()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := p.HealthWatchers(); n != 0 {
		t.Errorf("HealthWatchers = %d after Run returned, want 0", n)
	}
	if _, err := stream.Recv(); err == nil {
		t.Error("Recv after Run ended: a message, want the stream's end")
	}
}

// TestHealthServiceDisabled: with DisableHealthService the kubelet finds no health service.
func TestHealthServiceDisabled(t *testing.T) {
	t.Parallel()
	opts := testOptions(t, newClient())
	opts.DisableHealthService = true
	p := newPlugin(t, opts)
	p.SetDevices(testGPUs(), testDevices(t, opts.Profile, testGPUs()))
	run(t, p)
	stream, err := dialHealth(t, opts.PluginDir).NodeWatchResources(t.Context(), &drahealthv1.NodeWatchResourcesRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("NodeWatchResources with DisableHealthService: %v, want Unimplemented", err)
	}
}
