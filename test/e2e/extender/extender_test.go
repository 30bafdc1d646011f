package extender_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/handshake"
	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

const (
	resGPU     = allocation.DefaultResourceCount
	resMem     = allocation.DefaultResourceMemory
	resMemPct  = allocation.DefaultResourceMemoryPercentage
	resCores   = allocation.DefaultResourceCores
	bindPhase  = allocation.KeyBindPhase
	allocating = string(allocation.PhaseAllocating)
)

// hamiAnnotations are the pod annotations HAMi's scheduler writes at filter (spec §4.1) and
// bind (§4.2), and nothing else, sorted.
func hamiAnnotations() []string {
	return slices.Sorted(slices.Values([]string{allocation.KeyNode, allocation.KeyTime, annotation.KeyNVIDIAToAllocate,
		annotation.KeyNVIDIAAllocated, allocation.KeyBindPhase, allocation.KeyBindTime}))
}

// waitStamped waits until the extender's Handshaker stamped the node: its cache has seen it.
func waitStamped(tb testing.TB, node string) {
	tb.Helper()
	harness.Eventually(tb, "handshake stamp on "+node, 30*time.Second, func() bool {
		return strings.HasPrefix(cp.GetNode(tb, node).Annotations[annotation.KeyNVIDIAHandshake], handshake.PrefixRequesting)
	})
}

// expected is what HAMi's fit chooses for pod over the nodes as they are now: their registered
// devices with what the pods already placed hold (allocation.Schedule, the same policies as the
// extender's flags: node binpack, GPU spread).
func expected(tb testing.TB, s *stack, nodes []string, pod *corev1.Pod) allocation.Decision {
	tb.Helper()
	used := map[string]map[string]allocation.Usage{}
	pods, err := cp.AdminClient().CoreV1().Pods(s.ns).List(tb.Context(), metav1.ListOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		node, ok := allocation.PodNode(p)
		if !ok {
			continue
		}
		pd, _, err := allocation.Allocated(p, annotation.NVIDIA(), allocation.VersionMaster)
		if err != nil {
			tb.Fatal(err)
		}
		if used[node] == nil {
			used[node] = map[string]allocation.Usage{}
		}
		for gpu, u := range pd.Usage() {
			used[node][gpu] = used[node][gpu].Add(u)
		}
	}
	var candidates []allocation.Node
	for _, name := range nodes {
		n := cp.GetNode(tb, name)
		devs, err := annotation.NodeDevices(n, annotation.NVIDIA())
		if err != nil {
			tb.Fatal(err)
		}
		candidates = append(candidates, allocation.Node{Name: name, Devices: allocation.WithUsage(devs, used[name]), Annotations: n.Annotations})
	}
	c := allocation.Config{}
	return allocation.Schedule(candidates, allocation.Requests(pod, c), pod.Annotations, c)
}

// Pods asking for nvidia.com/gpu, gpumem, gpumem-percentage and gpucores land on the node and
// GPUs that HAMi's fit chooses over the same nodes and usage, with exactly HAMi's filter and
// bind annotations, and the node lock held for the pod.
//
// HAMi's lock lets one pod per node be between bind and Allocate; no device plugin runs here,
// so the lock stays after each bind. The pods are created one at a time, each after the
// previous one was checked and its lock removed with nodelock.ForceRelease (what the plugin
// does after Allocate). The cases run in order, not in parallel: each expectation depends on
// what the earlier pods hold (binpack fills the busiest node, spread the idlest GPU).
func TestExtenderPlacesPodsAsHAMiFits(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{})
	test := s.name
	nodes := []string{test + "-a", test + "-b"}
	for _, n := range nodes {
		createGPUNode(t, test, n, nodeOptions{devices: gpus(n, true), allocatable: -1})
	}
	for _, n := range nodes {
		waitStamped(t, n)
	}
	locker, err := nodelock.New(cp.AdminClient().CoreV1(), nodelock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		res  map[string]int64
	}{
		{"whole-gpu", map[string]int64{resGPU: 1}},
		{"two-gpus-gpumem-gpucores", map[string]int64{resGPU: 2, resMem: 8000, resCores: 30}},
		{"gpumem-percentage", map[string]int64{resGPU: 1, resMemPct: 50, resCores: 20}},
		{"gpucores-only", map[string]int64{resGPU: 1, resCores: 60}},
		{"gpumem-only", map[string]int64{resGPU: 3, resMem: 12000}},
		// 8 × 30000 MiB no longer fits on the busy node: node b, the idle one, is the only choice.
		{"eight-gpus-other-node", map[string]int64{resGPU: 8, resMem: 30000, resCores: 10}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := s.gpuPod(tc.name, test, tc.res)
			want := expected(t, s, nodes, pod)
			if want.Node == "" {
				t.Fatalf("HAMi's fit places %s nowhere: %v", tc.name, want.Failed)
			}
			start := time.Now()
			createPods(t, []*corev1.Pod{pod})
			var got *corev1.Pod
			harness.Eventually(t, "pod "+tc.name+" bound", 60*time.Second, func() bool {
				got, err = s.pods.Pods(s.ns).Get(tc.name)
				return err == nil && got.Spec.NodeName != ""
			})
			devices := allocation.EncodePodDevices(want.Devices)
			t.Logf("%s on %s: %s", tc.name, got.Spec.NodeName, devices)
			if got.Spec.NodeName != want.Node {
				t.Errorf("bound to %s, HAMi's fit chooses %s", got.Spec.NodeName, want.Node)
			}
			a := got.Annotations
			if keys := slices.Sorted(maps.Keys(a)); !slices.Equal(keys, hamiAnnotations()) {
				t.Errorf("annotations %v, want exactly HAMi's %v", keys, hamiAnnotations())
			}
			if a[allocation.KeyNode] != want.Node || got.Labels[allocation.KeyNode] != want.Node {
				t.Errorf("%s annotation %q, label %q, want %s", allocation.KeyNode, a[allocation.KeyNode], got.Labels[allocation.KeyNode], want.Node)
			}
			for _, k := range []string{annotation.KeyNVIDIAAllocated, annotation.KeyNVIDIAToAllocate} {
				if a[k] != devices {
					t.Errorf("%s = %q, HAMi's fit gives %q", k, a[k], devices)
				}
			}
			if a[bindPhase] != allocating {
				t.Errorf("%s = %q, want %s", bindPhase, a[bindPhase], allocating)
			}
			unixNear(t, allocation.KeyTime, a[allocation.KeyTime], start)
			unixNear(t, allocation.KeyBindTime, a[allocation.KeyBindTime], start)
			l, age, locked := lockAge(t, got.Spec.NodeName)
			if owner, ok := l.Owner(); !locked || !ok || owner != (types.NamespacedName{Namespace: s.ns, Name: tc.name}) {
				t.Errorf("lock of %s = %+v (present %v), want held by %s/%s", got.Spec.NodeName, l, locked, s.ns, tc.name)
			} else if age > time.Minute {
				t.Errorf("lock of %s is %v old", got.Spec.NodeName, age)
			}
			// The device plugin's part after Allocate: the next pod may bind to the node.
			if err := locker.ForceRelease(harness.Context(t), got.Spec.NodeName); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Every rejection reaches the pod's FailedScheduling event with HAMi's words and the node
// cache's reason: a node without register annotation, one whose annotation does not decode,
// one registered with allocatable 0 (the device plugin is gone: schedcache says unhealthy),
// and one whose GPUs all report unhealthy (registered; HAMi's fit says CardNotHealth).
func TestExtenderRejectionReasonsReachEvents(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{})
	tests := map[string]struct {
		node nodeOptions
		want []string
	}{
		"unregistered": {nodeOptions{allocatable: -1}, []string{"node unregistered: NVIDIA absent"}},
		"malformed": {nodeOptions{allocatable: -1, annotations: map[string]string{annotation.KeyNVIDIARegister: "{not json"}},
			[]string{"node unregistered: NVIDIA malformed"}},
		"unhealthy":    {nodeOptions{allocatable: 0}, []string{"node unregistered: NVIDIA unhealthy"}},
		"sick-devices": {nodeOptions{allocatable: -1}, []string{fmt.Sprintf("%d/%d %s", gpusPerNode, gpusPerNode, allocation.ReasonCardNotHealth)}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test := s.name + "-" + name
			switch name {
			case "unhealthy":
				tc.node.devices = gpus(test, true)
			case "sick-devices":
				tc.node.devices = gpus(test, false)
			}
			createGPUNode(t, test, test, tc.node)
			createPods(t, []*corev1.Pod{s.gpuPod(name, test, map[string]int64{resGPU: 1, resMem: 1000})})
			var evs []string
			harness.Eventually(t, "FailedScheduling of "+name, 60*time.Second, func() bool {
				evs = s.failedScheduling(t, name)
				return containsAny(evs, tc.want)
			})
			t.Logf("FailedScheduling: %q", evs)
			p, err := s.pods.Pods(s.ns).Get(name)
			if err != nil {
				t.Fatal(err)
			}
			if p.Spec.NodeName != "" || p.Annotations[allocation.KeyNode] != "" {
				t.Errorf("rejected pod bound to %q, %s = %q", p.Spec.NodeName, allocation.KeyNode, p.Annotations[allocation.KeyNode])
			}
		})
	}
}

// manyPods are n pods of three shapes, one GPU each, that together ask for more memory and
// more cores than 3 nodes × 8 GPUs have: some stay Pending with CardInsufficientMemory or
// CardInsufficientCore.
func manyPods(s *stack, test string, n int) []*corev1.Pod {
	shapes := []map[string]int64{
		{resGPU: 1, resMem: 20000, resCores: 10},
		{resGPU: 1, resMem: 4000, resCores: 40},
		{resGPU: 1, resMem: 1000, resCores: 5},
	}
	pods := make([]*corev1.Pod, n)
	for i := range pods {
		pods[i] = s.gpuPod(fmt.Sprintf("p-%03d", i), test, shapes[i%len(shapes)])
	}
	return pods
}

// gpuNodes creates n registered GPU nodes for test and waits until the extender saw them.
func gpuNodes(tb testing.TB, test string, n int) map[string][]annotation.Device {
	tb.Helper()
	nodes := map[string][]annotation.Device{}
	for i := range n {
		name := fmt.Sprintf("%s-%d", test, i)
		nodes[name] = gpus(name, true)
		createGPUNode(tb, test, name, nodeOptions{devices: nodes[name], allocatable: -1})
	}
	for name := range nodes {
		waitStamped(tb, name)
	}
	return nodes
}

// 150 pods created at once on 3 nodes × 8 GPUs: no GPU is over-committed, every pod is bound
// or Pending with a reason naming the shortage, and once the plugin emulator allocated every
// bound pod no node lock is left. The emulator releases each lock once the pod is bound, so
// HAMi's one-pod-per-node lock costs a bind retry, not the 5 min lock timeout.
func TestExtenderManyPodsNoOvercommit(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{plugin: true})
	test := s.name
	nodes := gpuNodes(t, test, 3)
	const n = 150
	start := time.Now()
	createPods(t, manyPods(s, test, n))
	pods := s.waitSettled(t, n, 5*time.Minute)
	bound := s.checkPlacements(t, pods, nodes)
	t.Logf("%d of %d pods bound, %d pending, in %v", bound, n, n-bound, time.Since(start).Round(time.Millisecond))
	if bound == 0 || bound == n {
		t.Errorf("%d of %d pods bound: the pods should fill the GPUs and not all fit", bound, n)
	}
	harness.Eventually(t, "every bound pod allocated and every lock released", 60*time.Second, func() bool {
		for name := range nodes {
			if _, _, locked := lockAge(t, name); locked {
				return false
			}
		}
		return true
	})
}

// The extender SIGKILLed and restarted while 150 pods are being scheduled: it rebuilds usage
// from the pods' annotations (no GPU over-committed, pods keep being bound after the restart),
// and no node lock outlives the lock timeout: a lock the killed process left is taken over by
// the next bind once older than --node-lock-timeout (10 s here).
func TestExtenderRestartMidway(t *testing.T) {
	t.Parallel()
	const lockTimeout = 10 * time.Second
	s := newStack(t, stackOptions{plugin: true, lockTimeout: lockTimeout})
	test := s.name
	nodes := gpuNodes(t, test, 3)
	const n = 150
	createPods(t, manyPods(s, test, n))
	harness.Eventually(t, "20 pods allocated", 3*time.Minute, func() bool { return s.plugin.allocated.Load() >= 20 })
	s.ext.kill(t)
	before := s.plugin.allocated.Load()
	s.startExtender(t) // newStack's cleanup stops this one
	pods := s.waitSettled(t, n, 5*time.Minute)
	bound := s.checkPlacements(t, pods, nodes)
	t.Logf("%d pods allocated at the kill, %d of %d bound at the end", before, bound, n)
	if int64(bound) <= before {
		t.Errorf("%d pods bound at the end, %d before the restart: the restarted extender bound none", bound, before)
	}
	for name := range nodes {
		l, age, locked := lockAge(t, name)
		if locked && age > lockTimeout {
			t.Errorf("node %s still locked by %+v, %v old (lock timeout %v)", name, l, age.Round(time.Second), lockTimeout)
		} else if locked {
			t.Logf("node %s locked by %+v, %v old", name, l, age.Round(time.Second))
		}
	}
}
