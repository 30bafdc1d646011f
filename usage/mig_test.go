package usage

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/mig"
)

func migPod(name, devices, reservation string) *corev1.Pod {
	p := placed(name, devices)
	if reservation != "" {
		p.Annotations[mig.KeyAllocations] = reservation
	}
	return p
}

const (
	oneG6 = `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"g0","profile":"1g.5gb","placement":{"start":6,"size":1}}]`
	oneG5 = `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"g0","profile":"1g.5gb","placement":{"start":5,"size":1}}]`
)

// TestTrackerMIG: the node's MIG placements follow the pods' reservations (observed,
// assumed, deleted), and a reservation that does not decode or apply is reported and leaves
// the pod's devices with unknown placements.
func TestTrackerMIG(t *testing.T) {
	t.Parallel()
	at := func(start uint32) mig.Placement { return mig.Placement{Start: start, Size: 1} }
	slot := func(start uint32) allocation.PodDevices {
		return allocation.PodDevices{{{UUID: "g0", Type: "NVIDIA", Usedmem: 4864, Usedcores: 15, MIG: allocation.MIGSlot{Profile: "1g.5gb", Placement: at(start)}}}}
	}
	tests := map[string]struct {
		steps      func(t *Tracker)
		want       map[string][]mig.Placement
		wantFailed int
	}{
		"observed": {steps: func(t *Tracker) {
			t.Observe(migPod("a", "g0,NVIDIA,4864,15:;", oneG6))
			t.Observe(migPod("b", "g0,NVIDIA,4864,15:;", oneG5))
		}, want: map[string][]mig.Placement{"g0": {at(6), at(5)}}},
		"deleted": {steps: func(t *Tracker) {
			t.Observe(migPod("a", "g0,NVIDIA,4864,15:;", oneG6))
			t.Observe(migPod("b", "g0,NVIDIA,4864,15:;", oneG5))
			t.Delete("team-a/a")
		}, want: map[string][]mig.Placement{"g0": {at(5)}}},
		"assumed": {steps: func(t *Tracker) { t.Assume(migPod("a", "", ""), "n1", slot(6)) }, want: map[string][]mig.Placement{"g0": {at(6)}}},
		"assumed, then informed: once": {steps: func(t *Tracker) {
			t.Assume(migPod("a", "", ""), "n1", slot(6))
			t.Observe(migPod("a", "g0,NVIDIA,4864,15:;", oneG6))
		}, want: map[string][]mig.Placement{"g0": {at(6)}}},
		"assumed, then undone": {steps: func(t *Tracker) { t.Assume(migPod("a", "", ""), "n1", slot(6))() }, want: map[string][]mig.Placement{}},
		"undecodable": {steps: func(t *Tracker) {
			t.Observe(migPod("a", "g0,NVIDIA,4864,15:;", `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"g0","profile":"1g.5gb","placement":{"start":6,"size":1},"migUUID":"MIG-x"}]`))
		}, want: map[string][]mig.Placement{}, wantFailed: 1},
		"names no device": {steps: func(t *Tracker) {
			t.Observe(migPod("a", "g0,NVIDIA,4864,15:;", `[{"containerIndex":1,"deviceIndex":0,"gpuUUID":"g0","profile":"1g.5gb","placement":{"start":6,"size":1}}]`))
		}, want: map[string][]mig.Placement{}, wantFailed: 1},
		"no reservation": {steps: func(t *Tracker) { t.Observe(migPod("a", "g0,NVIDIA,4864,15:;", "")) }, want: map[string][]mig.Placement{}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			failed := 0
			tr := New(Options{DecodeFailed: func(_ *corev1.Pod, err error) {
				if !errors.Is(err, mig.ErrMalformed) {
					t.Errorf("DecodeFailed(%v), want ErrMalformed", err)
				}
				failed++
			}})
			tt.steps(tr)
			if diff := cmp.Diff(tt.want, tr.MIG("n1")); diff != "" {
				t.Errorf("MIG (-want +got):\n%s", diff)
			}
			v := tr.Lock()
			view := v.MIG("n1")
			v.Unlock()
			if len(view) != len(tt.want) {
				t.Errorf("View.MIG = %v", view)
			}
			if failed != tt.wantFailed {
				t.Errorf("DecodeFailed called %d times, want %d", failed, tt.wantFailed)
			}
			if tt.wantFailed > 0 && tr.Node("n1")["g0"].Used != 1 {
				t.Errorf("the pod's devices must still count: %v", tr.Node("n1"))
			}
		})
	}
}

func TestChangedMIG(t *testing.T) {
	t.Parallel()
	tr := New(Options{})
	a := migPod("a", "g0,NVIDIA,4864,15:;", oneG6)
	b := a.DeepCopy()
	b.Annotations[mig.KeyAllocations] = oneG5
	if !tr.Changed(a, b) {
		t.Error("a changed reservation is not a change")
	}
	if tr.Changed(a, a.DeepCopy()) {
		t.Error("no change is a change")
	}
}
