package schedplugin_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// HAMi's NVIDIA resources, as a pod asks for them.
const (
	resGPU   = "nvidia.com/gpu"
	resMem   = "nvidia.com/gpumem"
	resCores = "nvidia.com/gpucores"
)

// What every API-object GPU node registers: 8 GPUs of 40960 MiB, 100 % cores, split count 10.
const (
	gpusPerNode = 8
	split       = 10
	devmem      = 40960
	devcore     = 100
)

// startScheduler runs examples/scheduler with the configuration of its deploy/config.yaml,
// the HAMiGPU args merged with args (nil: the file's), its HAMiGPU profile renamed to a name of
// the test's own, which it returns: the schedulerName of the test's pods.
func startScheduler(tb testing.TB, args map[string]any) string {
	tb.Helper()
	cfg := harness.HAMiSchedulerConfig(tb, args)
	name := harness.UniqueName("hami-scheduler")
	found := false
	for i := range cfg.Profiles {
		if ptr.Deref(cfg.Profiles[i].SchedulerName, "") == harness.HAMiSchedulerName {
			cfg.Profiles[i].SchedulerName = &name
			found = true
		}
	}
	if !found {
		tb.Fatalf("HAMiSchedulerConfig has no profile %s", harness.HAMiSchedulerName)
	}
	cp.StartHAMiScheduler(tb, cfg)
	return name
}

// namespace creates a namespace (deleted when tb ends) and returns its name.
func namespace(tb testing.TB, prefix string) string {
	tb.Helper()
	ns := harness.UniqueName(prefix)
	if err := cp.EnsureNamespace(tb.Context(), ns); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = cp.AdminClient().CoreV1().Namespaces().Delete(context.WithoutCancel(tb.Context()), ns, metav1.DeleteOptions{})
	})
	return ns
}

// gpuPod is a pod of scheduler sched in ns, restricted to the nodes labelled
// harness.TestLabel=test, whose one container asks for limits.
func gpuPod(ns, name, sched, test string, limits map[string]int64) *corev1.Pod {
	rl := corev1.ResourceList{}
	for k, v := range limits {
		rl[corev1.ResourceName(k)] = *resource.NewQuantity(v, resource.DecimalSI)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{harness.TestLabel: test}},
		Spec: corev1.PodSpec{
			SchedulerName: sched,
			NodeSelector:  map[string]string{harness.TestLabel: test},
			Containers: []corev1.Container{{
				Name:      "cuda",
				Image:     "registry.invalid/never-pulled:0",
				Resources: corev1.ResourceRequirements{Limits: rl},
			}},
		},
	}
}

// createPod creates pod and returns it as stored.
func createPod(tb testing.TB, pod *corev1.Pod) *corev1.Pod {
	tb.Helper()
	p, err := cp.AdminClient().CoreV1().Pods(pod.Namespace).Create(tb.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("create pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	return p
}

// getPod reads a pod.
func getPod(tb testing.TB, ns, name string) *corev1.Pod {
	tb.Helper()
	p, err := cp.AdminClient().CoreV1().Pods(ns).Get(tb.Context(), name, metav1.GetOptions{})
	if err != nil {
		tb.Fatalf("get pod %s/%s: %v", ns, name, err)
	}
	return p
}

// waitBound waits until the pod is bound (spec.nodeName set) and returns it.
func waitBound(tb testing.TB, ns, name string) *corev1.Pod {
	tb.Helper()
	var p *corev1.Pod
	harness.Eventually(tb, "pod "+ns+"/"+name+" bound", 60*time.Second, func() bool {
		p = getPod(tb, ns, name)
		return p.Spec.NodeName != ""
	})
	return p
}

// lockOwner returns the pod the node's lock names, and false when the node has no lock.
func lockOwner(tb testing.TB, node string) (types.NamespacedName, bool) {
	tb.Helper()
	l, ok, err := nodelock.FromAnnotations(cp.GetNode(tb, node).Annotations)
	if err != nil {
		tb.Fatalf("lock of %s: %v", node, err)
	}
	if !ok {
		return types.NamespacedName{}, false
	}
	owner, _ := l.Owner()
	return owner, true
}

// wantBindStart checks what the plugin wrote by the time the pod was bound: HAMi's node and
// device annotations for the vendor, bind-phase allocating, the to-allocate list equal to the
// allocated one, and the node lock naming the pod. It returns the allocated devices.
func wantBindStart(tb testing.TB, p *corev1.Pod, v annotation.Vendor) allocation.PodDevices {
	tb.Helper()
	if node, _ := allocation.PodNode(p); node != p.Spec.NodeName {
		tb.Errorf("pod %s bound to %s, %s = %q", p.Name, p.Spec.NodeName, allocation.KeyNode, node)
	}
	if ph := p.Annotations[allocation.KeyBindPhase]; ph != string(allocation.PhaseAllocating) {
		tb.Errorf("pod %s: %s = %q at bind, want %q", p.Name, allocation.KeyBindPhase, ph, allocation.PhaseAllocating)
	}
	if a, b := p.Annotations[v.AllocatedKey], p.Annotations[v.ToAllocateKey]; a == "" || a != b {
		tb.Errorf("pod %s: %s = %q, %s = %q: want equal device lists", p.Name, v.AllocatedKey, a, v.ToAllocateKey, b)
	}
	if owner, ok := lockOwner(tb, p.Spec.NodeName); !ok || owner != (types.NamespacedName{Namespace: p.Namespace, Name: p.Name}) {
		tb.Errorf("node %s lock owner %v (present %v), want the pod %s/%s between bind and Allocate", p.Spec.NodeName, owner, ok, p.Namespace, p.Name)
	}
	pd, _, err := allocation.Allocated(p, v, allocation.VersionMaster)
	if err != nil {
		tb.Fatalf("pod %s: %v", p.Name, err)
	}
	return pd
}

// wantAllocated checks the end of HAMi's protocol for a pod: bind-phase success and no lock
// on its node.
func wantAllocated(tb testing.TB, ns, name string) {
	tb.Helper()
	p := getPod(tb, ns, name)
	if ph := p.Annotations[allocation.KeyBindPhase]; ph != string(allocation.PhaseSuccess) {
		tb.Errorf("pod %s: %s = %q after Allocate, want %q", name, allocation.KeyBindPhase, ph, allocation.PhaseSuccess)
	}
	if owner, ok := lockOwner(tb, p.Spec.NodeName); ok {
		tb.Errorf("node %s: lock of %v left behind after Allocate", p.Spec.NodeName, owner)
	}
}

// gpus returns the 8 GPUs an API-object node registers.
func gpus(node string) []annotation.Device {
	out := make([]annotation.Device, gpusPerNode)
	for i := range out {
		out[i] = annotation.Device{ID: fmt.Sprintf("GPU-%s-%d", node, i), Index: uint(i), Count: split, Devmem: devmem, Devcore: devcore,
			Type: "NVIDIA-NVIDIA A100-SXM4-40GB", Numa: i / 4, Mode: "hami-core", Health: true}
	}
	return out
}

// apiGPUNode creates a Node labelled harness.TestLabel=test, without taints, Ready, with
// room for many pods and allocatable nvidia.com/gpu GPUs × split (as a kubelet reports it
// after the device plugin registered), and registers its GPUs with a register.Writer (the
// register annotation and its handshake) that runs until tb ends. No kubelet runs: bound pods
// never start. It returns the registered GPUs.
func apiGPUNode(tb testing.TB, test, name string) []annotation.Device {
	tb.Helper()
	devs := gpus(name)
	cp.CreateAPINode(tb, name, harness.APINodeOptions{Labels: map[string]string{harness.TestLabel: test},
		GPUAllocatable: ptr.To[int64](gpusPerNode * split), Devices: devs})
	return devs
}

// fakeAllocator plays HAMi's device plugin on nodes without a kubelet: for each pod of the
// test (label harness.TestLabel=test) that is bound with bind-phase allocating while its node's
// lock names it, it calls allocationtest.Plugin.Allocate for the pod's one container, which
// writes what HAMi's device plugin writes (the consumed to-allocate list, bind-phase success)
// and releases the lock. Without it each node would take the next GPU pod only when the lock
// times out.
type fakeAllocator struct {
	allocated atomic.Int64
	mu        sync.Mutex
	errs      []error
}

func startFakeAllocator(tb testing.TB, test string) *fakeAllocator {
	tb.Helper()
	f := &fakeAllocator{}
	client := cp.AdminClient()
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = harness.TestLabel + "=" + test }))
	pods := factory.Core().V1().Pods()
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](20*time.Millisecond, time.Second))
	enqueue := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" && p.Annotations[allocation.KeyBindPhase] == string(allocation.PhaseAllocating) {
			queue.Add(types.NamespacedName{Namespace: p.Namespace, Name: p.Name})
		}
	}
	if _, err := pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }}); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(tb.Context()))
	factory.Start(ctx.Done())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				key, shutdown := queue.Get()
				if shutdown {
					return
				}
				retry, err := f.allocate(ctx, key)
				switch {
				case err != nil:
					f.mu.Lock()
					f.errs = append(f.errs, fmt.Errorf("pod %v: %w", key, err))
					f.mu.Unlock()
					queue.Forget(key)
				case retry:
					queue.AddRateLimited(key)
				default:
					queue.Forget(key)
				}
				queue.Done(key)
			}
		})
	}
	tb.Cleanup(func() {
		queue.ShutDown()
		cancel()
		wg.Wait()
		factory.Shutdown()
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, err := range f.errs {
			tb.Errorf("fake allocator: %v", err)
		}
	})
	return f
}

// allocate serves one pod when it is bound, allocating, and its node's lock names it; retry
// is set when the lock does not name it yet.
func (f *fakeAllocator) allocate(ctx context.Context, key types.NamespacedName) (retry bool, err error) {
	client := cp.AdminClient()
	p, err := client.CoreV1().Pods(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
	if err != nil || p.Spec.NodeName == "" || p.Annotations[allocation.KeyBindPhase] != string(allocation.PhaseAllocating) {
		return false, nil //nolint:nilerr // gone or done: nothing to do
	}
	n, err := client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		return true, nil //nolint:nilerr // retried
	}
	l, ok, err := nodelock.FromAnnotations(n.Annotations)
	if owner, _ := l.Owner(); err != nil || !ok || owner != key {
		return true, nil //nolint:nilerr // the lock is not (yet) the pod's: the kubelet would not admit it now either
	}
	a, err := allocationtest.NewPlugin(client, p.Spec.NodeName, allocationtest.Options{}).Allocate(ctx, 0)
	if err != nil {
		return false, err
	}
	if a.Pod != key || !a.Last {
		return false, fmt.Errorf("allocate served %v (last %v), want the pod's only entry", a.Pod, a.Last)
	}
	f.allocated.Add(1)
	return false, nil
}

// errorsSeen returns the allocator's errors so far.
func (f *fakeAllocator) errorsSeen() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return errors.Join(f.errs...)
}
