package extender_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hamireg/hamireg/internal/manifests"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	kubeschedulerconfigv1 "k8s.io/kube-scheduler/config/v1"
	"sigs.k8s.io/yaml"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/proc"
	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

const (
	// gpusPerNode, split, devmem and devcore are what every GPU node registers: 8 GPUs of
	// 40960 MiB, 100 % cores, split count 10 (the chart's deviceSplitCount).
	gpusPerNode = 8
	split       = 10
	devmem      = 40960
	devcore     = 100
	// deployDir holds the example's manifests, which the tests read.
	deployDir = "../../../examples/extender/deploy"
	// extenderRole is the ClusterRole of deploy/rbac.yaml that the extender runs with.
	extenderRole = "hami-scheduler"
)

// roleOnce creates deploy/rbac.yaml's ClusterRole once per binary.
var roleOnce struct {
	sync.Once
	err error
}

// extenderKubeconfig writes a kubeconfig for ServiceAccount <ns>/hami-scheduler, bound to the
// ClusterRole of the example's deploy/rbac.yaml, and returns its path.
func extenderKubeconfig(tb testing.TB, ns string) string {
	tb.Helper()
	ctx := tb.Context()
	roleOnce.Do(func() {
		var role *rbacv1.ClusterRole
		if role, roleOnce.err = exampleClusterRole(); roleOnce.err != nil {
			return
		}
		if _, err := cp.AdminClient().RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			roleOnce.err = err
		}
	})
	if roleOnce.err != nil {
		tb.Fatalf("create cluster role %s: %v", extenderRole, roleOnce.err)
	}
	path, err := cp.ServiceAccountKubeconfig(ctx, tb.TempDir(), ns, "hami-scheduler", extenderRole)
	if err != nil {
		tb.Fatal(err)
	}
	return path
}

// exampleClusterRole is the ClusterRole hami-scheduler of deploy/rbac.yaml.
func exampleClusterRole() (*rbacv1.ClusterRole, error) {
	docs, err := manifests.Docs(filepath.Join(deployDir, "rbac.yaml"))
	if err != nil {
		return nil, err
	}
	for _, doc := range docs {
		var role rbacv1.ClusterRole
		if err := yaml.Unmarshal(doc, &role); err != nil {
			return nil, err
		}
		if role.Kind == "ClusterRole" && role.Name == extenderRole {
			return &role, nil
		}
	}
	return nil, fmt.Errorf("rbac.yaml: no ClusterRole %s", extenderRole)
}

// exampleSchedulerConfig reads the KubeSchedulerConfiguration of deploy/scheduler-config.yaml
// (the ConfigMap's config.yaml) and points it at this test's extender: the extender entry's
// urlPrefix is url (plain HTTP on loopback, so enableHTTPS and tlsConfig go), the profile is
// named schedulerName so that parallel tests' schedulers do not take each other's pods, and
// leader election is off (each test runs one kube-scheduler; with the file's Lease they
// would all wait for one). Everything else — verbs, nodeCacheCapable, weight, httpTimeout,
// the managed resources ignored by the scheduler — is the file's.
func exampleSchedulerConfig(tb testing.TB, url, schedulerName string) *kubeschedulerconfigv1.KubeSchedulerConfiguration {
	tb.Helper()
	objs := manifests.Glob(tb, filepath.Join(deployDir, "scheduler-config.yaml"))
	cm, ok := manifests.Find[*corev1.ConfigMap](objs, "hami-scheduler-config")
	if len(objs) != 1 || !ok {
		tb.Fatalf("scheduler-config.yaml: %d objects, want the ConfigMap hami-scheduler-config", len(objs))
	}
	c, err := manifests.SchedulerConfig(cm)
	if err != nil {
		tb.Fatalf("scheduler-config.yaml: %v", err)
	}
	if len(c.Extenders) != 1 || len(c.Profiles) != 1 {
		tb.Fatalf("scheduler-config.yaml: %d extenders, %d profiles, want 1 and 1", len(c.Extenders), len(c.Profiles))
	}
	if got := *c.Profiles[0].SchedulerName; got != "hami-scheduler" {
		tb.Fatalf("scheduler-config.yaml: profile %q, want HAMi's hami-scheduler", got)
	}
	if err := manifests.ExtenderOverHTTP(c, url); err != nil {
		tb.Fatal(err)
	}
	c.Profiles[0].SchedulerName = &schedulerName
	c.LeaderElection.LeaderElect = new(false)
	return c
}

// stackOptions configure newStack.
type stackOptions struct {
	// lockTimeout is the extender's --node-lock-timeout; zero means 5 min (the default).
	lockTimeout time.Duration
	// plugin starts the device plugin emulator on the stack's namespace.
	plugin bool
	// args are more extender flags.
	args []string
}

// stack is one test's scheduler: the examples/extender process and a kube-scheduler with the
// example's configuration calling it, a namespace for the test's pods, and informers on
// that namespace's pods and events.
type stack struct {
	name, ns string // scheduler name (profile and --scheduler-name); namespace of the pods
	url      string
	args     []string
	ext      *extenderProc
	restarts int
	sched    *envtest.Scheduler
	pods     corev1listers.PodLister
	events   corev1listers.EventLister
	plugin   *pluginEmulator
}

// newStack starts the extender as ServiceAccount <ns>/hami-scheduler, waits for its /readyz,
// then starts kube-scheduler from the example's configuration. Everything stops when tb ends;
// the extender must then exit 0 on SIGTERM (exit 66 is a race the detector found).
func newStack(tb testing.TB, opts stackOptions) *stack {
	tb.Helper()
	if errBuild != nil {
		tb.Fatal(errBuild)
	}
	s := &stack{name: harness.UniqueName("hami-scheduler")}
	s.ns = s.name
	if err := cp.EnsureNamespace(tb.Context(), s.ns); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = cp.AdminClient().CoreV1().Namespaces().Delete(context.WithoutCancel(tb.Context()), s.ns, metav1.DeleteOptions{})
	})
	addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(tb))
	s.url = "http://" + addr
	// No /metrics unless a test asks (its later flag wins): the default :9395 is one port for
	// every test binary running at once.
	s.args = []string{"--http_bind=" + addr, "--metrics-bind-address=", "--kubeconfig=" + extenderKubeconfig(tb, s.ns), "--scheduler-name=" + s.name,
		"--leader-elect=false", "--node-scheduler-policy=binpack", "--gpu-scheduler-policy=spread", "-v=3"}
	if opts.lockTimeout > 0 {
		s.args = append(s.args, "--node-lock-timeout="+opts.lockTimeout.String())
	}
	s.args = append(s.args, opts.args...)
	s.startExtender(tb)
	tb.Cleanup(func() { s.ext.stop(tb) })

	factory := informers.NewSharedInformerFactoryWithOptions(cp.AdminClient(), 0, informers.WithNamespace(s.ns))
	s.pods = factory.Core().V1().Pods().Lister()
	s.events = factory.Core().V1().Events().Lister()
	if opts.plugin {
		s.plugin = newPluginEmulator(tb, factory.Core().V1().Pods())
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(tb.Context()))
	factory.Start(ctx.Done())
	tb.Cleanup(func() {
		cancel()
		factory.Shutdown()
	})
	for typ, ok := range factory.WaitForCacheSync(tb.Context().Done()) {
		if !ok {
			tb.Fatalf("informer %v not synced", typ)
		}
	}

	sched, err := cp.StartScheduler(tb.Context(), envtest.SchedulerOptions{Config: exampleSchedulerConfig(tb, s.url, s.name)})
	if err != nil {
		tb.Fatalf("start kube-scheduler: %v", err)
	}
	s.sched = sched
	tb.Cleanup(func() {
		_ = sched.Stop()
		if tb.Failed() {
			tb.Logf("kube-scheduler log:\n%s", sched.LogTail(40))
		}
	})
	return s
}

// extenderProc is one run of the examples/extender process.
type extenderProc struct {
	p       *proc.Process
	spawner *proc.Spawner
	stopped bool
}

// startExtender starts the extender process and waits until its /readyz answers 200 (node
// cache and pod usage synced).
func (s *stack) startExtender(tb testing.TB) {
	tb.Helper()
	e := &extenderProc{spawner: proc.NewSpawner()}
	logPath := filepath.Join(tb.TempDir(), fmt.Sprintf("extender-%d.log", s.restarts))
	s.restarts++
	p, err := e.spawner.Start(proc.Options{Name: "extender", Path: extenderBin, Args: s.args, LogPath: logPath})
	if err != nil {
		e.spawner.Close()
		tb.Fatal(err)
	}
	e.p = p
	s.ext = e
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("extender log %s:\n%s", logPath, p.LogTail(60))
		}
	})
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(tb.Context(), 60*time.Second)
	defer cancel()
	err = p.WaitUntil(ctx, 20*time.Millisecond, envtest.Readyz(hc, s.url+"/readyz", ""))
	if err != nil {
		tb.Fatalf("extender not ready: %v", err)
	}
}

// kill SIGKILLs the extender and waits until it is gone.
func (e *extenderProc) kill(tb testing.TB) {
	tb.Helper()
	e.stopped = true
	defer e.spawner.Close()
	if err := syscall.Kill(e.p.Pid(), syscall.SIGKILL); err != nil {
		tb.Fatalf("kill extender: %v", err)
	}
	<-e.p.Exited()
}

// stop sends SIGTERM and fails tb unless the process exits 0 within 20 s.
func (e *extenderProc) stop(tb testing.TB) {
	tb.Helper()
	if e.stopped {
		return
	}
	e.stopped = true
	defer e.spawner.Close()
	select {
	case <-e.p.Exited():
		tb.Errorf("extender had exited before SIGTERM: %v\n%s", e.p.ExitError(), e.p.LogTail(40))
		return
	default:
	}
	if err := e.p.Stop(20 * time.Second); err != nil {
		tb.Errorf("%v\n%s", err, e.p.LogTail(40))
		return
	}
	if ee := (*exec.ExitError)(nil); errors.As(e.p.ExitError(), &ee) {
		tb.Errorf("extender exited with %v after SIGTERM, want 0\n%s", ee, e.p.LogTail(40))
	}
}

// gpus returns the 8 GPUs a node registers; sick GPUs report Health false.
func gpus(node string, healthy bool) []annotation.Device {
	out := make([]annotation.Device, gpusPerNode)
	for i := range out {
		out[i] = annotation.Device{ID: fmt.Sprintf("GPU-%s-%d", node, i), Index: uint(i), Count: split, Devmem: devmem, Devcore: devcore,
			Type: "NVIDIA-NVIDIA A100-SXM4-40GB", Numa: i / 4, Mode: "hami-core", Health: healthy}
	}
	return out
}

// nodeOptions describe a GPU node.
type nodeOptions struct {
	// devices, when set, are registered by a register.Writer (channel 2).
	devices []annotation.Device
	// allocatable is status.allocatable nvidia.com/gpu (channel 1); -1 means GPUs × split.
	allocatable int64
	// annotations are set at creation (e.g. a malformed register annotation).
	annotations map[string]string
}

// createGPUNode creates a Node labelled for test, without the not-ready taint, Ready, with
// room for many pods and the given allocatable nvidia.com/gpu (as a kubelet would report it
// after the device plugin registered), and registers its devices with a register.Writer that
// runs until tb ends. No kubelet runs: bound pods stay Pending and never start.
func createGPUNode(tb testing.TB, test, name string, opts nodeOptions) {
	tb.Helper()
	alloc := opts.allocatable
	if alloc < 0 {
		alloc = gpusPerNode * split
	}
	cp.CreateAPINode(tb, name, harness.APINodeOptions{Labels: map[string]string{harness.TestLabel: test},
		Annotations: opts.annotations, GPUAllocatable: &alloc, Devices: opts.devices})
}

// gpuPod is a pod of the stack's scheduler, restricted to the test's nodes, whose one container
// asks for the given HAMi resources (limits; requests default to them).
func (s *stack) gpuPod(name, test string, res map[string]int64) *corev1.Pod {
	limits := corev1.ResourceList{}
	for k, v := range res {
		limits[corev1.ResourceName(k)] = *resource.NewQuantity(v, resource.DecimalSI)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns},
		Spec: corev1.PodSpec{
			SchedulerName: s.name,
			NodeSelector:  map[string]string{harness.TestLabel: test},
			Containers: []corev1.Container{{
				Name:      "cuda",
				Image:     "registry.invalid/never-pulled:0",
				Resources: corev1.ResourceRequirements{Limits: limits},
			}},
		},
	}
}

// createPods creates pods with 8 concurrent clients and returns when all are created.
func createPods(tb testing.TB, pods []*corev1.Pod) {
	tb.Helper()
	work := make(chan *corev1.Pod)
	errs := make(chan error, len(pods))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for p := range work {
				if _, err := cp.AdminClient().CoreV1().Pods(p.Namespace).Create(tb.Context(), p, metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("create pod %s: %w", p.Name, err)
				}
			}
		})
	}
	for _, p := range pods {
		work <- p
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
}

// unschedulable reports whether kube-scheduler marked the pod PodScheduled=False/Unschedulable
// (no node fits), and returns the condition's message.
func unschedulable(p *corev1.Pod) (string, bool) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return c.Message, true
		}
	}
	return "", false
}

// failedScheduling returns the messages of the pod's FailedScheduling events.
func (s *stack) failedScheduling(tb testing.TB, pod string) []string {
	tb.Helper()
	evs, err := s.events.Events(s.ns).List(labels.Everything())
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		if e.InvolvedObject.Name == pod && e.Reason == "FailedScheduling" {
			out = append(out, e.Message)
		}
	}
	return out
}

// listPods lists the stack's pods from the informer.
func (s *stack) listPods(tb testing.TB) []*corev1.Pod {
	tb.Helper()
	pods, err := s.pods.Pods(s.ns).List(labels.Everything())
	if err != nil {
		tb.Fatal(err)
	}
	return pods
}

// waitSettled waits until each of n pods is bound or marked Unschedulable, and returns them.
// Usage only grows here (bound pods never end), so an Unschedulable pod stays so unless a
// reservation of a pod whose bind failed moves; the checks made after this hold at any time.
func (s *stack) waitSettled(tb testing.TB, n int, timeout time.Duration) []*corev1.Pod {
	tb.Helper()
	var pods []*corev1.Pod
	harness.Eventually(tb, fmt.Sprintf("%d pods bound or unschedulable", n), timeout, func() bool {
		pods = s.listPods(tb)
		if len(pods) != n {
			return false
		}
		for _, p := range pods {
			if _, ok := unschedulable(p); p.Spec.NodeName == "" && !ok {
				return false
			}
		}
		return true
	})
	return pods
}

// shortageWords are HAMi's reason words that name a GPU shortage.
func shortageWords() []string {
	return []string{allocation.ReasonCardInsufficientMemory, allocation.ReasonCardInsufficientCore,
		allocation.ReasonCardTimeSlicingExhausted, allocation.ReasonCardComputeUnitsExhausted, allocation.ReasonNodeUnfitPod}
}

// checkPlacements checks what the pods hold against what the nodes registered: no GPU
// over-committed (Σ memory ≤ devmem, Σ cores ≤ devcore, pods ≤ split count, counted over every
// pod with hami.io/vgpu-node, bound or not, as HAMi counts), every bound pod on the node of its
// annotation with both device lists equal, and every unbound pod Unschedulable with a
// FailedScheduling event that names the shortage. It returns the number of bound pods.
func (s *stack) checkPlacements(tb testing.TB, pods []*corev1.Pod, nodes map[string][]annotation.Device) int {
	tb.Helper()
	used := map[string]allocation.Usage{}
	gpuNode := map[string]string{}
	for node, devs := range nodes {
		for _, d := range devs {
			gpuNode[d.ID] = node
		}
	}
	bound := 0
	reasons := map[string]int{} // condition messages of pending pods, for the log
	for _, p := range pods {
		node, counts := allocation.PodNode(p)
		if p.Spec.NodeName != "" {
			bound++
			if node != p.Spec.NodeName {
				tb.Errorf("pod %s bound to %s, %s = %q", p.Name, p.Spec.NodeName, allocation.KeyNode, node)
			}
			// The plugin (emulator) consumes to-allocate and sets bind-phase success; until then
			// both lists are the same.
			a, b := p.Annotations[annotation.KeyNVIDIAAllocated], p.Annotations[annotation.KeyNVIDIAToAllocate]
			if phase := p.Annotations[allocation.KeyBindPhase]; a == "" || (phase == string(allocation.PhaseAllocating) && a != b) ||
				(phase != string(allocation.PhaseAllocating) && phase != string(allocation.PhaseSuccess)) {
				tb.Errorf("pod %s: allocated %q, to-allocate %q, bind-phase %q", p.Name, a, b, phase)
			}
		} else {
			msg, _ := unschedulable(p)
			reasons[msg]++
			evs := s.failedScheduling(tb, p.Name)
			if !containsAny(evs, shortageWords()) {
				tb.Errorf("pod %s pending (condition %q) without a FailedScheduling event naming a shortage: %q", p.Name, msg, evs)
			}
		}
		if !counts {
			continue
		}
		pd, _, err := allocation.Allocated(p, annotation.NVIDIA(), allocation.VersionMaster)
		if err != nil {
			tb.Errorf("pod %s: %v", p.Name, err)
			continue
		}
		for gpu, u := range pd.Usage() {
			if gpuNode[gpu] != node {
				tb.Errorf("pod %s holds GPU %s, which is not on its node %s", p.Name, gpu, node)
			}
			used[gpu] = used[gpu].Add(u)
		}
	}
	for msg, n := range reasons {
		tb.Logf("%d pending pods: %s", n, msg)
	}
	for gpu, u := range used {
		if u.Usedmem > devmem || u.Usedcores > devcore || u.Used > split {
			tb.Errorf("GPU %s over-committed: %d pods, %d MiB, %d %% cores (of %d, %d MiB, %d %%)", gpu, u.Used, u.Usedmem, u.Usedcores, split, devmem, devcore)
		}
	}
	return bound
}

func containsAny(msgs, words []string) bool {
	for _, m := range msgs {
		for _, w := range words {
			if strings.Contains(m, w) {
				return true
			}
		}
	}
	return false
}

// pluginEmulator plays HAMi's device plugin after the kubelet's Allocate, which no kubelet
// calls here: for each pod bound (spec.nodeName set) with bind-phase allocating it writes the
// consumed device list and bind-phase success in one merge patch, then releases the pod's node
// lock, as nodeagent does after the last container. Without it each node would take the next
// GPU pod only when the lock times out.
type pluginEmulator struct {
	pods      corev1listers.PodLister
	locker    *nodelock.Locker
	queue     workqueue.TypedRateLimitingInterface[types.NamespacedName]
	allocated atomic.Int64
}

func newPluginEmulator(tb testing.TB, informer interface {
	Informer() cache.SharedIndexInformer
	Lister() corev1listers.PodLister
}) *pluginEmulator {
	tb.Helper()
	locker, err := nodelock.New(cp.AdminClient().CoreV1(), nodelock.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	e := &pluginEmulator{pods: informer.Lister(), locker: locker,
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName]())}
	enqueue := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" && p.Annotations[allocation.KeyBindPhase] == string(allocation.PhaseAllocating) {
			e.queue.Add(types.NamespacedName{Namespace: p.Namespace, Name: p.Name})
		}
	}
	if _, err := informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }}); err != nil {
		tb.Fatal(err)
	}
	ctx := context.WithoutCancel(tb.Context())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				key, shutdown := e.queue.Get()
				if shutdown {
					return
				}
				if err := e.allocate(ctx, key); err != nil {
					e.queue.AddRateLimited(key)
				} else {
					e.queue.Forget(key)
				}
				e.queue.Done(key)
			}
		})
	}
	tb.Cleanup(func() {
		e.queue.ShutDown()
		wg.Wait()
	})
	return e
}

// allocate finishes one pod as the device plugin would after its last container's Allocate.
func (e *pluginEmulator) allocate(ctx context.Context, key types.NamespacedName) error {
	p, err := e.pods.Pods(key.Namespace).Get(key.Name)
	if err != nil || p.Annotations[allocation.KeyBindPhase] != string(allocation.PhaseAllocating) {
		return nil //nolint:nilerr // gone or done: nothing to do
	}
	pd, err := allocation.DecodePodDevices(p.Annotations[annotation.KeyNVIDIAToAllocate], allocation.VersionMaster)
	if err != nil {
		return err
	}
	for i, ok := pd.Next(); ok; i, ok = pd.Next() {
		pd = pd.Consume(i)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		annotation.KeyNVIDIAToAllocate: allocation.EncodePodDevices(pd),
		allocation.KeyBindPhase:        string(allocation.PhaseSuccess),
	}}})
	if err != nil {
		return err
	}
	if _, err := cp.AdminClient().CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return err
	}
	err = e.locker.Release(ctx, p.Spec.NodeName, key)
	if err != nil && !errors.Is(err, nodelock.ErrNotOwner) { // taken over after the timeout: not ours any more
		return err
	}
	e.allocated.Add(1)
	return nil
}

// lockAge returns how old the node's lock is, and false when it has none.
func lockAge(tb testing.TB, node string) (nodelock.Lock, time.Duration, bool) {
	tb.Helper()
	l, ok, err := nodelock.FromAnnotations(cp.GetNode(tb, node).Annotations)
	if err != nil {
		tb.Fatalf("lock of %s: %v", node, err)
	}
	return l, time.Since(l.Time), ok
}

// unixNear parses a Unix-seconds annotation and checks it lies in [from-1s, now+1s].
func unixNear(tb testing.TB, what, v string, from time.Time) {
	tb.Helper()
	sec, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		tb.Errorf("%s = %q, want Unix seconds", what, v)
		return
	}
	if t := time.Unix(sec, 0); t.Before(from.Add(-time.Second)) || t.After(time.Now().Add(time.Second)) {
		tb.Errorf("%s = %v, want between %v and now", what, t, from)
	}
}
