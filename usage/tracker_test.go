package usage

import (
	"fmt"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/allocation"
)

func placed(name, devices string) *corev1.Pod {
	const node = "n1"
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, Annotations: map[string]string{
		allocation.KeyNode: node, "hami.io/vgpu-devices-allocated": devices}}, Spec: corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
}

func quota(name, mem string) *corev1.ResourceQuota {
	return &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"limits.nvidia.com/gpumem": resource.MustParse(mem)}}}
}

func TestTracker(t *testing.T) {
	t.Parallel()
	type want struct {
		used    int64
		node    map[string]allocation.Usage
		onGPU   []string
		limit   int64
		limited bool
	}
	a := placed("a", "g0,NVIDIA,3000,10:;")
	b := placed("b", "g0,NVIDIA,1000,10:;")
	tests := map[string]struct {
		steps func(t *Tracker)
		want  want
	}{
		"observed": {steps: func(t *Tracker) { t.Observe(a); t.Observe(b) },
			want: want{used: 4000, node: map[string]allocation.Usage{"g0": {Used: 2, Usedmem: 4000, Usedcores: 20}}, onGPU: []string{"team-a/a", "team-a/b"}}},
		"deleted": {steps: func(t *Tracker) { t.Observe(a); t.Observe(b); t.Delete("team-a/a") },
			want: want{used: 1000, node: map[string]allocation.Usage{"g0": {Used: 1, Usedmem: 1000, Usedcores: 10}}, onGPU: []string{"team-a/b"}}},
		"succeeded": {steps: func(t *Tracker) {
			t.Observe(a)
			done := a.DeepCopy()
			done.Status.Phase = corev1.PodSucceeded
			t.Observe(done)
		}, want: want{node: map[string]allocation.Usage{}, onGPU: []string{}}},
		"assumed, then informed: counted once": {steps: func(t *Tracker) {
			t.Assume(a, "n1", allocation.PodDevices{{{UUID: "g0", Type: "NVIDIA", Usedmem: 3000, Usedcores: 10}}})
			t.Observe(a)
		}, want: want{used: 3000, node: map[string]allocation.Usage{"g0": {Used: 1, Usedmem: 3000, Usedcores: 10}}, onGPU: []string{"team-a/a"}}},
		"re-assumed: counted once": {steps: func(t *Tracker) {
			t.Observe(a)
			t.Assume(a, "n2", allocation.PodDevices{{{UUID: "h0", Type: "NVIDIA", Usedmem: 2000}}})
		}, want: want{used: 2000, node: map[string]allocation.Usage{}, onGPU: []string{}}},
		"undo restores": {steps: func(t *Tracker) {
			t.Observe(b)
			undo := t.Assume(b, "n2", allocation.PodDevices{{{UUID: "h0", Type: "NVIDIA", Usedmem: 2000}}})
			undo()
		}, want: want{used: 1000, node: map[string]allocation.Usage{"g0": {Used: 1, Usedmem: 1000, Usedcores: 10}}, onGPU: []string{"team-a/b"}}},
		"a failed bind keeps holding until placed again": {steps: func(t *Tracker) {
			t.Observe(a)
			failed := a.DeepCopy()
			failed.Spec.NodeName = ""
			failed.Annotations[allocation.KeyBindPhase] = string(allocation.PhaseFailed)
			t.Observe(failed)
		}, want: want{used: 3000, node: map[string]allocation.Usage{"g0": {Used: 1, Usedmem: 3000, Usedcores: 10}}, onGPU: []string{"team-a/a"}}},
		"two quotas: the tightest": {steps: func(t *Tracker) { t.SetQuota(quota("small", "3000")); t.SetQuota(quota("big", "8000")) },
			want: want{node: map[string]allocation.Usage{}, onGPU: []string{}, limit: 3000, limited: true}},
		"two quotas, one deleted: the other stays": {steps: func(t *Tracker) {
			t.SetQuota(quota("small", "3000"))
			t.SetQuota(quota("big", "8000"))
			t.DeleteQuota("team-a", "small")
		}, want: want{node: map[string]allocation.Usage{}, onGPU: []string{}, limit: 8000, limited: true}},
		"quota updated": {steps: func(t *Tracker) { t.SetQuota(quota("q", "3000")); t.SetQuota(quota("q", "5000")) },
			want: want{node: map[string]allocation.Usage{}, onGPU: []string{}, limit: 5000, limited: true}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tr := New(Options{})
			tt.steps(tr)
			q := tr.Quota("team-a", "")
			got := want{used: q.Used.Memory, node: tr.Node("n1"), onGPU: tr.PodsOnGPU("n1", "g0"), limit: q.Limits.Memory.Value, limited: q.Limits.Memory.Set}
			if got.onGPU == nil {
				got.onGPU = []string{}
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestTrackerSelf checks that a pod does not count against its own quota.
func TestTrackerSelf(t *testing.T) {
	t.Parallel()
	tr := New(Options{})
	tr.Observe(placed("a", "g0,NVIDIA,3000,10:;"))
	tr.Observe(placed("b", "g0,NVIDIA,1000,10:;"))
	if got := tr.Quota("team-a", "team-a/a").Used.Memory; got != 1000 {
		t.Errorf("used without a = %d, want 1000", got)
	}
	if got := tr.Quota("team-b", "team-a/a").Used.Memory; got != 0 {
		t.Errorf("used of team-b = %d", got)
	}
}

// TestTrackerConcurrent assumes and observes from many goroutines (run with -race) and checks
// that the totals come back to nothing.
func TestTrackerConcurrent(t *testing.T) {
	t.Parallel()
	tr := New(Options{})
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			p := placed(fmt.Sprint("p", i), "g0,NVIDIA,100,1:;")
			undo := tr.Assume(p, "n1", allocation.PodDevices{{{UUID: "g0", Type: "NVIDIA", Usedmem: 100, Usedcores: 1}}})
			if i%2 == 0 {
				undo()
				return
			}
			tr.Observe(p)
			_ = tr.Quota("team-a", "")
			tr.Delete(Key(p.Namespace, p.Name))
		})
	}
	wg.Wait()
	if q, pods := tr.NamespaceUsage("team-a"); q != (allocation.QuotaAmount{}) || len(pods) != 0 || tr.Len() != 0 || len(tr.Node("n1")) != 0 {
		t.Errorf("left: %+v %v, %d pods, node %v", q, pods, tr.Len(), tr.Node("n1"))
	}
}
