package preemption_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	kubeschedulerconfigv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/utils/ptr"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

const (
	// resMem is HAMi's per-GPU memory resource (MiB), resCores its per-GPU cores (percent);
	// harness.GPUResource the GPU count.
	resMem   = "nvidia.com/gpumem"
	resCores = "nvidia.com/gpucores"
	// split is every GPU's split count (the chart's deviceSplitCount).
	split = 10
	// gpuType is the model every GPU registers.
	gpuType = "NVIDIA-NVIDIA A100-SXM4-40GB"
	// schedQPS and schedBurst are the client budget of every kube-scheduler compared (spec §8).
	schedQPS, schedBurst = 500, 1000
)

// cluster is one test's slice of the shared control plane: its Nodes (labelled
// harness.TestLabel=test), its pods (same label, in any namespace), and the stand-ins of the
// kubelet described in the package doc (allocator and reaper). Informers watch the test's pods
// and Nodes and record when each pod was first seen bound, which pods were deleted, and how
// long each node lock was held.
type cluster struct {
	test  string
	pods  corev1listers.PodLister
	nodes corev1listers.NodeLister

	mu        sync.Mutex
	changed   chan struct{} // closed and replaced at every pod or node event
	boundAt   map[types.NamespacedName]time.Time
	deleted   map[types.NamespacedName]time.Time
	lockSince map[string]time.Time // node → when its current lock was seen set
	holds     []time.Duration      // lock set → removed, as a Node watch sees it
	allocErr  error                // the allocator's last error, for a failure's message

	alloc workqueue.TypedRateLimitingInterface[string]
	reap  workqueue.TypedInterface[types.NamespacedName]
}

// newCluster starts the informers, the allocator and the reaper of a new test label; they
// stop when tb ends.
func newCluster(tb testing.TB) *cluster {
	tb.Helper()
	c := &cluster{
		test:      harness.UniqueName("pre"),
		changed:   make(chan struct{}),
		boundAt:   map[types.NamespacedName]time.Time{},
		deleted:   map[types.NamespacedName]time.Time{},
		lockSince: map[string]time.Time{},
		alloc:     workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](5*time.Millisecond, time.Second)),
		reap:      workqueue.NewTyped[types.NamespacedName](),
	}
	sel := informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = harness.TestLabel + "=" + c.test })
	factory := informers.NewSharedInformerFactoryWithOptions(cp.AdminClient(), 0, sel)
	podInf := factory.Core().V1().Pods()
	nodeInf := factory.Core().V1().Nodes()
	c.pods, c.nodes = podInf.Lister(), nodeInf.Lister()
	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.podEvent(obj.(*corev1.Pod)) },
		UpdateFunc: func(_, obj any) { c.podEvent(obj.(*corev1.Pod)) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				c.mu.Lock()
				c.deleted[key(p)] = time.Now()
				c.notifyLocked()
				c.mu.Unlock()
			}
		},
	}); err != nil {
		tb.Fatal(err)
	}
	if _, err := nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.nodeEvent(obj.(*corev1.Node)) },
		UpdateFunc: func(_, obj any) { c.nodeEvent(obj.(*corev1.Node)) },
	}); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(tb.Context()))
	factory.Start(ctx.Done())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { c.runAllocator(ctx) })
	}
	wg.Go(func() { c.runReaper(ctx) })
	tb.Cleanup(func() {
		cancel()
		c.alloc.ShutDown()
		c.reap.ShutDown()
		factory.Shutdown()
		wg.Wait()
	})
	for typ, ok := range factory.WaitForCacheSync(tb.Context().Done()) {
		if !ok {
			tb.Fatalf("informer %v not synced", typ)
		}
	}
	return c
}

func key(p *corev1.Pod) types.NamespacedName {
	return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
}

// notifyLocked wakes every waiter; c.mu is held.
func (c *cluster) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *cluster) podEvent(p *corev1.Pod) {
	now := time.Now()
	c.mu.Lock()
	if p.Spec.NodeName != "" {
		if _, seen := c.boundAt[key(p)]; !seen {
			c.boundAt[key(p)] = now
		}
	}
	c.notifyLocked()
	c.mu.Unlock()
	if p.DeletionTimestamp != nil {
		c.reap.Add(key(p))
	}
	if p.Spec.NodeName != "" && p.Annotations[allocation.KeyBindPhase] == string(allocation.PhaseAllocating) {
		c.alloc.Add(p.Spec.NodeName)
	}
}

func (c *cluster) nodeEvent(n *corev1.Node) {
	now := time.Now()
	_, locked := n.Annotations[nodelock.Key]
	c.mu.Lock()
	if since, was := c.lockSince[n.Name]; was && !locked {
		c.holds = append(c.holds, now.Sub(since))
		delete(c.lockSince, n.Name)
	} else if locked && !was {
		c.lockSince[n.Name] = now
	}
	c.notifyLocked()
	c.mu.Unlock()
	if locked {
		c.alloc.Add(n.Name)
	}
}

// runAllocator plays HAMi's device plugin (allocationtest.Plugin, HAMi's Allocate with its
// writes) for the pod a node's lock names, once the pod is bound to that node: what the
// kubelet's Allocate would start. Its last write releases the lock.
func (c *cluster) runAllocator(ctx context.Context) {
	for {
		node, shutdown := c.alloc.Get()
		if shutdown {
			return
		}
		if err := c.allocate(ctx, node); err != nil && ctx.Err() == nil {
			c.mu.Lock()
			c.allocErr = fmt.Errorf("node %s: %w", node, err)
			c.mu.Unlock()
			c.alloc.AddRateLimited(node)
		} else {
			c.alloc.Forget(node)
		}
		c.alloc.Done(node)
	}
}

func (c *cluster) allocate(ctx context.Context, node string) error {
	n, err := c.nodes.Get(node)
	if err != nil {
		return nil //nolint:nilerr // gone
	}
	l, locked, err := nodelock.FromAnnotations(n.Annotations)
	if err != nil || !locked || l.Name == "" {
		return nil //nolint:nilerr // not a lock the device plugin can follow: nothing to do
	}
	p, err := c.pods.Pods(l.Namespace).Get(l.Name)
	if err != nil || p.Spec.NodeName != node || p.Annotations[allocation.KeyBindPhase] != string(allocation.PhaseAllocating) {
		return nil //nolint:nilerr // not bound yet (its update requeues the node) or already done
	}
	plugin := allocationtest.NewPlugin(cp.AdminClient(), node, allocationtest.Options{})
	for range harness.GPUContainers(p) {
		a, err := plugin.Allocate(ctx, 0)
		if err != nil {
			return err
		}
		if a.Last {
			break
		}
	}
	return nil
}

// runReaper force-deletes (grace 0) the test's pods that carry a deletionTimestamp: the
// kubelet's confirmation that the containers are gone, which no kubelet gives here.
func (c *cluster) runReaper(ctx context.Context) {
	for {
		k, shutdown := c.reap.Get()
		if shutdown {
			return
		}
		err := cp.AdminClient().CoreV1().Pods(k.Namespace).Delete(ctx, k.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
			c.reap.Add(k) // retried at the next event of the pod at the latest
		}
		c.reap.Done(k)
	}
}

// waitFor waits until cond (called under c.mu) holds, waking at every pod or node event; it
// fails tb after timeout.
func (c *cluster) waitFor(tb testing.TB, what string, timeout time.Duration, cond func() bool) {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		ok, ch := cond(), c.changed
		c.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			c.mu.Lock()
			locks := slices.Sorted(maps.Keys(c.lockSince))
			err := c.allocErr
			c.mu.Unlock()
			tb.Fatalf("timed out after %v waiting for %s (nodes locked: %v; allocator's last error: %v)", timeout, what, locks, err)
		case <-tb.Context().Done():
			tb.Fatalf("test ended while waiting for %s", what)
		}
	}
}

// poll waits up to timeout for cond (called under c.mu), waking at every pod or node event,
// and reports whether it held.
func (c *cluster) poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		ok, ch := cond(), c.changed
		c.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-deadline.C:
			return false
		}
	}
}

// waitBound waits until the pod is bound and returns its node and when the informer saw it bound.
func (c *cluster) waitBound(tb testing.TB, ns, name string, timeout time.Duration) (string, time.Time) {
	tb.Helper()
	k := types.NamespacedName{Namespace: ns, Name: name}
	var at time.Time
	c.waitFor(tb, "pod "+k.String()+" bound", timeout, func() bool {
		var ok bool
		at, ok = c.boundAt[k]
		return ok
	})
	p, err := c.pods.Pods(ns).Get(name)
	if err != nil {
		tb.Fatalf("pod %s: %v", k, err)
	}
	return p.Spec.NodeName, at
}

// waitUnschedulable waits until kube-scheduler marked the pod PodScheduled=False/Unschedulable
// and returns the condition's message.
func (c *cluster) waitUnschedulable(tb testing.TB, ns, name string, timeout time.Duration) string {
	tb.Helper()
	var msg string
	c.waitFor(tb, "pod "+ns+"/"+name+" unschedulable", timeout, func() bool {
		p, err := c.pods.Pods(ns).Get(name)
		if err != nil {
			return false
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
				msg = cond.Message
				return true
			}
		}
		return false
	})
	return msg
}

// waitGone waits until the informer saw the pods deleted.
func (c *cluster) waitGone(tb testing.TB, pods ...types.NamespacedName) {
	tb.Helper()
	c.waitFor(tb, fmt.Sprintf("%d pods gone", len(pods)), 30*time.Second, func() bool {
		for _, k := range pods {
			if _, err := c.pods.Pods(k.Namespace).Get(k.Name); err == nil {
				return false
			}
		}
		return true
	})
}

// waitUnlocked waits until none of the test's nodes holds a lock.
func (c *cluster) waitUnlocked(tb testing.TB) {
	tb.Helper()
	c.waitFor(tb, "node locks released", 30*time.Second, func() bool { return len(c.lockSince) == 0 })
}

// deletedSince returns the names ("ns/name") of the test's pods deleted at or after t, sorted.
func (c *cluster) deletedSince(t time.Time) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for k, at := range c.deleted {
		if !at.Before(t) {
			out = append(out, k.String())
		}
	}
	sort.Strings(out)
	return out
}

// takeHolds returns the lock holds recorded since the last call and forgets them.
func (c *cluster) takeHolds() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.holds
	c.holds = nil
	return h
}

// gpus returns n GPUs of node with mem MiB each.
func gpus(node string, n int, mem int32) []annotation.Device {
	out := make([]annotation.Device, n)
	for i := range out {
		out[i] = annotation.Device{ID: fmt.Sprintf("GPU-%s-%d", node, i), Index: uint(i), Count: split, Devmem: mem, Devcore: 100,
			Type: gpuType, Numa: 0, Mode: "hami-core", Health: true}
	}
	return out
}

// nodeOptions describe a GPU node of the test.
type nodeOptions struct {
	gpus int
	mem  int32
	// annotations are set at creation (e.g. hami.io/device-cordon).
	annotations map[string]string
	// noDevices: a Node without GPUs (churn target), not labelled for the test.
	noDevices bool
}

// node creates a Node (deleted when tb ends): untainted, Ready, with room for pods and
// nvidia.com/gpu allocatable GPUs × split, as a kubelet reports it after the device plugin
// registered; a register.Writer (running until tb ends) registers its devices and answers
// the handshake. It returns the Node's name and its devices.
func (c *cluster) node(tb testing.TB, opts nodeOptions) (string, []annotation.Device) {
	tb.Helper()
	name := harness.UniqueName("gpu")
	if opts.noDevices {
		cp.CreateAPINode(tb, name, harness.APINodeOptions{Labels: map[string]string{harness.TestLabel: c.test + "-other"}, Annotations: opts.annotations})
		return name, nil
	}
	devs := gpus(name, opts.gpus, opts.mem)
	cp.CreateAPINode(tb, name, harness.APINodeOptions{Labels: map[string]string{harness.TestLabel: c.test}, Annotations: opts.annotations,
		GPUAllocatable: ptr.To(int64(opts.gpus * split)), Devices: devs, QuietWriter: true})
	c.waitFor(tb, "node "+name+" in the informer", 10*time.Second, func() bool {
		_, err := c.nodes.Get(name)
		return err == nil
	})
	return name, devs
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

// priorityClass creates a PriorityClass of value (deleted when tb ends) and returns its name.
func priorityClass(tb testing.TB, value int32) string {
	tb.Helper()
	name := harness.UniqueName(fmt.Sprintf("prio%d", value))
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
	pcs := cp.AdminClient().SchedulingV1().PriorityClasses()
	if _, err := pcs.Create(tb.Context(), pc, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("create priority class: %v", err)
	}
	tb.Cleanup(func() { _ = pcs.Delete(context.WithoutCancel(tb.Context()), name, metav1.DeleteOptions{}) })
	return name
}

// podOptions describe a test pod.
type podOptions struct {
	ns, name, scheduler, priorityClass string
	// gpus, mem (MiB per GPU) and cores (percent per GPU, 0: none) are the container's
	// limits; gpus 0: a pod without GPU requests.
	gpus, mem, cores int64
	annotations      map[string]string
	labels           map[string]string
}

// pod is a pod of the test (label, node selector), with terminationGracePeriodSeconds 0.
func (c *cluster) pod(o podOptions) *corev1.Pod {
	lbl := map[string]string{harness.TestLabel: c.test}
	for k, v := range o.labels {
		lbl[k] = v
	}
	ctr := corev1.Container{Name: "cuda", Image: "registry.invalid/never-pulled:0"}
	if o.gpus > 0 {
		ctr.Resources.Limits = corev1.ResourceList{
			harness.GPUResource: *resource.NewQuantity(o.gpus, resource.DecimalSI),
			resMem:              *resource.NewQuantity(o.mem, resource.DecimalSI),
		}
		if o.cores > 0 {
			ctr.Resources.Limits[resCores] = *resource.NewQuantity(o.cores, resource.DecimalSI)
		}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: o.name, Namespace: o.ns, Labels: lbl, Annotations: o.annotations},
		Spec: corev1.PodSpec{
			SchedulerName:                 o.scheduler,
			PriorityClassName:             o.priorityClass,
			NodeSelector:                  map[string]string{harness.TestLabel: c.test},
			TerminationGracePeriodSeconds: new(int64),
			Containers:                    []corev1.Container{ctr},
		},
	}
}

// create creates the pod and returns it as stored.
func create(tb testing.TB, p *corev1.Pod) *corev1.Pod {
	tb.Helper()
	out, err := cp.AdminClient().CoreV1().Pods(p.Namespace).Create(tb.Context(), p, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("create pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	return out
}

// placed creates the pod already bound to node, holding one share per device of devs (its
// one container), with what HAMi's scheduler and device plugin leave on an allocated pod:
// hami.io/vgpu-node (annotation and label), vgpu-time, the allocated list, the consumed
// to-allocate list, bind-phase success and bind-time.
func (c *cluster) placed(tb testing.TB, o podOptions, node string, devs allocation.ContainerDevices) *corev1.Pod {
	tb.Helper()
	o.gpus, o.mem, o.cores = int64(len(devs)), int64(devs[0].Usedmem), int64(devs[0].Usedcores)
	p := c.pod(o)
	now := strconv.FormatInt(time.Now().Unix(), 10)
	pd := allocation.PodDevices{devs}
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[allocation.KeyNode] = node
	p.Annotations[allocation.KeyTime] = now
	p.Annotations[annotation.KeyNVIDIAAllocated] = allocation.EncodePodDevices(pd)
	p.Annotations[annotation.KeyNVIDIAToAllocate] = allocation.EncodePodDevices(pd.Consume(0))
	p.Annotations[allocation.KeyBindPhase] = string(allocation.PhaseSuccess)
	p.Annotations[allocation.KeyBindTime] = now
	p.Labels[allocation.KeyNode] = node
	p.Spec.NodeName = node
	out := create(tb, p)
	c.waitFor(tb, "placed pod "+p.Name+" in the informer", 10*time.Second, func() bool {
		_, ok := c.boundAt[key(out)]
		return ok
	})
	return out
}

// share is one device entry: mem MiB of the GPU.
func share(d annotation.Device, mem int32) allocation.ContainerDevice {
	return allocation.ContainerDevice{UUID: d.ID, Type: "NVIDIA", Usedmem: mem}
}

// deletePod deletes the pod with grace 0.
func deletePod(tb testing.TB, ns, name string) {
	tb.Helper()
	err := cp.AdminClient().CoreV1().Pods(ns).Delete(tb.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if err != nil && !apierrors.IsNotFound(err) {
		tb.Fatalf("delete pod %s/%s: %v", ns, name, err)
	}
}

// pdb creates a PodDisruptionBudget minAvailable 1 on the pods labelled sel in ns. No
// kube-controller-manager runs, so its status keeps disruptionsAllowed 0: evicting any
// selected pod violates it, as kube-scheduler's preemption reads it.
func pdb(tb testing.TB, ns string, sel map[string]string) {
	tb.Helper()
	one := intstr.FromInt32(1)
	b := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: harness.UniqueName("pdb"), Namespace: ns},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: sel}}}
	if _, err := cp.AdminClient().PolicyV1().PodDisruptionBudgets(ns).Create(tb.Context(), b, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("create pdb: %v", err)
	}
}

// quota creates a ResourceQuota in ns with HAMi's limits.nvidia.com/gpumem = mem MiB.
func quota(tb testing.TB, ns string, mem int64) {
	tb.Helper()
	rq := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "gpu", Namespace: ns},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"limits." + resMem: *resource.NewQuantity(mem, resource.DecimalSI)}}}
	if _, err := cp.AdminClient().CoreV1().ResourceQuotas(ns).Create(tb.Context(), rq, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("create quota: %v", err)
	}
}

// scheduler is one kube-scheduler process of a test and the profile name its GPU pods use.
type scheduler struct {
	name string // schedulerName of the pods it serves
	s    *envtest.Scheduler
}

// rename gives the configuration's profiles names of their own (each test or benchmark runs
// its own kube-scheduler, so they must not take each other's pods) and raises the client
// budget; it returns the new name of the profile named from.
func rename(cfg *kubeschedulerconfigv1.KubeSchedulerConfiguration, from string) string {
	cfg.ClientConnection.QPS = schedQPS
	cfg.ClientConnection.Burst = schedBurst
	out := ""
	for i := range cfg.Profiles {
		old := "default-scheduler"
		if cfg.Profiles[i].SchedulerName != nil {
			old = *cfg.Profiles[i].SchedulerName
		}
		n := harness.UniqueName(strings.TrimSuffix(old, "-scheduler"))
		cfg.Profiles[i].SchedulerName = &n
		if old == from {
			out = n
		}
	}
	return out
}

// startPlugin starts kube-scheduler with the HAMiGPU plugin (harness.StartHAMiScheduler).
func startPlugin(tb testing.TB, args map[string]any) *scheduler {
	tb.Helper()
	cfg := harness.HAMiSchedulerConfig(tb, args)
	name := rename(cfg, "hami-scheduler")
	if name == "" {
		tb.Fatal("HAMiSchedulerConfig has no profile hami-scheduler")
	}
	s := cp.StartHAMiScheduler(tb, cfg)
	return &scheduler{name: name, s: s}
}

// startExtender starts examples/extender and a stock kube-scheduler from the example's
// configuration calling it (HAMi's chart), the extender giving its scheduler name; args are
// more extender flags.
func startExtender(tb testing.TB, args ...string) *scheduler {
	tb.Helper()
	if errBuild != nil {
		tb.Fatal(errBuild)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(tb))
	cfg := harness.ExtenderSchedulerConfig(tb, "http://"+addr)
	name := rename(cfg, "hami-scheduler")
	// The queue settings of HAMiSchedulerConfig, so that both schedulers requeue alike.
	cfg.PodInitialBackoffSeconds, cfg.PodMaxBackoffSeconds = new(int64(1)), new(int64(1))
	cp.StartExtenderAt(tb, extenderBin, addr, append([]string{"--scheduler-name=" + name}, args...)...)
	return startStock(tb, cfg, name)
}

// startPlain starts a stock kube-scheduler with one default profile.
func startPlain(tb testing.TB) *scheduler {
	tb.Helper()
	cfg := &kubeschedulerconfigv1.KubeSchedulerConfiguration{Profiles: []kubeschedulerconfigv1.KubeSchedulerProfile{{}}}
	return startStock(tb, cfg, rename(cfg, "default-scheduler"))
}

func startStock(tb testing.TB, cfg *kubeschedulerconfigv1.KubeSchedulerConfiguration, name string) *scheduler {
	tb.Helper()
	s, err := cp.StartScheduler(tb.Context(), envtest.SchedulerOptions{Config: cfg})
	if err != nil {
		tb.Fatalf("start kube-scheduler: %v", err)
	}
	tb.Cleanup(func() {
		_ = s.Stop()
		if tb.Failed() {
			tb.Logf("kube-scheduler log:\n%s", s.LogTail(40))
		}
	})
	return &scheduler{name: name, s: s}
}

// attempts reads scheduler_schedule_attempts_total of the scheduler's profile (all results)
// from its /metrics, on the secure port found in its command line, as the admin user.
func (s *scheduler) attempts(tb testing.TB) float64 {
	tb.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", s.s.Pid()))
	if err != nil {
		tb.Fatal(err)
	}
	port := ""
	for _, a := range strings.Split(string(raw), "\x00") {
		if v, ok := strings.CutPrefix(a, "--secure-port="); ok {
			port = v
		}
	}
	if port == "" {
		tb.Fatal("kube-scheduler: no --secure-port")
	}
	req, err := http.NewRequestWithContext(tb.Context(), http.MethodGet, "https://127.0.0.1:"+port+"/metrics", http.NoBody)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+cp.RESTConfig().BearerToken)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}, // self-signed, loopback only
	}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		tb.Fatalf("kube-scheduler /metrics: %d %v %.200s", resp.StatusCode, err, body)
	}
	sum := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "scheduler_schedule_attempts_total{") || !strings.Contains(line, `profile="`+s.name+`"`) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			tb.Fatalf("metrics line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// createAll creates pods with 8 concurrent clients.
func createAll(tb testing.TB, pods []*corev1.Pod) {
	tb.Helper()
	work := make(chan *corev1.Pod)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for p := range work {
				if _, err := cp.AdminClient().CoreV1().Pods(p.Namespace).Create(tb.Context(), p, metav1.CreateOptions{}); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("create pod %s: %w", p.Name, err))
					mu.Unlock()
				}
			}
		})
	}
	for _, p := range pods {
		work <- p
	}
	close(work)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		tb.Fatal(err)
	}
}

// deleteAll deletes the test's pods in ns with grace 0 and waits until they are gone and
// every node lock of the test is released.
func (c *cluster) deleteAll(tb testing.TB, ns string) {
	tb.Helper()
	err := cp.AdminClient().CoreV1().Pods(ns).DeleteCollection(tb.Context(), metav1.DeleteOptions{GracePeriodSeconds: new(int64)},
		metav1.ListOptions{LabelSelector: harness.TestLabel + "=" + c.test})
	if err != nil {
		tb.Fatal(err)
	}
	c.waitFor(tb, "pods of "+ns+" gone", 60*time.Second, func() bool {
		l, err := c.pods.Pods(ns).List(labels.Everything())
		return err == nil && len(l) == 0
	})
	c.waitUnlocked(tb)
}

// percentile returns the p-th percentile (0–100, nearest rank) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

func mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

// cordon sets the Node's hami.io/device-cordon to uuids (HAMi master: those GPUs take no new
// pods) and waits until the test's informer sees it.
func (c *cluster) cordon(tb testing.TB, node, uuids string) {
	tb.Helper()
	v := uuids
	if err := cp.PatchNodeAnnotations(tb.Context(), node, "e2e-test", map[string]*string{allocation.KeyDeviceCordon: &v}); err != nil {
		tb.Fatal(err)
	}
	c.waitFor(tb, "cordon of "+node, 10*time.Second, func() bool {
		n, err := c.nodes.Get(node)
		return err == nil && n.Annotations[allocation.KeyDeviceCordon] == uuids
	})
}

// apiRequests reads apiserver_request_total from the API server's /metrics and returns the
// requests and the writes (POST, PUT, PATCH, DELETE) it answered so far, every client
// together.
func apiRequests(tb testing.TB) (all, writes float64) {
	tb.Helper()
	body, err := cp.AdminClient().CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(tb.Context())
	if err != nil {
		tb.Fatalf("kube-apiserver /metrics: %v", err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			tb.Fatalf("metrics line %q: %v", line, err)
		}
		all += v
		for _, verb := range []string{`verb="POST"`, `verb="PUT"`, `verb="PATCH"`, `verb="DELETE"`} {
			if strings.Contains(line, verb) {
				writes += v
			}
		}
	}
	return all, writes
}
