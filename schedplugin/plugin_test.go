package schedplugin

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/nodelock"
)

var (
	oneGPU    = map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "600"}
	cpuLimits = map[string]string{"cpu": "1"}
)

func TestArgs(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		raw  string
		want string // substring of the error; "" succeeds
	}{
		"empty":           {raw: ""},
		"yaml":            {raw: "nodeSchedulerPolicy: spread\nhamiVersion: v2.9.0\nnodeLockWait: 3s\n"},
		"json":            {raw: `{"gpuSchedulerPolicy":"binpack","vendors":[{"name":"NVIDIA"}]}`},
		"unknown field":   {raw: "nodeLockWaits: 3s\n", want: `unknown field "nodeLockWaits"`},
		"bad version":     {raw: "hamiVersion: v1\n", want: `hamiVersion "v1"`},
		"negative wait":   {raw: "nodeLockWait: -1s\n", want: "negative"},
		"generic vendor":  {raw: "vendors: [{name: NVIDIA}, {name: ACME, resourceName: acme.example/npu, resourceMemoryName: acme.example/npumem}]\n"},
		"vendor rules":    {raw: "vendors: [{name: Ascend910B3, resourceName: huawei.com/Ascend910B3}]\n", want: "Ascend910B3"},
		"vendor twice":    {raw: "vendors: [{name: NVIDIA}, {name: NVIDIA}]\n", want: "listed twice"},
		"vendor resource": {raw: "vendors: [{name: ACME}]\n", want: "resourceName"},
		"handshake":       {raw: "handshake: {mode: lease, leaseNamespace: kube-system, leaseName: hami-scheduler}\nlegacyMetrics: true\n"},
		"handshake mode":  {raw: "handshake: {mode: sometimes}\n", want: `handshake.mode "sometimes"`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a, err := decodeArgs(&runtime.Unknown{Raw: []byte(tc.raw)})
			if err == nil {
				_, err = a.settings()
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("error %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrInvalidArgs)):
				t.Fatalf("error %v, want ErrInvalidArgs with %q", err, tc.want)
			case name == "vendor rules" && !errors.Is(err, allocation.ErrVendorRules):
				t.Fatalf("error %v, want allocation.ErrVendorRules", err)
			}
		})
	}
}

func TestFactoryRefusesBadArgs(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	_, err := NewFactory()(ctx, &runtime.Unknown{Raw: []byte("bogus: 1")}, &fakeHandle{})
	if !errors.Is(err, ErrInvalidArgs) || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("error %v", err)
	}
}

func TestSkipsPodsWithoutDevices(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, gpuNode("n", gpus("n", 1, 1000), nil))
	pod := gpuPod("cpu", cpuLimits)
	cs := newCycleState()
	if _, st := e.p.PreFilter(e.ctx, cs, pod, nil); st.Code() != fwk.Skip {
		t.Errorf("PreFilter %v, want Skip", st)
	}
	if st := e.p.PreScore(e.ctx, cs, pod, nil); st.Code() != fwk.Skip {
		t.Errorf("PreScore %v, want Skip", st)
	}
	if _, st := e.p.PreBindPreFlight(e.ctx, cs, pod, "n"); st.Code() != fwk.Skip {
		t.Errorf("PreBindPreFlight %v, want Skip", st)
	}
	if st := e.p.Reserve(e.ctx, cs, pod, "n"); !st.IsSuccess() {
		t.Errorf("Reserve %v", st)
	}
	if st := e.p.PreBind(e.ctx, cs, pod, "n"); !st.IsSuccess() {
		t.Errorf("PreBind %v", st)
	}
	e.p.Unreserve(e.ctx, cs, pod, "n")
	frags, st := e.p.SignPod(e.ctx, pod)
	if !st.IsSuccess() || len(frags) != 1 {
		t.Errorf("SignPod %v %v", frags, st)
	}
	if _, st := e.p.SignPod(e.ctx, gpuPod("g", oneGPU)); st.Code() != fwk.Unschedulable {
		t.Errorf("SignPod of a GPU pod %v, want Unschedulable", st)
	}
	if len(e.client.Actions()) != 0 {
		for _, a := range e.client.Actions() {
			if a.GetVerb() != "list" && a.GetVerb() != "watch" {
				t.Errorf("API call %v for a pod without devices", a)
			}
		}
	}
}

func TestFilterCodes(t *testing.T) {
	t.Parallel()
	full := gpuNode("full", gpus("full", 1, 1000), nil)
	one := gpuNode("one", gpus("one", 1, 1000), nil)
	bare := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bare"}}
	e := newEnv(t, nil, full, one, bare)
	holder := placedPod("holder", "full", "GPU-full-0,NVIDIA,1000,0:;")
	for name, tc := range map[string]struct {
		pod    *corev1.Pod
		ni     fwk.NodeInfo
		code   fwk.Code
		reason string
	}{
		"fits":         {pod: gpuPod("p", oneGPU), ni: nodeInfo(one), code: fwk.Success},
		"memory held":  {pod: gpuPod("p", oneGPU), ni: nodeInfo(full, holder), code: fwk.Unschedulable, reason: "1/1 CardInsufficientMemory"},
		"too few GPUs": {pod: gpuPod("p", map[string]string{"nvidia.com/gpu": "2"}), ni: nodeInfo(one), code: fwk.UnschedulableAndUnresolvable, reason: allocation.ReasonNodeInsufficientDevice},
		"unregistered": {pod: gpuPod("p", oneGPU), ni: nodeInfo(bare), code: fwk.UnschedulableAndUnresolvable, reason: "node unregistered: NVIDIA"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cs := e.preFilter(tc.pod)
			st := e.p.Filter(e.ctx, cs, tc.pod, tc.ni)
			if st.Code() != tc.code || !strings.HasPrefix(st.Message(), tc.reason) {
				t.Fatalf("Filter %v %q, want %v %q", st.Code(), st.Message(), tc.code, tc.reason)
			}
		})
	}
}

// TestFilterReadsNodeInfo: a victim removed from the NodeInfo frees its GPU, a nominated pod
// added takes one, and the pod itself never counts against itself.
func TestFilterReadsNodeInfo(t *testing.T) {
	t.Parallel()
	n := gpuNode("n", gpus("n", 1, 1000), nil)
	e := newEnv(t, nil, n)
	pod := gpuPod("p", oneGPU)
	victim := placedPod("victim", "n", "GPU-n-0,NVIDIA,1000,0:;")
	nominated := gpuPod("nom", oneGPU)
	cs := e.preFilter(pod)
	if st := e.p.Filter(e.ctx, cs, pod, nodeInfo(n, victim)); st.Code() != fwk.Unschedulable {
		t.Errorf("with the victim: %v", st)
	}
	if st := e.p.Filter(e.ctx, cs, pod, nodeInfo(n)); !st.IsSuccess() {
		t.Errorf("victim removed: %v", st)
	}
	if st := e.p.Filter(e.ctx, cs, pod, nodeInfo(n, nominated)); st.Code() != fwk.Unschedulable {
		t.Errorf("nominated pod added: %v", st)
	}
	self := placedPod("p", "n", "GPU-n-0,NVIDIA,1000,0:;")
	self.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse("600")}
	if st := e.p.Filter(e.ctx, e.preFilter(self), self, nodeInfo(n, self)); !st.IsSuccess() {
		t.Errorf("pod holding devices there: %v", st)
	}
}

func TestCloneAndQuotaExtensions(t *testing.T) {
	t.Parallel()
	n := gpuNode("n", gpus("n", 2, 1000), nil)
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "gpu"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"limits.nvidia.com/gpumem": resource.MustParse("1000")}}}
	other := placedPod("other", "n", "GPU-n-1,NVIDIA,600,0:;")
	e := newEnv(t, nil, n, quota, other)
	pod := gpuPod("p", oneGPU)
	cs := e.preFilter(pod)
	ni := nodeInfo(n, other)
	if st := e.p.Filter(e.ctx, cs, pod, ni); st.Code() != fwk.Unschedulable || !strings.Contains(st.Message(), allocation.ReasonResourceQuotaNotFit) {
		t.Fatalf("over quota: %v", st)
	}
	clone := cs.Clone()
	if st := e.p.RemovePod(e.ctx, clone, pod, &fakePodInfo{pod: other}, ni); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := e.p.Filter(e.ctx, clone, pod, nodeInfo(n)); !st.IsSuccess() {
		t.Fatalf("victim removed from the quota: %v", st)
	}
	s, c := readState(cs), readState(clone)
	if s.delta != (allocation.QuotaAmount{}) || c.delta.Memory != -600 {
		t.Errorf("delta %v, clone's %v", s.delta, c.delta)
	}
	if _, ok := s.result("n"); ok {
		t.Error("the clone's fit reached the cycle's results")
	}
	if _, ok := c.result("n"); !ok {
		t.Error("the clone has no result")
	}
	if st := e.p.AddPod(e.ctx, clone, pod, &fakePodInfo{pod: other}, ni); !st.IsSuccess() || readState(clone).delta.Memory != 0 {
		t.Errorf("AddPod: %v, delta %v", st, readState(clone).delta)
	}
	if len(e.h.activated) != 0 {
		t.Fatalf("activated %v before any quota change", e.h.activated)
	}
	quota.Spec.Hard["limits.nvidia.com/gpumem"] = resource.MustParse("5000")
	if _, err := e.client.CoreV1().ResourceQuotas("default").Update(e.ctx, quota, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		e.h.mu.Lock()
		got := append([]string(nil), e.h.activated...)
		e.h.mu.Unlock()
		if len(got) == 1 && got[0] == "default/p" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("activated %v after the quota rose, want default/p", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestScore(t *testing.T) {
	t.Parallel()
	nodes := []*corev1.Node{gpuNode("a", gpus("a", 1, 1000), nil), gpuNode("b", gpus("b", 1, 1000), nil), gpuNode("c", gpus("c", 1, 1000), nil)}
	e := newEnv(t, nil, nodes[0], nodes[1], nodes[2])
	held := map[string][]*corev1.Pod{"a": nil, "b": {placedPod("hb", "b", "GPU-b-0,NVIDIA,200,10:;")}, "c": {placedPod("hc", "c", "GPU-c-0,NVIDIA,300,50:;")}}
	run := func(policy string) []int64 {
		pod := gpuPod("p", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100"})
		if policy != "" {
			pod.Annotations = map[string]string{allocation.KeyNodeSchedulerPolicy: policy}
		}
		cs := e.preFilter(pod)
		var list fwk.NodeScoreList
		for _, n := range nodes {
			ni := nodeInfo(n, held[n.Name]...)
			if st := e.p.Filter(e.ctx, cs, pod, ni); !st.IsSuccess() {
				t.Fatal(st)
			}
			s, st := e.p.Score(e.ctx, cs, pod, ni)
			if !st.IsSuccess() {
				t.Fatal(st)
			}
			list = append(list, fwk.NodeScore{Name: n.Name, Score: s})
		}
		if st := e.p.NormalizeScore(e.ctx, cs, pod, list); !st.IsSuccess() {
			t.Fatal(st)
		}
		out := make([]int64, len(list))
		for i, s := range list {
			out[i] = s.Score
		}
		return out
	}
	if got := run("binpack"); !cmp.Equal(got, []int64{0, 44, 100}) {
		t.Errorf("binpack %v", got)
	}
	if got := run("spread"); !cmp.Equal(got, []int64{100, 55, 0}) {
		t.Errorf("spread %v", got)
	}
	cs := e.preFilter(gpuPod("q", oneGPU))
	equal := fwk.NodeScoreList{{Name: "a", Score: 7}, {Name: "b", Score: 7}}
	if st := e.p.NormalizeScore(e.ctx, cs, nil, equal); !st.IsSuccess() || equal[0].Score != 100 || equal[1].Score != 100 {
		t.Errorf("all equal %v", equal)
	}
}

// TestReserveCountsReservations: two pods never get the same capacity, whether the first is in
// the second's NodeInfo as an assumed pod without annotations or absent from an older snapshot
// (the newer-reservation rule), and Unreserve is idempotent.
func TestReserveCountsReservations(t *testing.T) {
	t.Parallel()
	n := gpuNode("n", gpus("n", 1, 1000), nil)
	e := newEnv(t, nil, n)
	first, second := gpuPod("first", oneGPU), gpuPod("second", oneGPU)

	early := e.preFilter(second) // a pod-group member's cycle began before the first Reserve
	cs := e.preFilter(first)
	if st := e.p.Filter(e.ctx, cs, first, nodeInfo(n)); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := e.p.Reserve(e.ctx, cs, first, "n"); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := e.p.Filter(e.ctx, early, second, nodeInfo(n)); st.Code() != fwk.Unschedulable {
		t.Errorf("newer reservation absent from the snapshot: %v", st)
	}
	assumed := first.DeepCopy()
	assumed.Spec.NodeName = "n"
	late := e.preFilter(second)
	if st := e.p.Filter(e.ctx, late, second, nodeInfo(n, assumed)); st.Code() != fwk.Unschedulable {
		t.Errorf("assumed pod without annotations: %v", st)
	}
	if st := e.p.Filter(e.ctx, late, second, nodeInfo(n)); !st.IsSuccess() {
		t.Errorf("an older reservation absent from the NodeInfo is a victim, not counted: %v", st)
	}
	readState(late).results["n"] = nodeResult{nodeInfo: nodeInfo(n, assumed)}
	if st := e.p.Reserve(e.ctx, late, second, "n"); st.Code() != fwk.Unschedulable {
		t.Errorf("second Reserve on the same GPU: %v", st)
	}
	e.p.Unreserve(e.ctx, cs, first, "n")
	e.p.Unreserve(e.ctx, cs, first, "n")
	if _, ok := e.p.sh.res.get(first.UID); ok {
		t.Error("reservation kept after Unreserve")
	}
	if st := e.p.Reserve(e.ctx, late, second, "n"); !st.IsSuccess() {
		t.Errorf("Reserve after the first was unreserved: %v", st)
	}
}

func TestHints(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	logger, _ := ktesting.NewTestContext(t)
	events, err := e.p.EventsToRegister(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	hint := map[fwk.ClusterEvent]fwk.QueueingHintFn{}
	for _, ev := range events {
		hint[ev.Event] = ev.QueueingHintFn
	}
	node := func(a map[string]string, gpus int64) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: a},
			Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(gpus, resource.DecimalSI)}}}
	}
	reg := map[string]string{annotation.KeyNVIDIARegister: "x"}
	pod := gpuPod("p", oneGPU)
	policy := pod.DeepCopy()
	policy.Annotations = map[string]string{allocation.KeyUseGPUType: "A100"}
	more := gpuPod("p", map[string]string{"nvidia.com/gpu": "2"})
	labelled := pod.DeepCopy()
	labelled.Labels = map[string]string{"a": "b"}
	for name, tc := range map[string]struct {
		ev       fwk.ClusterEvent
		old, new any
		want     fwk.QueueingHint
	}{
		"gpu pod deleted":     {ev: fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Delete}, old: placedPod("h", "n", "x"), want: fwk.Queue},
		"assumed pod deleted": {ev: fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Delete}, old: gpuPod("h", oneGPU), want: fwk.Queue},
		"cpu pod deleted":     {ev: fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Delete}, old: gpuPod("h", cpuLimits), want: fwk.QueueSkip},
		"gpu node added":      {ev: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add}, new: node(reg, 0), want: fwk.Queue},
		"plain node added":    {ev: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add}, new: node(nil, 0), want: fwk.QueueSkip},
		"register changed": {ev: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.UpdateNodeAnnotation}, old: node(reg, 0),
			new: node(map[string]string{annotation.KeyNVIDIARegister: "y"}, 0), want: fwk.Queue},
		"cordon changed": {ev: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.UpdateNodeAnnotation}, old: node(reg, 0),
			new: node(map[string]string{annotation.KeyNVIDIARegister: "x", allocation.KeyDeviceCordon: "GPU-1"}, 0), want: fwk.Queue},
		"score changed": {ev: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.UpdateNodeAnnotation}, old: node(reg, 0),
			new: node(map[string]string{annotation.KeyNVIDIARegister: "x", annotation.KeyNVIDIAScore: "[]"}, 0), want: fwk.Queue},
		"lock changed": {ev: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.UpdateNodeAnnotation}, old: node(reg, 0),
			new: node(map[string]string{annotation.KeyNVIDIARegister: "x", nodelock.Key: "2026-01-01T00:00:00Z,default,a"}, 0), want: fwk.QueueSkip},
		"handshake changed": {ev: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.UpdateNodeAnnotation}, old: node(reg, 0),
			new: node(map[string]string{annotation.KeyNVIDIARegister: "x", annotation.KeyNVIDIAHandshake: "Requesting_x"}, 0), want: fwk.QueueSkip},
		"allocatable rose":  {ev: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.UpdateNodeAllocatable}, old: node(reg, 0), new: node(reg, 10), want: fwk.Queue},
		"allocatable fell":  {ev: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.UpdateNodeAllocatable}, old: node(reg, 10), new: node(reg, 0), want: fwk.QueueSkip},
		"selection changed": {ev: fwk.ClusterEvent{Resource: fwk.TargetPod, ActionType: fwk.Update}, old: pod, new: policy, want: fwk.Queue},
		"request changed":   {ev: fwk.ClusterEvent{Resource: fwk.TargetPod, ActionType: fwk.Update}, old: pod, new: more, want: fwk.Queue},
		"label changed":     {ev: fwk.ClusterEvent{Resource: fwk.TargetPod, ActionType: fwk.Update}, old: pod, new: labelled, want: fwk.QueueSkip},
		"foreign deleted":   {ev: fwk.ClusterEvent{Resource: fwk.UnscheduledPod, ActionType: fwk.Delete}, old: placedPod("f", "n", "x"), want: fwk.Queue},
		"pending deleted":   {ev: fwk.ClusterEvent{Resource: fwk.UnscheduledPod, ActionType: fwk.Delete}, old: gpuPod("f", oneGPU), want: fwk.QueueSkip},
	} {
		t.Run(name, func(t *testing.T) {
			fn, ok := hint[tc.ev]
			if !ok {
				t.Fatalf("event %v not registered", tc.ev.Label())
			}
			got, err := fn(logger, pod, tc.old, tc.new)
			if err != nil || got != tc.want {
				t.Errorf("hint %v %v, want %v", got, err, tc.want)
			}
		})
	}
}

// bindEnv reserves pod on node n of e and returns the cycle state.
func (e *env) reserve(pod *corev1.Pod, n *corev1.Node) *fakeCycleState {
	e.t.Helper()
	cs := e.preFilter(pod)
	if st := e.p.Filter(e.ctx, cs, pod, nodeInfo(n)); !st.IsSuccess() {
		e.t.Fatal(st)
	}
	if st := e.p.Reserve(e.ctx, cs, pod, n.Name); !st.IsSuccess() {
		e.t.Fatal(st)
	}
	return cs
}

func TestPreBindWritesAnnotationsAndLock(t *testing.T) {
	t.Parallel()
	n := gpuNode("n", gpus("n", 1, 1000), nil)
	pod := gpuPod("p", oneGPU)
	e := newEnv(t, nil, n, pod)
	cs := e.reserve(pod, n)
	if res, st := e.p.PreBindPreFlight(e.ctx, cs, pod, "n"); !st.IsSuccess() || res == nil || res.AllowParallel {
		t.Fatalf("PreBindPreFlight %v %v", res, st)
	}
	e.client.ClearActions()
	before := time.Now().Unix()
	if st := e.p.PreBind(e.ctx, cs, pod, "n"); !st.IsSuccess() {
		t.Fatal(st)
	}
	got, err := e.client.CoreV1().Pods("default").Get(e.ctx, "p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	when, _ := strconv.ParseInt(got.Annotations[allocation.KeyTime], 10, 64)
	if when < before || when > time.Now().Unix() {
		t.Errorf("vgpu-time %d", when)
	}
	dev := "GPU-n-0,NVIDIA,600,0:;"
	want := map[string]string{allocation.KeyNode: "n", allocation.KeyTime: got.Annotations[allocation.KeyTime],
		annotation.KeyNVIDIAToAllocate: dev, annotation.KeyNVIDIAAllocated: dev,
		allocation.KeyBindPhase: "allocating", allocation.KeyBindTime: got.Annotations[allocation.KeyTime]}
	if diff := cmp.Diff(want, got.Annotations); diff != "" {
		t.Errorf("annotations (-want +got):\n%s", diff)
	}
	if got.Labels[allocation.KeyNode] != "n" {
		t.Errorf("labels %v", got.Labels)
	}
	var podPatches int
	for _, a := range e.client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && p.GetResource().Resource == "pods" {
			podPatches++
		}
	}
	if podPatches != 1 {
		t.Errorf("%d pod patches, want 1", podPatches)
	}
	node, _ := e.client.CoreV1().Nodes().Get(e.ctx, "n", metav1.GetOptions{})
	l, err := nodelock.Parse(node.Annotations[nodelock.Key])
	if err != nil || l.Namespace != "default" || l.Name != "p" {
		t.Fatalf("lock %q: %v", node.Annotations[nodelock.Key], err)
	}

	e.p.Unreserve(e.ctx, cs, pod, "n")
	node, _ = e.client.CoreV1().Nodes().Get(e.ctx, "n", metav1.GetOptions{})
	if v, ok := node.Annotations[nodelock.Key]; ok {
		t.Errorf("lock %q after Unreserve", v)
	}
	got, _ = e.client.CoreV1().Pods("default").Get(e.ctx, "p", metav1.GetOptions{})
	if got.Annotations[allocation.KeyBindPhase] != "failed" {
		t.Errorf("bind-phase %q after Unreserve", got.Annotations[allocation.KeyBindPhase])
	}
}

func TestUnreserveKeepsLockOfBoundPod(t *testing.T) {
	t.Parallel()
	n := gpuNode("n", gpus("n", 1, 1000), nil)
	pod := gpuPod("p", oneGPU)
	e := newEnv(t, nil, n, pod)
	cs := e.reserve(pod, n)
	if st := e.p.PreBind(e.ctx, cs, pod, "n"); !st.IsSuccess() {
		t.Fatal(st)
	}
	bound, _ := e.client.CoreV1().Pods("default").Get(e.ctx, "p", metav1.GetOptions{})
	bound.Spec.NodeName = "n"
	if _, err := e.client.CoreV1().Pods("default").Update(e.ctx, bound, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.p.Unreserve(e.ctx, cs, pod, "n")
	node, _ := e.client.CoreV1().Nodes().Get(e.ctx, "n", metav1.GetOptions{})
	if _, ok := node.Annotations[nodelock.Key]; !ok {
		t.Error("the bound pod's lock was released")
	}
}

func TestPreBindLockHeld(t *testing.T) {
	t.Parallel()
	holder := gpuPod("holder", oneGPU)
	n := gpuNode("n", gpus("n", 1, 1000), map[string]string{nodelock.Key: nodelock.Lock{Time: time.Now().UTC(), Namespace: "default", Name: "holder"}.String()})
	pod := gpuPod("p", oneGPU)
	e := newEnv(t, &Args{NodeLockWait: metav1.Duration{Duration: 50 * time.Millisecond}}, n, pod, holder)
	cs := e.reserve(pod, n)
	st := e.p.PreBind(e.ctx, cs, pod, "n")
	if st.Code() != fwk.Error || !strings.Contains(st.Message(), "has been locked within") {
		t.Fatalf("PreBind %v", st)
	}
	e.p.Unreserve(e.ctx, cs, pod, "n")
	node, _ := e.client.CoreV1().Nodes().Get(e.ctx, "n", metav1.GetOptions{})
	if l, _ := nodelock.Parse(node.Annotations[nodelock.Key]); l.Name != "holder" {
		t.Errorf("lock %q", node.Annotations[nodelock.Key])
	}
}

func TestTwoVendorsUnresolvable(t *testing.T) {
	t.Parallel()
	s := settings{vendors: []vendorConfig{{vendor: annotation.NVIDIA(), cfg: allocation.Config{}}, {vendor: annotation.NewVendor("ACME", "acme.example/npu"),
		cfg: allocation.Config{ResourceCount: "acme.example/npu"}}}}
	p := &Plugin{s: s}
	pod := gpuPod("p", map[string]string{"nvidia.com/gpu": "1", "acme.example/npu": "1"})
	_, st := p.PreFilter(t.Context(), newCycleState(), pod, nil)
	if st.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(st.Message(), "two vendors") {
		t.Fatalf("PreFilter %v", st)
	}
}

// TestGenericVendor places a pod of a vendor HAMi does not know with the generic fit: the
// vendor's register annotation, its resources and its pod annotation keys.
func TestGenericVendor(t *testing.T) {
	t.Parallel()
	acme := annotation.NewVendor("ACME", "acme.example/npu")
	devs := []annotation.Device{{ID: "NPU-0", Count: 4, Devmem: 16000, Devcore: 100, Type: "ACME", Health: true}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "npu", Annotations: map[string]string{acme.RegisterKey: annotation.Encode(devs)}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{"acme.example/npu": resource.MustParse("4")}}}
	pod := gpuPod("p", map[string]string{"acme.example/npu": "1", "acme.example/npumem": "1000"})
	args := &Args{Vendors: []VendorArgs{{Name: "NVIDIA"}, {Name: "ACME", ResourceName: "acme.example/npu", ResourceMemoryName: "acme.example/npumem"}}}
	e := newEnv(t, args, node, pod)
	cs := e.reserve(pod, node)
	if st := e.p.PreBind(e.ctx, cs, pod, "npu"); !st.IsSuccess() {
		t.Fatal(st)
	}
	got, _ := e.client.CoreV1().Pods("default").Get(e.ctx, "p", metav1.GetOptions{})
	if v := got.Annotations[acme.AllocatedKey]; v != "NPU-0,ACME,1000,0:;" || got.Annotations[acme.ToAllocateKey] != v {
		t.Errorf("annotations %v", got.Annotations)
	}
	nv := gpuPod("nv", oneGPU)
	if st := e.p.Filter(e.ctx, e.preFilter(nv), nv, nodeInfo(node)); st.Code() != fwk.UnschedulableAndUnresolvable {
		t.Errorf("NVIDIA pod on an ACME node: %v", st)
	}
}

// TestReserveCountsNominatedPods: Reserve counts the node's nominated pods of equal or higher
// priority that the handle knows, not lower ones.
func TestReserveCountsNominatedPods(t *testing.T) {
	t.Parallel()
	n := gpuNode("n", gpus("n", 1, 1000), nil)
	e := newEnv(t, nil, n)
	high, low := int32(10), int32(-1)
	nominated := gpuPod("nom", oneGPU)
	nominated.Spec.Priority = &high
	pod := gpuPod("p", oneGPU)
	e.h.mu.Lock()
	e.h.nominated["n"] = []fwk.PodInfo{&fakePodInfo{pod: nominated}}
	e.h.mu.Unlock()
	cs := e.preFilter(pod)
	readState(cs).results["n"] = nodeResult{nodeInfo: nodeInfo(n)}
	if st := e.p.Reserve(e.ctx, cs, pod, "n"); st.Code() != fwk.Unschedulable {
		t.Fatalf("Reserve with a higher-priority nominated pod: %v", st)
	}
	nominated.Spec.Priority = &low
	if st := e.p.Reserve(e.ctx, cs, pod, "n"); !st.IsSuccess() {
		t.Fatalf("Reserve with a lower-priority nominated pod: %v", st)
	}
	e.p.Unreserve(e.ctx, cs, pod, "n")
}

// TestPreBindHonoursCancel: preemption cancels a pod waiting in PreBind for the lock.
func TestPreBindHonoursCancel(t *testing.T) {
	t.Parallel()
	holder := gpuPod("holder", oneGPU)
	n := gpuNode("n", gpus("n", 1, 1000), map[string]string{nodelock.Key: nodelock.Lock{Time: time.Now().UTC(), Namespace: "default", Name: "holder"}.String()})
	pod := gpuPod("p", oneGPU)
	e := newEnv(t, &Args{NodeLockWait: metav1.Duration{Duration: time.Hour}}, n, pod, holder)
	cs := e.reserve(pod, n)
	ctx, cancel := context.WithCancel(e.ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	if st := e.p.PreBind(ctx, cs, pod, "n"); st.IsSuccess() {
		t.Fatal("PreBind succeeded on a held lock")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("PreBind returned %s after the cancel", d)
	}
	e.p.Unreserve(e.ctx, cs, pod, "n")
}

// TestDeletedPodDropsReservation: a reservation lasts until Unreserve or the pod's deletion.
func TestDeletedPodDropsReservation(t *testing.T) {
	t.Parallel()
	n := gpuNode("n", gpus("n", 1, 1000), nil)
	pod := gpuPod("p", oneGPU)
	e := newEnv(t, nil, n, pod)
	e.reserve(pod, n)
	if _, ok := e.p.sh.res.get(pod.UID); !ok {
		t.Fatal("no reservation after Reserve")
	}
	if err := e.client.CoreV1().Pods("default").Delete(e.ctx, "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, ok := e.p.sh.res.get(pod.UID); !ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("reservation kept after the pod's deletion")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestProfilesShareState: one factory's profiles share the cluster-wide state, must agree on
// the version, and each fits with its own policies (the per-node memo does not cross them).
func TestProfilesShareState(t *testing.T) {
	t.Parallel()
	n := gpuNode("n", gpus("n", 2, 1000), nil)
	held := placedPod("held", "n", "GPU-n-0,NVIDIA,300,0:;")
	e := newEnv(t, &Args{GPUSchedulerPolicy: "binpack"}, n, held)
	spreadPl, err := e.newPlugin(e.ctx, &Args{GPUSchedulerPolicy: "spread"}, e.h)
	if err != nil {
		t.Fatal(err)
	}
	spread := spreadPl.(*Plugin)
	t.Cleanup(func() { _ = spread.Close() })
	if spread.sh != e.p.sh {
		t.Fatal("profiles of one factory do not share their state")
	}
	if _, err := e.newPlugin(e.ctx, &Args{HAMiVersion: "v2.9.0"}, e.h); !errors.Is(err, ErrInvalidArgs) {
		t.Fatalf("a profile with another version: %v", err)
	}
	pod := gpuPod("p", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100"})
	ni := nodeInfo(n, held) // one NodeInfo generation for both profiles
	filter := func(p *Plugin) *fakeCycleState {
		cs := newCycleState()
		if _, st := p.PreFilter(e.ctx, cs, pod, nil); !st.IsSuccess() {
			t.Fatal(st)
		}
		if st := p.Filter(e.ctx, cs, pod, ni); !st.IsSuccess() {
			t.Fatal(st)
		}
		return cs
	}
	gpuOf := func(p *Plugin, cs *fakeCycleState) string {
		if st := p.Reserve(e.ctx, cs, pod, "n"); !st.IsSuccess() {
			t.Fatal(st)
		}
		defer p.Unreserve(e.ctx, cs, pod, "n")
		return readState(cs).reserved.devices[0][0].UUID
	}
	binpackCS, spreadCS := filter(e.p), filter(spread)
	if got := gpuOf(spread, spreadCS); got != "GPU-n-1" {
		t.Errorf("spread profile chose %s", got)
	}
	if got := gpuOf(e.p, binpackCS); got != "GPU-n-0" {
		t.Errorf("binpack profile chose %s", got)
	}
}

// TestForeignPods: a pod another scheduler placed on the node and not yet bound counts there
// although the NodeInfo lacks it; once its bind failed it holds nothing.
func TestForeignPods(t *testing.T) {
	t.Parallel()
	n := gpuNode("n", gpus("n", 1, 1000), nil)
	foreign := placedPod("foreign", "n", "GPU-n-0,NVIDIA,1000,0:;")
	foreign.Spec.NodeName, foreign.Status.Phase = "", corev1.PodPending
	e := newEnv(t, nil, n, foreign)
	pod := gpuPod("p", oneGPU)
	if st := e.p.Filter(e.ctx, e.preFilter(pod), pod, nodeInfo(n)); st.Code() != fwk.Unschedulable {
		t.Fatalf("with a foreign pod: %v", st)
	}
	foreign.Annotations[allocation.KeyBindPhase] = string(allocation.PhaseFailed)
	if _, err := e.client.CoreV1().Pods("default").Update(e.ctx, foreign, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if e.p.Filter(e.ctx, e.preFilter(pod), pod, nodeInfo(n)).IsSuccess() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("a failed bind's pod still counts")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCollectors: HAMi's families from the plugin's state.
func TestCollectors(t *testing.T) {
	t.Parallel()
	n := gpuNode("n", gpus("n", 1, 1000), nil)
	e := newEnv(t, nil, n, placedPod("held", "n", "GPU-n-0,NVIDIA,300,0:;"))
	reg := prometheus.NewPedanticRegistry()
	for _, c := range e.p.Collectors() {
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	if e.p.NodeCache() == nil || e.p.NodeCache() != e.p.sh.cache {
		t.Error("NodeCache is not the shared cache")
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
	}
	for _, want := range []string{"hami_build_info", "hami_vgpu_memory_allocated_bytes", "hami_node_gpu_overview"} {
		if !names[want] {
			t.Errorf("no %s in %v", want, names)
		}
	}
}

// TestHandshakeAndMetrics: the handshake mode decides whether the plugin stamps the nodes'
// handshakes (always: at once; off: never), and HAMi's families are registered on
// kube-scheduler's legacyregistry while the plugin runs, and removed after its Close. Not
// parallel: legacyregistry is the process's.
func TestHandshakeAndMetrics(t *testing.T) {
	handshake := func(e *env) string {
		n, err := e.client.CoreV1().Nodes().Get(e.ctx, "n", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n.Annotations[annotation.KeyNVIDIAHandshake]
	}
	registered := func() bool {
		families, err := legacyregistry.DefaultGatherer.Gather()
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(families, func(f *dto.MetricFamily) bool { return f.GetName() == "hami_gpu_memory_limit_bytes" })
	}

	e := newEnv(t, &Args{Handshake: HandshakeArgs{Mode: HandshakeAlways}}, gpuNode("n", gpus("n", 1, 1000), nil))
	deadline := time.Now().Add(10 * time.Second)
	for !strings.HasPrefix(handshake(e), "Requesting_") {
		if time.Now().After(deadline) {
			t.Fatalf("handshake %q after 10 s with mode always, want Requesting_<time>", handshake(e))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !registered() {
		t.Error("HAMi's families are not on kube-scheduler's registry while the plugin runs")
	}
	if err := e.p.Close(); err != nil {
		t.Fatal(err)
	}
	if registered() {
		t.Error("HAMi's families are still registered after the last profile closed")
	}

	off := newEnv(t, &Args{Handshake: HandshakeArgs{Mode: HandshakeOff}}, gpuNode("n", gpus("n", 1, 1000), nil))
	time.Sleep(300 * time.Millisecond) // the mode always wrote well within this
	if h := handshake(off); h != "" {
		t.Errorf("handshake %q with mode off, want none", h)
	}
}

// TestInvalidScoringWeightsUnresolvable: a pod asking for GPUs whose
// hami.io/device-scoring-weights does not parse is rejected at PreFilter with HAMi v2.10.0's
// parse error; a pod asking for none skips the plugin whatever the annotation says.
func TestInvalidScoringWeightsUnresolvable(t *testing.T) {
	t.Parallel()
	p := &Plugin{s: settings{vendors: []vendorConfig{{vendor: annotation.NVIDIA(), cfg: allocation.Config{Version: allocation.VersionMaster}}}}}
	pod := gpuPod("p", map[string]string{"nvidia.com/gpu": "1"})
	pod.Annotations = map[string]string{allocation.KeyDeviceScoringWeights: "slot=1,core=1,mem=3"}
	_, st := p.PreFilter(t.Context(), newCycleState(), pod, nil)
	want := `invalid hami.io/device-scoring-weights annotation "slot=1,core=1,mem=3": unknown weight "mem"`
	if st.Code() != fwk.UnschedulableAndUnresolvable || st.Message() != want {
		t.Fatalf("PreFilter %v, want UnschedulableAndUnresolvable %q", st, want)
	}
	cpu := gpuPod("cpu", cpuLimits)
	cpu.Annotations = pod.Annotations
	if _, st := p.PreFilter(t.Context(), newCycleState(), cpu, nil); st.Code() != fwk.Skip {
		t.Errorf("PreFilter of a pod without devices %v, want Skip", st)
	}
}
