package monitor

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/hamicore/region"
)

const (
	gpuA = "GPU-aa000000-1111-2222-3333-444455556666"
	gpuB = "GPU-bb000000-1111-2222-3333-444455556666"
	gpuC = "GPU-cc000000-1111-2222-3333-444455556666"
)

func TestCheckRules(t *testing.T) {
	t.Parallel()
	a, b := rawKey(gpuA), rawKey(gpuB)
	tests := map[string]struct {
		counts         priorityCounts
		p              int32
		gpus           []gpuKey
		block, limitOn bool
	}{
		"alone":                      {priorityCounts{a: {1: 1}}, 1, []gpuKey{a}, false, false},
		"higher active":              {priorityCounts{a: {0: 1, 1: 1}}, 1, []gpuKey{a}, true, true},
		"same level twice":           {priorityCounts{a: {1: 2}}, 1, []gpuKey{a}, false, true},
		"lower active only":          {priorityCounts{a: {0: 1, 1: 1}}, 0, []gpuKey{a}, false, false},
		"higher on the second GPU":   {priorityCounts{a: {1: 1}, b: {0: 1, 1: 1}}, 1, []gpuKey{a, b}, true, true},
		"same level on the second":   {priorityCounts{a: {1: 1}, b: {1: 2}}, 1, []gpuKey{a, b}, false, true},
		"other GPU busy":             {priorityCounts{b: {0: 3}}, 1, []gpuKey{a}, false, false},
		"not in counts (idle)":       {priorityCounts{}, 1, []gpuKey{a}, false, false},
		"priority beyond the levels": {priorityCounts{a: {0: 0, 1: 0}}, 3, []gpuKey{a}, false, false},
		"priority 2 under 0":         {priorityCounts{a: {0: 1, 2: 1}}, 2, []gpuKey{a}, true, true},
		"huge priority under 5":      {priorityCounts{a: {5: 1}}, math.MaxInt32, []gpuKey{a}, true, true},
		"negative priority":          {priorityCounts{a: {0: 2, 1: 2}}, -1, []gpuKey{a}, false, false},
		"zero counts do not block":   {priorityCounts{a: {0: 0, 1: 1}}, 1, []gpuKey{a}, false, false},
		"no GPUs":                    {priorityCounts{a: {0: 1}}, 1, nil, false, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := checkBlocking(tc.counts, tc.p, tc.gpus); got != tc.block {
				t.Errorf("checkBlocking = %v, want %v", got, tc.block)
			}
			if got := checkPriority(tc.counts, tc.p, tc.gpus); got != tc.limitOn {
				t.Errorf("checkPriority = %v, want %v", got, tc.limitOn)
			}
		})
	}
}

func TestPriorityCountsAdd(t *testing.T) {
	t.Parallel()
	c := priorityCounts{}
	a := rawKey(gpuA)
	c.add(a, 1)
	c.add(a, 1)
	c.add(a, -1) // not counted
	c.add(a, math.MaxInt32)
	want := priorityCounts{a: {1: 2, math.MaxInt32: 1}}
	if d := cmp.Diff(want, c); d != "" {
		t.Errorf("counts (-want +got):\n%s", d)
	}
}

// TestFeedbackRoundsFollowTheRule runs random nodes for several rounds, HAMi-core launching
// kernels at random between them, under both Versions: every round writes exactly what HAMi
// v2.10.0's rule (masterModel) writes for the regions as read, and nothing else.
func TestFeedbackRoundsFollowTheRule(t *testing.T) {
	t.Parallel()
	for _, version := range []annotation.Version{annotation.VersionMaster, annotation.VersionV290} {
		for seed := range uint64(6) {
			t.Run(fmt.Sprintf("version=%d/seed=%d", version, seed), func(t *testing.T) {
				t.Parallel()
				rng := rand.New(rand.NewPCG(seed, 35))
				node := newFBNode(t)
				pool := []string{gpuA, gpuB, gpuC}
				var pods []*corev1.Pod
				for i := range 2 + rng.IntN(6) {
					uid := fmt.Sprintf("7e1b0000-0000-4000-8000-%012d", i)
					var gpus []string
					for _, g := range pool {
						if rng.IntN(2) == 0 {
							gpus = append(gpus, g)
						}
					}
					r := fbRegion(t, gpus, int32(rng.IntN(5))-1, int32(rng.IntN(6))-2, int32(rng.IntN(2)))
					if rng.IntN(5) == 0 {
						r.Layout, r.Major, r.Minor = region.LayoutV0, 0, 0
					}
					node.putRegion(t, uid+"_main", r)
					pods = append(pods, fbPod(uid, fmt.Sprintf("pod-%d", i), []string{"main"}, nil))
				}
				m := newFBMonitor(t, node.root, pods, Options{Version: version})
				_, ctx := ktesting.NewTestContext(t)
				for round := range 5 {
					for _, d := range node.dirs {
						if rng.IntN(3) == 0 {
							node.setField(t, d, region.FieldRecentKernel, 2) // a kernel launch
						}
					}
					cs := node.containers(t, nil, pods)
					var models []modelCtr
					for i := range cs {
						models = append(models, modelOf(&cs[i], cs[i].Region.Priority))
					}
					before := node.snapshot(t)
					m.feedback(ctx, cs)
					got := diff(before, node.snapshot(t))
					if d := cmp.Diff(masterModel(models), got, cmpopts.EquateEmpty()); d != "" {
						t.Fatalf("round %d (-rule +got):\n%s", round, d)
					}
					checkOnlyFeedbackWords(t, round, cs, got)
				}
			})
		}
	}
}

// TestFeedbackRegionChanged: a region replaced between the read and the round's writes
// (another layout) is not written and is left out of the round's state; the others are
// decided on the regions as read and written; the error is counted.
// A container without a region takes no part.
func TestFeedbackRegionChanged(t *testing.T) {
	t.Parallel()
	node := newFBNode(t)
	pods := []*corev1.Pod{
		fbPod("uid-a", "a", []string{"main"}, nil),
		fbPod("uid-b", "b", []string{"main"}, nil),
	}
	node.putRegion(t, "uid-a_main", fbRegion(t, []string{gpuA}, 0, 2, 1)) // would block b
	node.putRegion(t, "uid-b_main", fbRegion(t, []string{gpuA}, 1, 2, 1))
	m := newFBMonitor(t, node.root, pods, Options{})
	_, ctx := ktesting.NewTestContext(t)

	cs := node.containers(t, nil, pods)
	cs = append(cs, Container{Key: "uid-c_main", Path: node.path("uid-c_main"), Err: region.ErrNotInitialized})
	// HAMi-core of container a restarts with an older library: a v0 region in its place.
	replaced := fbRegion(t, []string{gpuA}, 0, 2, 1)
	replaced.Layout, replaced.Major, replaced.Minor = region.LayoutV0, 0, 0
	if err := region.WriteFile(node.path("uid-a_main"), replaced); err != nil {
		t.Fatal(err)
	}
	before := node.snapshot(t)
	m.feedback(ctx, cs)
	got := diff(before, node.snapshot(t))
	rk, _ := region.LayoutV1.Offset(region.FieldRecentKernel)
	want := []fbWrite{ // the round decided on the regions as read: a was active, b is blocked
		{Dir: "uid-b_main", Offset: rk, From: 2, To: -1},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("writes (-want +got):\n%s", d)
	}
	if m.fb.writeErrors != 1 {
		t.Errorf("write errors %d, want 1", m.fb.writeErrors)
	}
	if len(m.fb.rows) != 1 || m.fb.rows[0].key != "uid-b_main" {
		t.Errorf("rows %+v, want b's only", m.fb.rows)
	}
	if _, err := os.Stat(node.path("uid-c_main")); !os.IsNotExist(err) {
		t.Errorf("a container without a region was touched: %v", err)
	}
}

// TestFeedbackPrioritySource: a tenant writes priority 0 into its region although its pod
// spec says 1. HAMi (PriorityRegion) believes the region and blocks the honest priority-0
// pod's neighbour; PriorityPodSpec decides by the spec. Both report the mismatch.
func TestFeedbackPrioritySource(t *testing.T) {
	t.Parallel()
	zero, one := int64(0), int64(1)
	pods := []*corev1.Pod{
		fbPod("uid-tenant", "tenant", []string{"main"}, &one),
		fbPod("uid-honest", "honest", []string{"main"}, &zero),
	}
	rk, _ := region.LayoutV1.Offset(region.FieldRecentKernel)
	sw, _ := region.LayoutV1.Offset(region.FieldUtilizationSwitch)
	tests := map[string]struct {
		source PrioritySource
		want   []fbWrite
	}{
		"region (HAMi)": {PriorityRegion, []fbWrite{
			// both at level 0 on the GPU: neither blocked, both keep the core limit
			{Dir: "uid-honest_main", Offset: rk, From: 2, To: 1},
			{Dir: "uid-tenant_main", Offset: rk, From: 2, To: 1},
		}},
		"pod spec": {PriorityPodSpec, []fbWrite{
			{Dir: "uid-honest_main", Offset: sw, From: 1, To: 0},
			{Dir: "uid-honest_main", Offset: rk, From: 2, To: 1},
			{Dir: "uid-tenant_main", Offset: rk, From: 2, To: -1},
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			node := newFBNode(t)
			node.putRegion(t, "uid-tenant_main", fbRegion(t, []string{gpuA}, 0, 2, 1))
			node.putRegion(t, "uid-honest_main", fbRegion(t, []string{gpuA}, 0, 2, 1))
			m := newFBMonitor(t, node.root, pods, Options{PrioritySource: tc.source})
			_, ctx := ktesting.NewTestContext(t)
			before := node.snapshot(t)
			m.feedback(ctx, node.containers(t, nil, pods))
			if d := cmp.Diff(tc.want, diff(before, node.snapshot(t))); d != "" {
				t.Errorf("writes (-want +got):\n%s", d)
			}
			if m.fb.mismatches != 1 {
				t.Errorf("mismatches %d, want 1 (the tenant)", m.fb.mismatches)
			}
		})
	}
}

// TestFeedbackMismatchReportedOncePerChange: a mismatch is logged and counted once while it
// lasts, again when a value changes, and its gauge goes when the values agree.
func TestFeedbackMismatchReportedOncePerChange(t *testing.T) {
	t.Parallel()
	one := int64(1)
	pods := []*corev1.Pod{fbPod("uid-a", "a", []string{"main"}, &one)}
	node := newFBNode(t)
	node.putRegion(t, "uid-a_main", fbRegion(t, []string{gpuA}, 0, 0, 0))
	m := newFBMonitor(t, node.root, pods, Options{FeedbackMetrics: true})
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx := klog.NewContext(t.Context(), logger)
	logged := func() int {
		return strings.Count(logger.GetSink().(ktesting.Underlier).GetBuffer().String(), "Region priority differs from the pod spec")
	}
	round := func() { m.feedback(ctx, node.containers(t, nil, pods)) }
	coll := m.feedbackCollector()
	mismatchSeries := func() int { return testutil.CollectAndCount(coll, "hamireg_monitor_priority_mismatch") }

	round()
	round()
	if m.fb.mismatches != 1 || logged() != 1 || mismatchSeries() != 1 {
		t.Fatalf("after two rounds: %d counted, %d logged, %d series; want 1, 1, 1", m.fb.mismatches, logged(), mismatchSeries())
	}
	node.setField(t, "uid-a_main", region.FieldPriority, 2)
	round()
	if m.fb.mismatches != 2 || logged() != 2 {
		t.Fatalf("after a change: %d counted, %d logged; want 2, 2", m.fb.mismatches, logged())
	}
	node.setField(t, "uid-a_main", region.FieldPriority, 1)
	round()
	if m.fb.mismatches != 2 || logged() != 2 || mismatchSeries() != 0 {
		t.Fatalf("once agreeing: %d counted, %d logged, %d series; want 2, 2, 0", m.fb.mismatches, logged(), mismatchSeries())
	}
	node.setField(t, "uid-a_main", region.FieldPriority, 0)
	round()
	if m.fb.mismatches != 3 || logged() != 3 {
		t.Fatalf("mismatching again: %d counted, %d logged; want 3, 3", m.fb.mismatches, logged())
	}
}

// TestFeedbackDisabled: with DisableFeedback the round writes nothing but records the state
// it would have decided.
func TestFeedbackDisabled(t *testing.T) {
	t.Parallel()
	pods := []*corev1.Pod{fbPod("uid-a", "a", []string{"main"}, nil), fbPod("uid-b", "b", []string{"main"}, nil)}
	node := newFBNode(t)
	node.putRegion(t, "uid-a_main", fbRegion(t, []string{gpuA}, 0, 2, 1))
	node.putRegion(t, "uid-b_main", fbRegion(t, []string{gpuA}, 1, 2, 1))
	m := newFBMonitor(t, node.root, pods, Options{DisableFeedback: true})
	_, ctx := ktesting.NewTestContext(t)
	before := node.snapshot(t)
	m.feedback(ctx, node.containers(t, nil, pods))
	if got := diff(before, node.snapshot(t)); len(got) != 0 {
		t.Errorf("wrote %+v with the feedback disabled", got)
	}
	var blocked []string
	for _, r := range m.fb.rows {
		if r.recentKernel < 0 {
			blocked = append(blocked, r.key)
		}
	}
	if d := cmp.Diff([]string{"uid-b_main"}, blocked); d != "" {
		t.Errorf("blocked (-want +got):\n%s", d)
	}
}

func TestFeedbackCollector(t *testing.T) {
	t.Parallel()
	one := int64(1)
	pods := []*corev1.Pod{
		fbPod("uid-a", "a", []string{"main"}, nil),
		fbPod("uid-b", "b", []string{"main"}, &one),
	}
	node := newFBNode(t)
	node.putRegion(t, "uid-a_main", fbRegion(t, []string{gpuA}, 0, 2, 1))
	node.putRegion(t, "uid-b_main", fbRegion(t, []string{gpuA}, 1, 2, 1))
	node.putRegion(t, "uid-x_gone", fbRegion(t, []string{gpuB}, 0, 0, 1)) // pod not on the node
	m := newFBMonitor(t, node.root, pods, Options{FeedbackMetrics: true})
	coll := m.feedbackCollector()
	if n := testutil.CollectAndCount(coll, "hamireg_monitor_container_blocked"); n != 0 {
		t.Errorf("%d series before the first round", n)
	}
	_, ctx := ktesting.NewTestContext(t)
	m.feedback(ctx, node.containers(t, nil, pods))

	// a: region 0, spec 1 (no limit, no variable: HAMi-core's default) -> mismatch; alone at
	// level 0, limit off. b: region 1 = spec 1, blocked by a, limit on. x: no pod, spec
	// unknown; alone and idle, limit off.
	want := `
# HELP hamireg_monitor_container_blocked 1 when the priority feedback blocks the container (recent_kernel -1: a higher-priority container was active on one of its GPUs).
# TYPE hamireg_monitor_container_blocked gauge
hamireg_monitor_container_blocked{container="gone",namespace="",pod=""} 0
hamireg_monitor_container_blocked{container="main",namespace="default",pod="a"} 0
hamireg_monitor_container_blocked{container="main",namespace="default",pod="b"} 1
# HELP hamireg_monitor_container_priority Priority of the container's HAMi-core region (source="region") and of its pod spec (source="spec"); 0 is high.
# TYPE hamireg_monitor_container_priority gauge
hamireg_monitor_container_priority{container="gone",namespace="",pod="",source="region"} 0
hamireg_monitor_container_priority{container="main",namespace="default",pod="a",source="region"} 0
hamireg_monitor_container_priority{container="main",namespace="default",pod="a",source="spec"} 1
hamireg_monitor_container_priority{container="main",namespace="default",pod="b",source="region"} 1
hamireg_monitor_container_priority{container="main",namespace="default",pod="b",source="spec"} 1
# HELP hamireg_monitor_container_utilization_switch The region's utilization_switch after the priority feedback: 1 when HAMi-core enforces the container's core limit.
# TYPE hamireg_monitor_container_utilization_switch gauge
hamireg_monitor_container_utilization_switch{container="gone",namespace="",pod=""} 0
hamireg_monitor_container_utilization_switch{container="main",namespace="default",pod="a"} 0
hamireg_monitor_container_utilization_switch{container="main",namespace="default",pod="b"} 1
# HELP hamireg_monitor_feedback_write_errors_total Priority feedback writes that failed (the region changed or could not be written); the container sat the round out.
# TYPE hamireg_monitor_feedback_write_errors_total counter
hamireg_monitor_feedback_write_errors_total 0
# HELP hamireg_monitor_priority_mismatch 1 for a container whose region's priority differs from its pod spec's (nvidia.com/priority, else CUDA_TASK_PRIORITY, else 1).
# TYPE hamireg_monitor_priority_mismatch gauge
hamireg_monitor_priority_mismatch{container="main",namespace="default",pod="a",region="0",spec="1"} 1
# HELP hamireg_monitor_priority_mismatches_total Priority mismatches reported, one per container per change of either value.
# TYPE hamireg_monitor_priority_mismatches_total counter
hamireg_monitor_priority_mismatches_total 1
`
	if err := testutil.CollectAndCompare(coll, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	if problems, err := testutil.CollectAndLint(coll); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}
}

// TestFeedbackCollectorMergesRegions: a container with two regions (two claims) gives one
// series per family, blocked when either region is.
func TestFeedbackCollectorMergesRegions(t *testing.T) {
	t.Parallel()
	m := newFBMonitor(t, t.TempDir(), nil, Options{FeedbackMetrics: true})
	row := feedbackRow{key: "claims/1", name: "main", regionPriority: 1, specPriority: 1, specKnown: true}
	row.pod.Namespace, row.pod.Name = "ns", "p"
	other := row
	other.key, other.recentKernel, other.regionPriority = "claims/2", -1, 0
	m.fb.record(t.Context(), []feedbackRow{row, other})
	coll := m.feedbackCollector()
	if n := testutil.CollectAndCount(coll, "hamireg_monitor_container_blocked"); n != 1 {
		t.Fatalf("%d blocked series, want 1", n)
	}
	want := `
# HELP hamireg_monitor_container_blocked 1 when the priority feedback blocks the container (recent_kernel -1: a higher-priority container was active on one of its GPUs).
# TYPE hamireg_monitor_container_blocked gauge
hamireg_monitor_container_blocked{container="main",namespace="ns",pod="p"} 1
# HELP hamireg_monitor_priority_mismatch 1 for a container whose region's priority differs from its pod spec's (nvidia.com/priority, else CUDA_TASK_PRIORITY, else 1).
# TYPE hamireg_monitor_priority_mismatch gauge
hamireg_monitor_priority_mismatch{container="main",namespace="ns",pod="p",region="0",spec="1"} 1
`
	if err := testutil.CollectAndCompare(coll, strings.NewReader(want),
		"hamireg_monitor_container_blocked", "hamireg_monitor_priority_mismatch"); err != nil {
		t.Error(err)
	}
}

// TestFeedbackConcurrentCollect: scrapes during rounds see one round's state (run with -race).
func TestFeedbackConcurrentCollect(t *testing.T) {
	t.Parallel()
	pods := []*corev1.Pod{fbPod("uid-a", "a", []string{"main"}, nil)}
	node := newFBNode(t)
	node.putRegion(t, "uid-a_main", fbRegion(t, []string{gpuA}, 0, 2, 1))
	m := newFBMonitor(t, node.root, pods, Options{FeedbackMetrics: true})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			testutil.CollectAndCount(m.feedbackCollector())
		}
	}()
	for range 20 {
		m.feedback(ctx, node.containers(t, nil, pods))
	}
	cancel()
	<-done
}

// TestFeedbackActivityFromSMUtil: the latch of HAMi's rule with 2026 HAMi-core. Container a
// was found alone once, so its switch is off and its library no longer refreshes
// recent_kernel, though it keeps computing (SM utilisation 50 %). A newcomer b on the same
// GPU is then counted alone too and its core limit goes off (HAMi). With
// ActivityFromSMUtil a counts as active: both are at level 1 twice, both limits go on.
func TestFeedbackActivityFromSMUtil(t *testing.T) {
	t.Parallel()
	pods := []*corev1.Pod{fbPod("uid-a", "a", []string{"main"}, nil), fbPod("uid-b", "b", []string{"main"}, nil),
		fbPod("uid-c", "c", []string{"main"}, nil)}
	rk, _ := region.LayoutV1.Offset(region.FieldRecentKernel)
	sw, _ := region.LayoutV1.Offset(region.FieldUtilizationSwitch)
	tests := map[string]struct {
		fromSM bool
		want   []fbWrite
	}{
		"HAMi's rule": {false, []fbWrite{
			{Dir: "uid-b_main", Offset: sw, From: 1, To: 0},
			{Dir: "uid-b_main", Offset: rk, From: 2, To: 1},
		}},
		"ActivityFromSMUtil": {true, []fbWrite{
			{Dir: "uid-a_main", Offset: sw, From: 0, To: 1},
			{Dir: "uid-b_main", Offset: rk, From: 2, To: 1},
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			node := newFBNode(t)
			a := fbRegion(t, []string{gpuA}, 1, 0, 0)
			a.Slots[0].Util[0].SM = 50
			node.putRegion(t, "uid-a_main", a)
			node.putRegion(t, "uid-b_main", fbRegion(t, []string{gpuA}, 1, 2, 1))
			// c's process exited (status 0): its last SM utilisation does not count, else c
			// (priority 0) would block b.
			c := fbRegion(t, []string{gpuA}, 0, 0, 0)
			c.Slots[0].Status, c.Slots[0].Util[0].SM = 0, 80
			node.putRegion(t, "uid-c_main", c)
			m := newFBMonitor(t, node.root, pods, Options{ActivityFromSMUtil: tc.fromSM})
			_, ctx := ktesting.NewTestContext(t)
			before := node.snapshot(t)
			m.feedback(ctx, node.containers(t, nil, pods))
			if d := cmp.Diff(tc.want, diff(before, node.snapshot(t))); d != "" {
				t.Errorf("writes (-want +got):\n%s", d)
			}
		})
	}
}

// TestFeedbackSharedRegion: a DRA claim's region is listed once per container that uses the
// claim; it takes part in the round once (counted once, written once), each container gets
// its row, and by the pod spec the region has the lowest priority of its containers.
func TestFeedbackSharedRegion(t *testing.T) {
	t.Parallel()
	zero, one, two := int64(0), int64(1), int64(2)
	pods := []*corev1.Pod{
		fbPod("uid-a", "a", []string{"main"}, &zero),
		fbPod("uid-b", "b", []string{"main"}, &two),
		fbPod("uid-x", "x", []string{"main"}, &one),
	}
	rk, _ := region.LayoutV1.Offset(region.FieldRecentKernel)
	sw, _ := region.LayoutV1.Offset(region.FieldUtilizationSwitch)
	tests := map[string]struct {
		source PrioritySource
		want   []fbWrite
	}{
		"region": {PriorityRegion, []fbWrite{ // both at level 1: the limit stays on
			{Dir: "claims_c1", Offset: rk, From: 2, To: 1},
			{Dir: "uid-x_main", Offset: rk, From: 2, To: 1},
		}},
		"pod spec": {PriorityPodSpec, []fbWrite{ // the claim at 2 (b's), blocked by x at 1
			{Dir: "claims_c1", Offset: rk, From: 2, To: -1},
			{Dir: "uid-x_main", Offset: sw, From: 1, To: 0},
			{Dir: "uid-x_main", Offset: rk, From: 2, To: 1},
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			node := newFBNode(t)
			node.putRegion(t, "claims_c1", fbRegion(t, []string{gpuA}, 1, 2, 1))
			node.putRegion(t, "uid-x_main", fbRegion(t, []string{gpuA}, 1, 2, 1))
			m := newFBMonitor(t, node.root, pods, Options{PrioritySource: tc.source, FeedbackMetrics: true})
			_, ctx := ktesting.NewTestContext(t)
			cs := node.containers(t, []string{"uid-x_main"}, pods)
			claim, err := region.ReadFile(node.path("claims_c1"))
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range pods[:2] {
				cs = append(cs, Container{Key: "claims/c1", Path: node.path("claims_c1"), PodUID: p.UID,
					Pod: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, Name: "main", Region: claim})
			}
			before := node.snapshot(t)
			m.feedback(ctx, cs)
			if d := cmp.Diff(tc.want, diff(before, node.snapshot(t))); d != "" {
				t.Errorf("writes (-want +got):\n%s", d)
			}
			if n := testutil.CollectAndCount(m.feedbackCollector(), "hamireg_monitor_container_blocked"); n != 3 {
				t.Errorf("%d containers in the metrics, want 3", n)
			}
			// a (spec 0) and b (spec 2) both differ from the claim region's 1.
			if m.fb.mismatches != 2 {
				t.Errorf("mismatches %d, want 2", m.fb.mismatches)
			}
		})
	}
}
