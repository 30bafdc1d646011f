package nodeagent_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/register"
)

// runAgent runs an agent with opts (the test's kubelet folder, an hour's period, a fake
// recorder unless opts has one) until the test ends; stop cancels it and returns Run's error.
func runAgent(t *testing.T, cs *fake.Clientset, src nodeagent.Source, k *kubelettest.Kubelet, opts nodeagent.Options) (*nodeagent.Agent, func() error) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	opts.Period = time.Hour
	opts.Register = register.Options{RetryInitial: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond}
	opts.Kubelet.PluginDir = k.Dir()
	if opts.EventRecorder == nil {
		opts.EventRecorder = &record.FakeRecorder{}
	}
	a, err := nodeagent.New(cs, node, src, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var runErr error
	stopped := false
	stop := func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return after cancellation")
			}
		}
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return a, stop
}

// statusPatches counts the patches of the Node's status subresource the clientset received.
func statusPatches(cs *fake.Clientset) int {
	n := 0
	for _, a := range cs.Actions() {
		if a.Matches("patch", "nodes") && a.GetSubresource() == "status" {
			n++
		}
	}
	return n
}

func capacityOf(t *testing.T, cs *fake.Clientset) (capacity, allocatable corev1.ResourceList) {
	t.Helper()
	n, err := cs.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Status.Capacity, n.Status.Allocatable
}

func gpuResources(mem, cores int64) corev1.ResourceList {
	return corev1.ResourceList{
		"nvidia.com/gpumem":   *resource.NewQuantity(mem, resource.DecimalSI),
		"nvidia.com/gpucores": *resource.NewQuantity(cores, resource.DecimalSI),
	}
}

// NodeCapacity: the healthy GPUs' memory and cores reach the Node's status capacity and
// allocatable, are patched only when they change, and a restarted agent writes nothing when
// the Node already carries them.
func TestNodeCapacity(t *testing.T) {
	t.Parallel()
	cs := newClientset()
	k := kubelettest.Start(t)
	src := newSource(gpus(4)) // 40960 MiB and 100 cores each
	a, stop := runAgent(t, cs, src, k, nodeagent.Options{NodeCapacity: true})
	waitFor(t, "the first capacity patch", func() bool { return a.Stats().NodeCapacityPatches == 1 })
	qty := cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })
	check := func(mem, cores int64) {
		t.Helper()
		c, al := capacityOf(t, cs)
		if d := cmp.Diff(gpuResources(mem, cores), c, qty); d != "" {
			t.Errorf("capacity (-want +got):\n%s", d)
		}
		if d := cmp.Diff(gpuResources(mem, cores), al, qty); d != "" {
			t.Errorf("allocatable (-want +got):\n%s", d)
		}
	}
	check(4*40960, 400)

	src.update(func(*source) {}) // a rescan without a change: no patch
	waitFor(t, "the second scan", func() bool { return a.Stats().Scans == 2 })
	sick := gpus(4)
	sick[1].Health = false
	src.update(func(s *source) { s.devs = sick })
	waitFor(t, "the second capacity patch", func() bool { return a.Stats().NodeCapacityPatches == 2 })
	check(3*40960, 300)
	if got := statusPatches(cs); got != 2 {
		t.Errorf("%d status patches, want 2 (one per change)", got)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// A new agent on the same Node: the status already carries the values.
	k2 := kubelettest.Start(t)
	src2 := newSource(sick)
	b, _ := runAgent(t, cs, src2, k2, nodeagent.Options{NodeCapacity: true})
	waitKubelet(t, k2, registered(30))
	src2.update(func(*source) {})
	waitFor(t, "the restarted agent's second scan", func() bool { return b.Stats().Scans == 2 })
	if got := b.Stats().NodeCapacityPatches; got != 0 {
		t.Errorf("restarted agent patched the status %d times, want 0", got)
	}
	if got := statusPatches(cs); got != 2 {
		t.Errorf("%d status patches after the restart, want still 2", got)
	}
}

// A refused write (RBAC without nodes/status) is retried at the next scan; the register
// annotation and the kubelet are not held back.
func TestNodeCapacityRetried(t *testing.T) {
	t.Parallel()
	cs := newClientset()
	refused := 0
	cs.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "status" || refused > 0 {
			return false, nil, nil
		}
		refused++
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes/status"}, node, errors.New("RBAC: access denied"))
	})
	k := kubelettest.Start(t)
	src := newSource(gpus(2))
	a, _ := runAgent(t, cs, src, k, nodeagent.Options{NodeCapacity: true})
	waitKubelet(t, k, registered(20))
	waitFor(t, "the annotation", func() bool { return nodeAnnotation(t, cs) == annotation.Encode(gpus(2)) })
	if got := a.Stats().NodeCapacityPatches; got != 0 {
		t.Fatalf("%d patches accepted, want 0 after a refusal", got)
	}
	src.update(func(*source) {})
	waitFor(t, "the retried capacity patch", func() bool { return a.Stats().NodeCapacityPatches == 1 })
	if c, _ := capacityOf(t, cs); c.Name("nvidia.com/gpumem", resource.DecimalSI).Value() != 2*40960 {
		t.Errorf("capacity %v", c)
	}
}

// New refuses NodeCapacity for a vendor without memory and core resource names, naming the
// fix; ClusterRoleRulesFor adds nodes/status only with it.
func TestNodeCapacityOptions(t *testing.T) {
	t.Parallel()
	v := annotation.Vendor{Name: "acme", RegisterKey: "hami.io/node-acme-register", ResourceName: "acme.com/npu"}
	_, err := nodeagent.New(newClientset(), node, newSource(gpus(1)), nodeagent.Options{Vendor: v, NodeCapacity: true,
		Allocator: nodeagent.HAMiCore{}})
	if !errors.Is(err, nodeagent.ErrInvalidOptions) || !contains(err, "ResourceMemoryName") {
		t.Errorf("New(vendor without resource names, NodeCapacity) = %v, want ErrInvalidOptions naming ResourceMemoryName", err)
	}
	if d := cmp.Diff(nodeagent.ClusterRoleRules(), nodeagent.ClusterRoleRulesFor(nodeagent.Options{})); d != "" {
		t.Errorf("ClusterRoleRulesFor without NodeCapacity (-want +got):\n%s", d)
	}
	with := nodeagent.ClusterRoleRulesFor(nodeagent.Options{NodeCapacity: true})
	if d := cmp.Diff(append(nodeagent.ClusterRoleRules(), nodeagent.NodeCapacityRules()...), with); d != "" {
		t.Errorf("ClusterRoleRulesFor with NodeCapacity (-want +got):\n%s", d)
	}
	if r := nodeagent.NodeCapacityRules(); len(r) != 1 || r[0].Resources[0] != "nodes/status" || r[0].Verbs[0] != "patch" {
		t.Errorf("NodeCapacityRules = %+v", r)
	}
}

func TestNodeCapacityOf(t *testing.T) {
	t.Parallel()
	devs := []annotation.Device{
		{ID: "a", Devmem: 1000, Devcore: 100, Health: true},
		{ID: "b", Devmem: 2000, Devcore: 50, Health: true},
		{ID: "c", Devmem: 4000, Devcore: 100}, // unhealthy
	}
	if got, want := nodeagent.NodeCapacityOf(devs), (nodeagent.NodeCapacity{MemoryMiB: 3000, Cores: 150}); got != want {
		t.Errorf("NodeCapacityOf = %+v, want %+v", got, want)
	}
	if got := nodeagent.NodeCapacityOf(nil); got != (nodeagent.NodeCapacity{}) {
		t.Errorf("NodeCapacityOf(nil) = %+v", got)
	}
}

// Kubelet.NUMATopology reaches the kubelet; a GPU whose NUMA node is unknown (negative) gets
// no topology there and 0 in the register annotation, HAMi's value.
func TestNUMATopology(t *testing.T) {
	t.Parallel()
	devs := gpus(2)
	devs[0].Count, devs[1].Count = 1, 1
	devs[0].Numa, devs[1].Numa = 1, -1
	for _, on := range []bool{false, true} {
		cs := newClientset()
		k := kubelettest.Start(t)
		runAgent(t, cs, newSource(devs), k, nodeagent.Options{Kubelet: kubeletplugin.Options{NUMATopology: on}})
		waitKubelet(t, k, registered(2))
		p, _ := k.State().Resource("nvidia.com/gpu")
		want := []*pluginapi.Device{{ID: "GPU-0-0", Health: pluginapi.Healthy}, {ID: "GPU-1-0", Health: pluginapi.Healthy}}
		if on {
			want[0].Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}}}
		}
		if d := cmp.Diff(want, p.Devices, protocmp.Transform()); d != "" {
			t.Errorf("NUMATopology %v: kubelet's devices (-want +got):\n%s", on, d)
		}
		reg := gpus(2)
		reg[0].Count, reg[1].Count, reg[0].Numa = 1, 1, 1
		waitFor(t, "the annotation", func() bool { return nodeAnnotation(t, cs) == annotation.Encode(reg) })
	}
}

func contains(err error, s string) bool { return err != nil && strings.Contains(err.Error(), s) }
