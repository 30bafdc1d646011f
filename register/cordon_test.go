package register_test

import (
	"encoding/json"
	"maps"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/register"
)

// cordonOf reads the two cordon annotations through get ("-" when absent).
func cordonOf(get func(string) (string, bool)) (cordon, recorded string) {
	v := func(k string) string {
		s, ok := get(k)
		if !ok {
			return "-"
		}
		return s
	}
	return v(allocation.KeyDeviceCordon), v(register.CordonKey)
}

// TestSyncCordon: what one Sync writes to hami.io/device-cordon and CordonKey for the Node's
// annotations and the UUIDs given to SetCordon; "-" is an absent annotation.
func TestSyncCordon(t *testing.T) {
	t.Parallel()
	devs := gpus(2)
	for name, tc := range map[string]struct {
		cordon, recorded string // on the Node before; "-": absent
		set              []string
		wantCordon       string
		wantRecorded     string
		wantWrite        bool
	}{
		"fresh node":                       {cordon: "-", recorded: "-", set: []string{"GPU-b", " GPU-a ", "GPU-b", ""}, wantCordon: "GPU-a,GPU-b", wantRecorded: "GPU-a,GPU-b", wantWrite: true},
		"operator's entries first":         {cordon: "GPU-z, GPU-op", recorded: "-", set: []string{"GPU-a"}, wantCordon: "GPU-z,GPU-op,GPU-a", wantRecorded: "GPU-a", wantWrite: true},
		"already in place":                 {cordon: "GPU-op,GPU-a", recorded: "GPU-a", set: []string{"GPU-a"}, wantCordon: "GPU-op,GPU-a", wantRecorded: "GPU-a"},
		"operator's entry after ours":      {cordon: "GPU-a,GPU-op", recorded: "GPU-a", set: []string{"GPU-a"}, wantCordon: "GPU-a,GPU-op", wantRecorded: "GPU-a"},
		"in place with spaces":             {cordon: " GPU-op , GPU-a", recorded: "GPU-a", set: []string{"GPU-a"}, wantCordon: " GPU-op , GPU-a", wantRecorded: "GPU-a"},
		"writer's entry removed":           {cordon: "GPU-op", recorded: "GPU-a", set: []string{"GPU-a"}, wantCordon: "GPU-op,GPU-a", wantRecorded: "GPU-a", wantWrite: true},
		"record removed":                   {cordon: "GPU-a", recorded: "-", set: []string{"GPU-a"}, wantCordon: "GPU-a", wantRecorded: "GPU-a", wantWrite: true},
		"old entries replaced":             {cordon: "GPU-op,GPU-a,GPU-b", recorded: "GPU-a,GPU-b", set: []string{"GPU-c"}, wantCordon: "GPU-op,GPU-c", wantRecorded: "GPU-c", wantWrite: true},
		"nil keeps the operator's":         {cordon: "GPU-op,GPU-a", recorded: "GPU-a", set: nil, wantCordon: "GPU-op", wantRecorded: "-", wantWrite: true},
		"nil removes both when only ours":  {cordon: "GPU-a", recorded: "GPU-a", set: nil, wantCordon: "-", wantRecorded: "-", wantWrite: true},
		"nil on a node without ours":       {cordon: "GPU-op", recorded: "-", set: nil, wantCordon: "GPU-op", wantRecorded: "-"},
		"shared UUID counts as the writer": {cordon: "GPU-a", recorded: "-", set: []string{"GPU-a", "GPU-b"}, wantCordon: "GPU-a,GPU-b", wantRecorded: "GPU-a,GPU-b", wantWrite: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			ann := map[string]string{annotation.KeyNVIDIARegister: want(devs), "other": "1"}
			if tc.cordon != "-" {
				ann[allocation.KeyDeviceCordon] = tc.cordon
			}
			if tc.recorded != "-" {
				ann[register.CordonKey] = tc.recorded
			}
			cs := newClientset(newNode(ann))
			w, err := newWriter(cs, devs, register.Options{EventRecorder: &record.FakeRecorder{}})
			if err != nil {
				t.Fatal(err)
			}
			w.SetCordon(tc.set)
			if err := w.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			if !w.InSync() {
				t.Error("not in sync after Sync")
			}
			if got := count(cs, "patch") == 1; got != tc.wantWrite {
				t.Errorf("patched %v, want %v", got, tc.wantWrite)
			}
			cordon, recorded := cordonOf(func(k string) (string, bool) { return nodeAnnotation(t, cs, k) })
			if cordon != tc.wantCordon || recorded != tc.wantRecorded {
				t.Errorf("cordon %q, recorded %q; want %q, %q", cordon, recorded, tc.wantCordon, tc.wantRecorded)
			}
			if v, _ := nodeAnnotation(t, cs, "other"); v != "1" {
				t.Errorf("other annotation %q, want it untouched", v)
			}
			// A second sync finds everything in place.
			if err := w.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			if n := count(cs, "patch"); n > 1 {
				t.Errorf("%d patches after a second sync, want at most 1", n)
			}
		})
	}
}

// TestRunCordon: the cordon goes in the register annotation's merge patch; an operator's
// additions are left alone (no write), a removed entry of the writer's is healed, an unchanged
// SetCordon writes nothing, and SetCordon(nil) takes the writer's entries out.
func TestRunCordon(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		cs := newClientset(newNode(map[string]string{allocation.KeyDeviceCordon: "GPU-op"}))
		clk := testingclock.NewFakeClock(time.Unix(0, 0))
		devs := gpus(3)
		w, err := register.New(cs, nodeName, register.Options{Clock: clk, EventRecorder: &record.FakeRecorder{}})
		if err != nil {
			t.Fatal(err)
		}
		mine := []string{devs[2].ID, devs[1].ID}
		wantMine := devs[1].ID + "," + devs[2].ID
		w.SetCordon(mine) // before SetDevices: nothing is written yet
		startRun(ctx, t, w)
		synctest.Wait()
		if n := count(cs, "patch"); n != 0 {
			t.Fatalf("%d patches before the first SetDevices, want 0", n)
		}
		w.SetDevices(devs)
		settled(t, "the first write", func() bool { return w.Stats().Writes == 1 && w.InSync() })

		var body map[string]map[string]map[string]any
		for _, a := range cs.Actions() {
			if p, ok := a.(k8stesting.PatchAction); ok {
				if err := json.Unmarshal(p.GetPatch(), &body); err != nil {
					t.Fatal(err)
				}
			}
		}
		wantBody := map[string]map[string]map[string]any{"metadata": {"annotations": {
			annotation.KeyNVIDIARegister: want(devs),
			allocation.KeyDeviceCordon:   "GPU-op," + wantMine,
			register.CordonKey:           wantMine,
		}}}
		if d := cmp.Diff(wantBody, body); d != "" {
			t.Errorf("patch body (-want +got):\n%s", d)
		}

		live := func() map[string]string {
			out := map[string]string{}
			for _, k := range []string{annotation.KeyNVIDIARegister, allocation.KeyDeviceCordon, register.CordonKey} {
				if v, ok := nodeAnnotation(t, cs, k); ok {
					out[k] = v
				}
			}
			return out
		}
		edit := func(f func(map[string]string)) {
			t.Helper()
			a := live()
			f(a)
			setAnnotations(t, cs, a)
		}

		// An operator cordons one more GPU: kept, no write.
		edit(func(a map[string]string) { a[allocation.KeyDeviceCordon] = "GPU-op," + wantMine + ",GPU-new" })
		synctest.Wait()
		if s := w.Stats(); s.Writes != 1 {
			t.Errorf("%d writes after an operator's addition, want 1", s.Writes)
		}

		// Someone removes the writer's entries: healed, the operator's kept.
		edit(func(a map[string]string) { a[allocation.KeyDeviceCordon] = "GPU-op,GPU-new" })
		settled(t, "the writer's entries to come back", func() bool {
			v, _ := nodeAnnotation(t, cs, allocation.KeyDeviceCordon)
			return v == "GPU-op,GPU-new,"+wantMine && w.Stats().Heals == 1
		})

		// Unchanged SetCordon: nothing sent.
		before := count(cs, "patch")
		w.SetCordon([]string{devs[1].ID, devs[2].ID, devs[1].ID})
		synctest.Wait()
		if n := count(cs, "patch"); n != before {
			t.Errorf("%d patches after an unchanged SetCordon, want %d", n-before, 0)
		}

		// SetCordon(nil): the writer's entries and its record go, the operator's stay.
		w.SetCordon(nil)
		settled(t, "the writer's entries to go", func() bool {
			a := live()
			_, rec := a[register.CordonKey]
			return a[allocation.KeyDeviceCordon] == "GPU-op,GPU-new" && !rec && w.InSync()
		})
		got := maps.Clone(live())
		if got[annotation.KeyNVIDIARegister] != want(devs) {
			t.Errorf("register annotation changed: %q", got[annotation.KeyNVIDIARegister])
		}
	})
}
