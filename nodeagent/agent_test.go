package nodeagent_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/clienttest"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/register"
)

// TestMain fails the binary if a test leaves a goroutine behind: Run joins what it started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const node = "gpu-1"

// source is a Source whose devices, failures and error the test changes; Changed is closed
// and replaced at every change.
type source struct {
	mu      sync.Mutex
	devs    []annotation.Device
	failed  []error
	err     error
	changed chan struct{}
}

func newSource(devs []annotation.Device) *source {
	return &source{devs: devs, changed: make(chan struct{})}
}

func (s *source) Devices(context.Context) ([]annotation.Device, []error, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, nil, s.err
	}
	return slices.Clone(s.devs), s.failed, nil
}

func (s *source) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func (s *source) update(f func(s *source)) {
	s.mu.Lock()
	f(s)
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

func gpus(n int) []annotation.Device {
	devs := make([]annotation.Device, n)
	for i := range devs {
		devs[i] = annotation.Device{ID: fmt.Sprintf("GPU-%d", i), Index: uint(i), Count: 10, Devmem: 40960, Devcore: 100, Type: "NVIDIA-A100", Mode: "hami-core", Health: true}
	}
	return devs
}

// start runs an agent against a fake clientset and a fake kubelet, with a rescan period of an
// hour: only the source's Changed notifications make it rescan.
func start(t *testing.T, cs *fake.Clientset, src nodeagent.Source, k *kubelettest.Kubelet, rec record.EventRecorder) (*nodeagent.Agent, func() error) {
	t.Helper()
	return runAgent(t, cs, src, k, nodeagent.Options{EventRecorder: rec})
}

// newClientset holds the agent's Node; node patches give it a new resourceVersion, as the API
// server's do, so the writer tells a late echo of its own write from drift.
func newClientset() *fake.Clientset {
	return clienttest.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
}

func registered(healthy int) func(kubelettest.State) bool {
	return func(s kubelettest.State) bool {
		p, ok := s.Resource("nvidia.com/gpu")
		return ok && p.Connected && p.Healthy() == healthy
	}
}

func waitKubelet(t *testing.T, k *kubelettest.Kubelet, cond func(kubelettest.State) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := k.WaitFor(ctx, cond); err != nil {
		t.Fatalf("kubelet: %v (state %+v)", err, k.State())
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func nodeAnnotation(t *testing.T, cs *fake.Clientset) string {
	t.Helper()
	n, err := cs.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Annotations[annotation.KeyNVIDIARegister]
}

// The annotation is on the Node before the kubelet hears of the device count: while the
// writes fail, the plugin does not register.
func TestRunPublishesTheAnnotationBeforeRegistering(t *testing.T) {
	t.Parallel()
	cs := newClientset()
	k := kubelettest.Start(t)
	var mu sync.Mutex
	registrationsAtWrite := -1
	cs.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if registrationsAtWrite < 0 {
			registrationsAtWrite = k.State().Registrations
		}
		return false, nil, nil
	})
	clienttest.Fail(&cs.Fake, "patch", "nodes", 3, errors.New("connection refused"))
	a, stop := start(t, cs, newSource(gpus(4)), k, &record.FakeRecorder{})
	waitKubelet(t, k, registered(40))
	mu.Lock()
	defer mu.Unlock()
	if registrationsAtWrite != 0 {
		t.Errorf("the kubelet had %d registration(s) when the annotation was written, want 0", registrationsAtWrite)
	}
	if got := nodeAnnotation(t, cs); got != annotation.Encode(gpus(4)) {
		t.Errorf("annotation %s", got)
	}
	if err := stop(); err != nil {
		t.Errorf("Run = %v", err)
	}
	if s := a.Writer().Stats(); s.Writes != 1 || s.Failures != 3 {
		t.Errorf("writer Stats = %+v, want 1 write after 3 failures", s)
	}
}

// A GPU turning unhealthy reaches both channels without waiting for the period, and so does
// its recovery; an unchanged rescan writes nothing.
func TestRunHealthReachesBothChannels(t *testing.T) {
	t.Parallel()
	cs := newClientset()
	k := kubelettest.Start(t)
	src := newSource(gpus(4))
	a, _ := start(t, cs, src, k, &record.FakeRecorder{})
	waitKubelet(t, k, registered(40))

	sick := gpus(4)
	sick[2].Health = false
	src.update(func(s *source) { s.devs = sick })
	waitKubelet(t, k, registered(30))
	waitFor(t, "the unhealthy GPU in the annotation", func() bool { return nodeAnnotation(t, cs) == annotation.Encode(sick) })

	src.update(func(s *source) { s.devs = gpus(4) })
	waitKubelet(t, k, registered(40))
	waitFor(t, "the recovered GPU in the annotation", func() bool { return nodeAnnotation(t, cs) == annotation.Encode(gpus(4)) })

	src.update(func(*source) {}) // a notification without a change
	waitFor(t, "the fourth scan", func() bool { return a.Stats().Scans == 4 })
	waitFor(t, "the no-op sync", func() bool { return a.Writer().Stats().NoOps >= 1 })
	if s := a.Writer().Stats(); s.Writes != 3 || s.Heals != 0 {
		t.Errorf("writer Stats = %+v, want 3 writes and no heal", s)
	}
}

// A device that cannot be read is reported once as a Warning Event on the Node, and the others
// register on both channels; a scan that fails as a whole keeps what was published.
func TestRunReportsFailedDevicesAndKeepsTheRest(t *testing.T) {
	t.Parallel()
	cs := newClientset()
	k := kubelettest.Start(t)
	src := newSource(gpus(3))
	src.failed = []error{errors.New("nvml get memory error: gpu 3 (GPU-3): ERROR_UNKNOWN")}
	rec := record.NewFakeRecorder(10)
	a, _ := start(t, cs, src, k, rec)
	waitKubelet(t, k, registered(30))
	waitFor(t, "the annotation", func() bool { return nodeAnnotation(t, cs) == annotation.Encode(gpus(3)) })
	select {
	case e := <-rec.Events:
		if !strings.HasPrefix(e, "Warning "+nodeagent.EventReasonDeviceFailed+" 1 device(s) left out") || !strings.Contains(e, "gpu 3") {
			t.Errorf("event %q", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no Event for the failed device")
	}

	src.update(func(*source) {}) // the same failure again: no second Event
	waitFor(t, "the second scan", func() bool { return a.Stats().Scans == 2 })
	src.update(func(s *source) { s.err = errors.New("nvml: cannot count devices") })
	waitFor(t, "the failed scan", func() bool { return a.Stats().ScanFailures == 1 })
	select {
	case e := <-rec.Events:
		if !strings.HasPrefix(e, "Warning "+nodeagent.EventReasonScanFailed+" ") {
			t.Errorf("event %q, want the scan failure (and no repeat of the device failure)", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no Event for the failed scan")
	}
	if got := nodeAnnotation(t, cs); got != annotation.Encode(gpus(3)) {
		t.Errorf("annotation after a failed scan %s", got)
	}
	if p, _ := k.State().Resource("nvidia.com/gpu"); p.Healthy() != 30 {
		t.Errorf("kubelet sees %d healthy devices after a failed scan, want 30", p.Healthy())
	}
	if s := a.Stats(); s.DeviceFailures != 2 {
		t.Errorf("Stats = %+v, want 2 device failures", s)
	}
}

// Without kubelet.sock, Run returns the plugin's error, which names the fix, after stopping
// everything else (TestMain checks the goroutines).
func TestRunReturnsTheKubeletError(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	a, err := nodeagent.New(newClientset(), node, newSource(gpus(1)), nodeagent.Options{
		Kubelet: kubeletplugin.Options{PluginDir: t.TempDir()}, EventRecorder: &record.FakeRecorder{},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case err := <-done:
		if !errors.Is(err, kubeletplugin.ErrKubeletSocketMissing) || !strings.Contains(err.Error(), "run device plugin") {
			t.Errorf("Run = %v, want the missing kubelet socket", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
}

func TestRunTwice(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	a, stop := start(t, newClientset(), newSource(gpus(1)), k, &record.FakeRecorder{})
	waitKubelet(t, k, registered(10))
	if err := a.Run(t.Context()); !errors.Is(err, nodeagent.ErrAlreadyRunning) {
		t.Errorf("second Run = %v, want ErrAlreadyRunning", err)
	}
	if err := stop(); err != nil {
		t.Errorf("Run = %v", err)
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	cs := newClientset()
	src := newSource(gpus(1))
	tests := map[string]struct {
		node    string
		src     nodeagent.Source
		opts    nodeagent.Options
		wantErr error
	}{
		"defaults":        {node: node, src: src},
		"nil source":      {node: node, wantErr: nodeagent.ErrInvalidOptions},
		"no node name":    {src: src, wantErr: register.ErrNoNodeName},
		"bad node name":   {node: "GPU_1", src: src, wantErr: register.ErrInvalidNodeName},
		"negative period": {node: node, src: src, opts: nodeagent.Options{Period: -time.Second}, wantErr: nodeagent.ErrInvalidOptions},
		"own Allocate": {node: node, src: src, opts: nodeagent.Options{Kubelet: kubeletplugin.Options{Allocate: func(context.Context, []annotation.Device, *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
			return nil, nil
		}}}, wantErr: nodeagent.ErrInvalidOptions},
		"vendors differ":   {node: node, src: src, opts: nodeagent.Options{Register: register.Options{Vendor: annotation.Ascend("Ascend910B3")}}, wantErr: nodeagent.ErrInvalidOptions},
		"no resource name": {node: node, src: src, opts: nodeagent.Options{Vendor: annotation.Vendor{Name: "acme", RegisterKey: "hami.io/node-acme-register", ToAllocateKey: "hami.io/acme-devices-to-allocate"}}, wantErr: nodeagent.ErrInvalidOptions},
		"no register key":  {node: node, src: src, opts: nodeagent.Options{Vendor: annotation.Vendor{Name: "acme", ResourceName: "acme.com/npu"}}, wantErr: nodeagent.ErrInvalidOptions},
		"no to-allocate key": {node: node, src: src, opts: nodeagent.Options{Vendor: annotation.Vendor{Name: "acme", RegisterKey: "hami.io/node-acme-register", ResourceName: "acme.com/npu"},
			Allocator: nodeagent.AllocatorFunc(func(context.Context, nodeagent.ContainerRequest) (allocation.Response, error) {
				return allocation.Response{}, nil
			})}},
		"bad plugin option": {node: node, src: src, opts: nodeagent.Options{Kubelet: kubeletplugin.Options{SocketName: "x"}}, wantErr: kubeletplugin.ErrInvalidOptions},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := nodeagent.New(cs, tc.node, tc.src, tc.opts)
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("New = %v, want %v", err, tc.wantErr)
			}
			if tc.opts.Kubelet.Allocate != nil && !strings.Contains(fmt.Sprint(err), "Options.Allocator") {
				t.Errorf("New = %v: the error does not name Options.Allocator", err)
			}
		})
	}
}

// Every vendor of HAMi's table that has a register annotation this SDK writes and a resource
// name can ship a node agent; the others are refused with annotation.ErrIncompleteVendor.
func TestNewEveryVendor(t *testing.T) {
	t.Parallel()
	cs := newClientset()
	accepted := 0
	for _, v := range annotation.Vendors() {
		t.Run(v.Name, func(t *testing.T) {
			t.Parallel()
			opts := nodeagent.Options{Vendor: v, Kubelet: kubeletplugin.Options{PluginDir: t.TempDir()}}
			if v.Name != annotation.NVIDIA().Name { // HAMi-core's answer is NVIDIA's: the others bring their own
				opts.Allocator = nodeagent.AllocatorFunc(func(context.Context, nodeagent.ContainerRequest) (allocation.Response, error) {
					return allocation.Response{}, nil
				})
			}
			_, err := nodeagent.New(cs, node, newSource(gpus(1)), opts)
			writable := v.RegisterKey != "" && (v.Format == annotation.FormatJSON || v.Format == annotation.FormatLegacy)
			switch {
			case writable && v.ResourceName != "" && err != nil:
				t.Errorf("New(vendor %s) = %v, want an agent", v.Name, err)
			case !writable && !errors.Is(err, annotation.ErrIncompleteVendor):
				t.Errorf("New(vendor %s) = %v, want annotation.ErrIncompleteVendor", v.Name, err)
			}
		})
		if v.RegisterKey != "" && (v.Format == annotation.FormatJSON || v.Format == annotation.FormatLegacy) {
			accepted++
		}
	}
	if accepted < 17 {
		t.Errorf("only %d vendors of the table ship a node agent", accepted)
	}
}

func TestClusterRoleRules(t *testing.T) {
	t.Parallel()
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
	if d := cmp.Diff(want, nodeagent.ClusterRoleRules()); d != "" {
		t.Errorf("ClusterRoleRules (-want +got):\n%s", d)
	}
}
