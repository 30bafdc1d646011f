package nodeagent_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
	"github.com/hamireg/hamireg/nodeagent"
)

// probes returns the answers of the agent's ProbeHandler at both paths.
func probes(t *testing.T, a *nodeagent.Agent) (healthz, readyz string) {
	t.Helper()
	get := func(path string) string {
		rec := httptest.NewRecorder()
		nodeagent.ProbeHandler(a.Healthy, a.Ready).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		body, _ := io.ReadAll(rec.Body)
		return strings.TrimSpace(http.StatusText(rec.Code) + " " + string(body))
	}
	return get(nodeagent.PathHealthz), get(nodeagent.PathReadyz)
}

// Before Run the agent is neither healthy nor ready; while the annotation cannot be written it
// is healthy but not ready, and says why; once the kubelet has the devices it is ready; after
// Run returns it is neither again.
func TestProbesFollowRun(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	cs := newClientset()
	var open atomic.Bool
	cs.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if open.Load() {
			return false, nil, nil
		}
		return true, nil, errors.New("connection refused")
	})
	k := kubelettest.Start(t)
	a, err := nodeagent.New(cs, node, newSource(gpus(2)), nodeagent.Options{
		Kubelet: kubeletplugin.Options{PluginDir: k.Dir()}, EventRecorder: &record.FakeRecorder{}, Period: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{"Healthy": a.Healthy(), "Ready": a.Ready()} {
		class := map[string]error{"Healthy": nodeagent.ErrUnhealthy, "Ready": nodeagent.ErrNotReady}[name]
		if !errors.Is(err, class) || !errors.Is(err, nodeagent.ErrNotRunning) {
			t.Errorf("%s before Run = %v, want %v and %v", name, err, class, nodeagent.ErrNotRunning)
		}
	}
	if h, r := probes(t, a); h != "Service Unavailable node agent unhealthy: node gpu-1: node agent not running" ||
		r != "Service Unavailable node agent not ready: node gpu-1: node agent not running" {
		t.Errorf("probes before Run: %q, %q", h, r)
	}

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	waitFor(t, "a failed annotation write", func() bool { return a.Writer().Stats().Failures > 0 })
	err = a.Ready()
	if !errors.Is(err, nodeagent.ErrNotReady) || errors.Is(err, nodeagent.ErrNotRunning) ||
		!strings.Contains(err.Error(), "register annotation hami.io/node-nvidia-register not written yet") || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Ready while the annotation cannot be written = %v", err)
	}
	if err := a.Healthy(); err != nil {
		t.Errorf("Healthy while the annotation cannot be written = %v, want nil", err)
	}
	if st := k.State(); st.Registrations != 0 {
		t.Fatalf("the plugin registered before the annotation: %+v", st)
	}

	open.Store(true)
	waitFor(t, "Ready", func() bool { return a.Ready() == nil })
	waitKubelet(t, k, registered(20)) // the device list sent is on its way to the kubelet
	if h, r := probes(t, a); h != "OK ok" || r != "OK ok" {
		t.Errorf("probes while ready: %q, %q", h, r)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if err := a.Healthy(); !errors.Is(err, nodeagent.ErrUnhealthy) || !errors.Is(err, nodeagent.ErrNotRunning) {
		t.Errorf("Healthy after Run = %v", err)
	}
	if err := a.Ready(); !errors.Is(err, nodeagent.ErrNotReady) || !errors.Is(err, nodeagent.ErrNotRunning) {
		t.Errorf("Ready after Run = %v", err)
	}
}

// Run stopped by a part's error leaves the agent unhealthy with that error.
func TestHealthyAfterAPartFails(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	a, err := nodeagent.New(newClientset(), node, newSource(gpus(1)), nodeagent.Options{
		Kubelet: kubeletplugin.Options{PluginDir: t.TempDir()}, EventRecorder: &record.FakeRecorder{},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Run(ctx); !errors.Is(err, kubeletplugin.ErrKubeletSocketMissing) {
		t.Fatalf("Run = %v, want the missing kubelet socket", err)
	}
	err = a.Healthy()
	if !errors.Is(err, nodeagent.ErrUnhealthy) || !errors.Is(err, nodeagent.ErrNotRunning) || !errors.Is(err, kubeletplugin.ErrKubeletSocketMissing) {
		t.Errorf("Healthy = %v, want unhealthy, not running, with the kubelet socket error", err)
	}
}

// blockingSource is a source whose scans fail with err while it is set and hang while
// hang is open.
type blockingSource struct {
	*source
	hang atomic.Pointer[chan struct{}]
}

func (b *blockingSource) Devices(ctx context.Context) ([]annotation.Device, []error, error) {
	if h := b.hang.Load(); h != nil {
		select {
		case <-*h:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
	return b.source.Devices(ctx)
}

// Scans that keep failing for more than UnhealthyScanPeriods periods make the agent
// unhealthy, with the scan's error, and so does a scan that hangs as long; the next good scan
// makes it healthy again. The clock is a fake one: only the test moves it.
func TestHealthyScans(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	const period = 10 * time.Second
	clk := testingclock.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	scanErr := errors.New("nvml: driver not loaded")
	src := &blockingSource{source: newSource(gpus(1))}
	src.err = scanErr
	k := kubelettest.Start(t)
	a, err := nodeagent.New(newClientset(), node, src, nodeagent.Options{
		Kubelet: kubeletplugin.Options{PluginDir: k.Dir()}, EventRecorder: &record.FakeRecorder{}, Period: period, Clock: clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	}()

	waitFor(t, "a failed scan", func() bool { return a.Stats().ScanFailures >= 1 })
	if err := a.Healthy(); err != nil {
		t.Errorf("Healthy after one failed scan = %v, want nil", err)
	}
	if err := a.Ready(); !errors.Is(err, nodeagent.ErrNotReady) || !errors.Is(err, scanErr) {
		t.Errorf("Ready with failing scans = %v, want not ready with the scan's error", err)
	}
	clk.Step(nodeagent.UnhealthyScanPeriods * period)
	if err := a.Healthy(); err != nil {
		t.Errorf("Healthy after exactly %d periods of failures = %v, want nil", nodeagent.UnhealthyScanPeriods, err)
	}
	clk.Step(time.Second)
	err = a.Healthy()
	if !errors.Is(err, nodeagent.ErrUnhealthy) || !errors.Is(err, scanErr) || !strings.Contains(err.Error(), "device scans failing for 31s (more than 3 periods of 10s)") {
		t.Errorf("Healthy after 31 s of failures = %v", err)
	}

	src.update(func(s *source) { s.err = nil })
	waitFor(t, "a good scan", func() bool { return a.Stats().Scans >= 1 })
	waitFor(t, "health back", func() bool { return a.Healthy() == nil })
	waitFor(t, "Ready", func() bool { return a.Ready() == nil })

	hang := make(chan struct{})
	src.hang.Store(&hang)
	src.update(func(*source) {}) // rescan: it hangs
	waitFor(t, "the hanging scan", func() bool {
		clk.Step(time.Second) // until the scan started and hangs longer than 3 periods
		return a.Healthy() != nil
	})
	if err := a.Healthy(); !errors.Is(err, nodeagent.ErrUnhealthy) || !strings.Contains(err.Error(), "a scan of the device source has not returned for") {
		t.Errorf("Healthy with a hanging scan = %v", err)
	}
	if err := a.Ready(); err != nil {
		t.Errorf("Ready with a hanging scan = %v, want nil (ready stays until Run returns)", err)
	}
	src.hang.Store(nil)
	close(hang)
	waitFor(t, "health back after the hang", func() bool { return a.Healthy() == nil })
}

// ProbeHandler answers each path with its own check, 503 with the error's text, 200 for a nil
// check, and 404 elsewhere.
func TestProbeHandler(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		healthy, ready func() error
		path           string
		code           int
		body           string
	}{
		"healthy":       {healthy: func() error { return nil }, ready: func() error { return errors.New("no") }, path: nodeagent.PathHealthz, code: 200, body: "ok\n"},
		"not ready":     {healthy: func() error { return nil }, ready: func() error { return errors.New("kubelet away") }, path: nodeagent.PathReadyz, code: 503, body: "kubelet away\n"},
		"unhealthy":     {healthy: func() error { return errors.New("scan hung") }, path: nodeagent.PathHealthz, code: 503, body: "scan hung\n"},
		"nil check":     {path: nodeagent.PathReadyz, code: 200, body: "ok\n"},
		"other path":    {path: "/metrics", code: 404, body: "404 page not found\n"},
		"query":         {path: nodeagent.PathHealthz + "?verbose", code: 200, body: "ok\n"},
		"path prefixed": {path: nodeagent.PathReadyz + "/x", code: 404, body: "404 page not found\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rec := httptest.NewRecorder()
			nodeagent.ProbeHandler(tc.healthy, tc.ready).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
			if rec.Code != tc.code || rec.Body.String() != tc.body {
				t.Errorf("GET %s = %d %q, want %d %q", tc.path, rec.Code, rec.Body.String(), tc.code, tc.body)
			}
		})
	}
	rec := httptest.NewRecorder()
	nodeagent.ProbeHandler(nil, nil).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, nodeagent.PathHealthz, nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST %s = %d, want 405", nodeagent.PathHealthz, rec.Code)
	}
}
