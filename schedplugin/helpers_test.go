package schedplugin

import (
	"context"
	"fmt"
	"maps"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/schedcache"
)

// TestMain fails the package if a test leaves a goroutine behind: Close joins the node cache.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// fakeHandle is the part of fwk.Handle the plugin uses.
type fakeHandle struct {
	fwk.Handle
	client    kubernetes.Interface
	factory   informers.SharedInformerFactory
	mu        sync.Mutex
	nominated map[string][]fwk.PodInfo
	activated []string
	// dra is the DRA manager (the extended-resource mapping); nil: none.
	dra fwk.SharedDRAManager
}

func (h *fakeHandle) SharedDRAManager() fwk.SharedDRAManager { return h.dra }

func (h *fakeHandle) ClientSet() kubernetes.Interface                        { return h.client }
func (h *fakeHandle) SharedInformerFactory() informers.SharedInformerFactory { return h.factory }
func (h *fakeHandle) SnapshotSharedLister() fwk.SharedLister                 { return nil }
func (h *fakeHandle) NominatedPodsForNode(node string) []fwk.PodInfo {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.nominated[node]
}
func (h *fakeHandle) Activate(_ klog.Logger, pods map[string]*corev1.Pod) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k := range pods {
		h.activated = append(h.activated, k)
	}
}

// fakePodInfo is a fwk.PodInfo of one pod.
type fakePodInfo struct {
	fwk.PodInfo
	pod *corev1.Pod
}

func (p *fakePodInfo) GetPod() *corev1.Pod { return p.pod }

// generation numbers the fake NodeInfos' states, as kube-scheduler's global counter does.
var generation atomic.Int64

// fakeNodeInfo is a fwk.NodeInfo of a node and its pods.
type fakeNodeInfo struct {
	fwk.NodeInfo
	node *corev1.Node
	pods []fwk.PodInfo
	gen  int64
}

func (n *fakeNodeInfo) Node() *corev1.Node     { return n.node }
func (n *fakeNodeInfo) GetPods() []fwk.PodInfo { return n.pods }
func (n *fakeNodeInfo) GetGeneration() int64   { return n.gen }
func (n *fakeNodeInfo) Snapshot() fwk.NodeInfo {
	return &fakeNodeInfo{node: n.node, pods: append([]fwk.PodInfo(nil), n.pods...), gen: n.gen}
}
func (n *fakeNodeInfo) AddPodInfo(pi fwk.PodInfo) {
	n.pods = append(n.pods, pi)
	n.gen = generation.Add(1)
}

func nodeInfo(node *corev1.Node, pods ...*corev1.Pod) *fakeNodeInfo {
	ni := &fakeNodeInfo{node: node, gen: generation.Add(1)}
	for _, p := range pods {
		ni.pods = append(ni.pods, &fakePodInfo{pod: p})
	}
	return ni
}

// fakeCycleState is a fwk.CycleState's storage.
type fakeCycleState struct {
	fwk.CycleState
	mu sync.Mutex
	m  map[fwk.StateKey]fwk.StateData
}

func newCycleState() *fakeCycleState { return &fakeCycleState{m: map[fwk.StateKey]fwk.StateData{}} }

func (c *fakeCycleState) Read(k fwk.StateKey) (fwk.StateData, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.m[k]
	if !ok {
		return nil, fwk.ErrNotFound
	}
	return d, nil
}
func (c *fakeCycleState) Write(k fwk.StateKey, d fwk.StateData) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[k] = d
}
func (c *fakeCycleState) Clone() fwk.CycleState {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := newCycleState()
	for k, d := range c.m {
		out.m[k] = d.Clone()
	}
	return out
}

// env is a plugin built by the factory on a fake clientset, its informers synced.
type env struct {
	t       testing.TB
	ctx     context.Context
	client  *fake.Clientset
	factory informers.SharedInformerFactory
	h       *fakeHandle
	p       *Plugin
	// newPlugin is the factory p came from: another profile's plugin shares p's state.
	newPlugin func(context.Context, runtime.Object, fwk.Handle) (fwk.Plugin, error)
	nodes     map[string]*corev1.Node
}

func newEnv(tb testing.TB, args runtime.Object, objs ...runtime.Object) *env {
	tb.Helper()
	e := newEnvWith(tb, args, fake.NewClientset(objs...))
	for _, o := range objs {
		if n, ok := o.(*corev1.Node); ok {
			e.nodes[n.Name] = n
		}
	}
	return e
}

// newEnvWith is newEnv on client.
func newEnvWith(tb testing.TB, args runtime.Object, client *fake.Clientset) *env {
	tb.Helper()
	var ctx context.Context
	if tt, ok := tb.(*testing.T); ok {
		_, ctx = ktesting.NewTestContext(tt)
	} else { // benchmarks: no logging cost
		ctx = klog.NewContext(tb.Context(), klog.Background().V(10))
	}
	ctx, cancel := context.WithCancel(ctx)
	factory := informers.NewSharedInformerFactory(client, 0)
	h := &fakeHandle{client: client, factory: factory, nominated: map[string][]fwk.PodInfo{}}
	newPlugin := NewFactory()
	pl, err := newPlugin(ctx, args, h)
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	p := pl.(*Plugin)
	factory.Start(ctx.Done())
	tb.Cleanup(func() {
		_ = p.Close()
		cancel()
		factory.Shutdown()
	})
	if err := p.sh.waitSynced(ctx); err != nil {
		tb.Fatal(err)
	}
	<-p.sh.cache.Synced()
	return &env{t: tb, ctx: ctx, client: client, factory: factory, h: h, p: p, newPlugin: newPlugin, nodes: map[string]*corev1.Node{}}
}

// gpus are n GPUs of devmem MiB, split 10 ways, 100 cores.
func gpus(node string, n int, devmem int32) []annotation.Device {
	out := make([]annotation.Device, n)
	for i := range out {
		out[i] = annotation.Device{ID: fmt.Sprintf("GPU-%s-%d", node, i), Index: uint(i), Count: 10, Devmem: devmem, Devcore: 100,
			Type: "NVIDIA-Tesla T4", Mode: "hami-core", Health: true}
	}
	return out
}

// gpuNode is a node registered with devices.
func gpuNode(name string, devices []annotation.Device, annotations map[string]string) *corev1.Node {
	a := map[string]string{annotation.KeyNVIDIARegister: annotation.Encode(devices)}
	maps.Copy(a, annotations)
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Annotations: a},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			annotation.ResourceNVIDIAGPU: *resource.NewQuantity(10*int64(max(len(devices), 1)), resource.DecimalSI)}}}
}

// gpuPod is a pending pod whose one container asks for limits.
func gpuPod(name string, limits map[string]string) *corev1.Pod {
	rl := corev1.ResourceList{}
	for k, v := range limits {
		rl[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: rl}}}},
		Status:     corev1.PodStatus{Phase: corev1.PodPending},
	}
}

// placedPod is a running pod placed on node with the devices value.
func placedPod(name, node, devices string) *corev1.Pod {
	p := gpuPod(name, map[string]string{"nvidia.com/gpu": "1"})
	p.Annotations = map[string]string{allocation.KeyNode: node, annotation.KeyNVIDIAAllocated: devices, annotation.KeyNVIDIAToAllocate: devices}
	p.Spec.NodeName = node
	p.Status.Phase = corev1.PodRunning
	return p
}

// preFilter runs PreFilter and fails the test unless it writes state.
func (e *env) preFilter(pod *corev1.Pod) *fakeCycleState {
	e.t.Helper()
	return e.preFilterOn(pod, nil)
}

// preFilterOn is preFilter with the cycle's nodes, as kube-scheduler hands them over.
func (e *env) preFilterOn(pod *corev1.Pod, nodes []fwk.NodeInfo) *fakeCycleState {
	e.t.Helper()
	cs := newCycleState()
	if _, st := e.p.PreFilter(e.ctx, cs, pod, nodes); !st.IsSuccess() {
		e.t.Fatalf("PreFilter: %v", st)
	}
	return cs
}

// runExtender runs the SDK's extender (the baseline of the conformance tests and benchmarks)
// with cfg on client under parent until tb ends, and returns its context and the extender once
// it is ready, within ready.
//
//nolint:revive // tb first, as every test helper here
func runExtender(tb testing.TB, parent context.Context, client *fake.Clientset, cfg allocation.Config, ready time.Duration) (context.Context, *extender.Extender) {
	tb.Helper()
	ctx, cancel := context.WithCancel(parent)
	factory := informers.NewSharedInformerFactory(client, 0)
	c, err := schedcache.New(factory.Core().V1().Nodes(), schedcache.Options{})
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	ext, err := extender.New(client, c, extender.Options{Config: cfg, Pods: factory.Core().V1().Pods(), Nodes: factory.Core().V1().Nodes().Lister()})
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	factory.Start(ctx.Done())
	done := make(chan struct{}, 2)
	go func() { _ = c.Run(ctx); done <- struct{}{} }()
	go func() { _ = ext.Run(ctx); done <- struct{}{} }()
	tb.Cleanup(func() {
		cancel()
		<-done
		<-done
		factory.Shutdown()
	})
	select {
	case <-ext.Ready():
	case <-time.After(ready):
		tb.Fatal("extender not ready")
	}
	return ctx, ext
}
