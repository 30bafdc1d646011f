package register_test

import (
	"encoding/json"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/register"
)

// TestSetDevicesAndScores: the score annotation goes in the same merge patch as the register
// annotation, ordered as the written devices; an edit of it alone is healed; SetDevices then
// leaves it as it is.
func TestSetDevicesAndScores(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		cs := newClientset(newNode(map[string]string{"other": "1"}))
		clk := testingclock.NewFakeClock(time.Unix(0, 0))
		devs := gpus(2)
		w, err := register.New(cs, "gpu-1", register.Options{Clock: clk, EventRecorder: &record.FakeRecorder{}})
		if err != nil {
			t.Fatal(err)
		}
		scores := []annotation.PairScore{ // in reverse device order: written in device order
			{UUID: devs[1].ID, Scores: map[string]int{devs[0].ID: 420}},
			{UUID: devs[0].ID, Scores: map[string]int{devs[1].ID: 420}},
		}
		wantScores := annotation.EncodePairScores([]annotation.PairScore{scores[1], scores[0]})
		w.SetDevicesAndScores(shuffled(devs), scores)
		startRun(ctx, t, w)
		settled(t, "the first write", func() bool { return w.Stats().Writes == 1 && w.InSync() })

		var bodies []map[string]map[string]map[string]string
		for _, a := range cs.Actions() {
			if p, ok := a.(k8stesting.PatchAction); ok {
				var b map[string]map[string]map[string]string
				if err := json.Unmarshal(p.GetPatch(), &b); err != nil {
					t.Fatal(err)
				}
				bodies = append(bodies, b)
			}
		}
		wantBody := map[string]map[string]map[string]string{"metadata": {"annotations": {
			annotation.KeyNVIDIARegister: want(devs), annotation.KeyNVIDIAScore: wantScores}}}
		if len(bodies) != 1 {
			t.Fatalf("%d patches, want 1", len(bodies))
		}
		if d := cmp.Diff(wantBody, bodies[0]); d != "" {
			t.Errorf("patch body (-want +got):\n%s", d)
		}

		setAnnotations(t, cs, map[string]string{"other": "1", annotation.KeyNVIDIARegister: want(devs), annotation.KeyNVIDIAScore: "[]"})
		settled(t, "the edited scores to be restored", func() bool {
			v, _ := nodeAnnotation(t, cs, annotation.KeyNVIDIAScore)
			return v == wantScores && w.Stats().Heals == 1
		})

		w.SetDevices(devs) // scoring off (or failed): the register annotation alone
		synctest.Wait()
		before := w.Stats().Writes
		setAnnotations(t, cs, map[string]string{"other": "1", annotation.KeyNVIDIARegister: want(devs), annotation.KeyNVIDIAScore: "[]"})
		synctest.Wait()
		if v, _ := nodeAnnotation(t, cs, annotation.KeyNVIDIAScore); v != "[]" || w.Stats().Writes != before || !w.InSync() {
			t.Errorf("score %q, writes %d→%d, in sync %v: SetDevices must leave the score annotation alone", v, before, w.Stats().Writes, w.InSync())
		}
	})
}
