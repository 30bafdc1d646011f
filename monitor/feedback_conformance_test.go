package monitor

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/hamicore/region"
	"github.com/hamireg/hamireg/internal/vectors"
)

type fbVectorFile struct {
	Vectors      []fbVector      `json:"vectors"`
	CheckVectors []fbCheckVector `json:"check_vectors"`
}

type fbVector struct {
	Name  string `json:"name"`
	Input struct {
		Containers []struct {
			Dir    string                `json:"dir"`
			Bytes  *vectors.FileBytes    `json:"bytes"`
			Region *vectors.RegionFields `json:"region"`
		} `json:"containers"`
		Pods []struct {
			Name       string   `json:"name"`
			Namespace  string   `json:"namespace"`
			UID        string   `json:"uid"`
			NodeName   string   `json:"node_name"`
			Containers []string `json:"containers"`
		} `json:"pods"`
	} `json:"input"`
	WantAdopted []string `json:"want_adopted"`
	Ticks       []fbTick `json:"ticks"`
}

type fbTick struct {
	Tick       int                          `json:"tick"`
	Before     []map[string]json.RawMessage `json:"hami_core_writes_before"`
	WantWrites []struct {
		Dir    string `json:"dir"`
		Field  string `json:"field"`
		Offset int64  `json:"offset"`
		From   int32  `json:"from"`
		To     int32  `json:"to"`
	} `json:"want_writes"`
	WantState map[string]struct {
		Priority          int32 `json:"priority"`
		RecentKernel      int32 `json:"recent_kernel"`
		UtilizationSwitch int32 `json:"utilization_switch"`
	} `json:"want_state"`
	WantPanic      json.RawMessage `json:"want_panic"`
	WantPanicOneOf json.RawMessage `json:"want_panic_one_of"`
}

type fbCheckVector struct {
	Name  string `json:"name"`
	Input struct {
		ContainerGPUs []string         `json:"container_gpus"`
		Counts        map[string][]int `json:"counts"`
		Priority      int32            `json:"priority"`
	} `json:"input"`
	WantBlocking json.RawMessage `json:"want_check_blocking"`
	WantPriority json.RawMessage `json:"want_check_priority"`
}

var fieldsByName = map[string]region.Field{
	"proc_num":           region.FieldProcNum,
	"utilization_switch": region.FieldUtilizationSwitch,
	"recent_kernel":      region.FieldRecentKernel,
	"priority":           region.FieldPriority,
}

// TestConformanceFeedback runs the rounds of monitor-feedback.json: each tick applies
// HAMi-core's writes into the region files, reads every adopted region fresh, runs one
// round and compares every changed 4-byte word and the feedback words after it.
//
// The SDK's rule, asserted on every tick of both versions: the round writes what HAMi
// v2.10.0's Observe writes for the regions as read (masterModel, an independent dense
// rendering of the rule), only recent_kernel and utilization_switch, and never panics.
// Master's vectors must equal it. v2.9.0's vectors equal it except where v2.9.0's own rule
// (v290Model: a two-entry table that panics on priority >= 2 or < 0, CheckBlocking stopping
// at the first GPU) gives another outcome: there the vector must be what v290Model gives for
// the same input, and the SDK keeps the rule (from that tick on the files follow the SDK).
// Each vector runs twice: priorities from the regions (HAMi) and from pod specs whose
// nvidia.com/priority limits agree with the regions (Options.PrioritySource PriorityPodSpec).
func TestConformanceFeedback(t *testing.T) {
	for _, folder := range vectors.Folders(t) {
		var file fbVectorFile
		if !folder.Read(t, "monitor-feedback.json", &file) {
			continue
		}
		for _, v := range file.Vectors {
			for _, source := range []PrioritySource{PriorityRegion, PriorityPodSpec} {
				t.Run(fmt.Sprintf("%s/%s/source=%d", folder.Name(), v.Name, source), func(t *testing.T) {
					t.Parallel()
					runFeedbackVector(t, folder, v, source)
				})
			}
		}
		for _, v := range file.CheckVectors {
			t.Run(folder.Name()+"/check/"+v.Name, func(t *testing.T) {
				t.Parallel()
				runCheckVector(t, folder, v)
			})
		}
		t.Logf("checked %d vectors from %s (monitor-feedback.json: %d rounds, %d check vectors)",
			len(file.Vectors)+len(file.CheckVectors), folder.Dir, len(file.Vectors), len(file.CheckVectors))
	}
}

func runFeedbackVector(t *testing.T, folder vectors.Folder, v fbVector, source PrioritySource) {
	t.Helper()
	node := newFBNode(t)
	prioOf := map[string]int64{}
	for _, c := range v.Input.Containers {
		if c.Bytes == nil {
			t.Fatalf("container %s has no bytes", c.Dir)
		}
		raw, err := c.Bytes.Bytes()
		if err != nil {
			t.Fatal(err)
		}
		node.put(t, c.Dir, raw)
		if c.Region != nil {
			prioOf[c.Dir] = int64(c.Region.Priority)
		}
	}
	var pods []*corev1.Pod
	for _, p := range v.Input.Pods {
		if p.NodeName != "" && p.NodeName != "node1" {
			continue
		}
		pod := fbPod(p.UID, p.Name, nil, nil)
		pod.Namespace = p.Namespace
		for _, name := range p.Containers {
			ctr := corev1.Container{Name: name}
			if pr, ok := prioOf[p.UID+"_"+name]; ok && source == PriorityPodSpec {
				ctr.Resources.Limits = corev1.ResourceList{"nvidia.com/priority": *resourceInt(pr)}
			}
			pod.Spec.Containers = append(pod.Spec.Containers, ctr)
		}
		pods = append(pods, pod)
	}
	version := vectors.Pick(folder, annotation.VersionMaster, annotation.VersionV290)
	m := newFBMonitor(t, node.root, pods, Options{Version: version, PrioritySource: source})
	_, ctx := ktesting.NewTestContext(t)

	adopted := v.WantAdopted
	if adopted != nil {
		slices.Sort(adopted)
	}
	diverged := false
	for _, tk := range v.Ticks {
		for _, w := range tk.Before {
			var dir string
			if err := json.Unmarshal(w["dir"], &dir); err != nil {
				t.Fatalf("tick %d: hami_core_writes_before dir: %v", tk.Tick, err)
			}
			for k, raw := range w {
				if k == "dir" {
					continue
				}
				f, ok := fieldsByName[k]
				if !ok {
					t.Fatalf("tick %d: unknown field %q in hami_core_writes_before", tk.Tick, k)
				}
				var val int32
				if err := json.Unmarshal(raw, &val); err != nil {
					t.Fatal(err)
				}
				node.setField(t, dir, f, val)
			}
		}

		cs := node.containers(t, adopted, pods)
		models := make([]modelCtr, 0, len(cs))
		for i := range cs {
			if cs[i].Region != nil {
				p := cs[i].Region.Priority
				if source == PriorityPodSpec {
					if sp, ok := m.specPriorities(ctx).of(&cs[i]); ok {
						p = sp
					}
				}
				models = append(models, modelOf(&cs[i], p))
			}
		}
		rule := masterModel(models)
		v290Writes, v290Panics := v290Model(models)

		before := node.snapshot(t)
		m.feedback(ctx, cs)
		got := diff(before, node.snapshot(t))

		checkOnlyFeedbackWords(t, tk.Tick, cs, got)
		if d := cmp.Diff(rule, got, cmpopts.EquateEmpty()); d != "" {
			t.Errorf("tick %d: the round differs from HAMi v2.10.0's rule for the regions as read (-rule +got):\n%s", tk.Tick, d)
		}

		hamiPanicked := len(tk.WantPanic) > 0 || len(tk.WantPanicOneOf) > 0
		want := make([]fbWrite, 0, len(tk.WantWrites))
		for _, w := range tk.WantWrites {
			want = append(want, fbWrite{Dir: w.Dir, Offset: w.Offset, From: w.From, To: w.To})
			checkFieldName(t, tk.Tick, cs, w.Dir, w.Field, w.Offset)
		}
		sortWrites(want)
		if !folder.V290 {
			if hamiPanicked {
				t.Errorf("tick %d: HAMi v2.10.0 panicked (%s%s): its rule never panics", tk.Tick, tk.WantPanic, tk.WantPanicOneOf)
			}
			if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("tick %d: writes differ from HAMi's (-want +got):\n%s", tk.Tick, d)
			}
			checkState(t, node, tk)
			continue
		}
		if diverged {
			continue // the files follow the SDK's rule since v2.9.0 departed from it
		}
		if !hamiPanicked && cmp.Equal(want, rule, cmpopts.EquateEmpty()) {
			if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("tick %d: writes differ from HAMi's (-want +got):\n%s", tk.Tick, d)
			}
			checkState(t, node, tk)
			continue
		}
		// HAMi v2.9.0 departs from the rule: its own rule must explain the vector.
		diverged = true
		if v290Panics != hamiPanicked {
			t.Errorf("tick %d: v2.9.0's rule panics=%v, the vector %v (%s%s)", tk.Tick, v290Panics, hamiPanicked, tk.WantPanic, tk.WantPanicOneOf)
		}
		if !hamiPanicked {
			if d := cmp.Diff(want, v290Writes, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("tick %d: v2.9.0's rule does not give the vector's writes (-want +v2.9.0 rule):\n%s", tk.Tick, d)
			}
		}
		t.Logf("tick %d: HAMi v2.9.0 departs from the SDK's rule here (panic=%v); the SDK's rule was asserted", tk.Tick, hamiPanicked)
	}
}

// checkOnlyFeedbackWords asserts that a round wrote nothing but recent_kernel and
// utilization_switch.
func checkOnlyFeedbackWords(t *testing.T, tick int, cs []Container, got []fbWrite) {
	t.Helper()
	for _, w := range got {
		var layout region.Layout
		for i := range cs {
			if cs[i].Key == w.Dir && cs[i].Region != nil {
				layout = cs[i].Region.Layout
			}
		}
		rk, _ := layout.Offset(region.FieldRecentKernel)
		sw, _ := layout.Offset(region.FieldUtilizationSwitch)
		if w.Offset != rk && w.Offset != sw {
			t.Errorf("tick %d: %s: word at %d written (%d -> %d), only recent_kernel (%d) and utilization_switch (%d) may be",
				tick, w.Dir, w.Offset, w.From, w.To, rk, sw)
		}
	}
}

// checkFieldName asserts that HAMi's name of a written word is the SDK's layout's.
func checkFieldName(t *testing.T, tick int, cs []Container, dir, field string, offset int64) {
	t.Helper()
	f, ok := fieldsByName[field]
	if !ok {
		t.Errorf("tick %d: HAMi wrote unknown field %q", tick, field)
		return
	}
	for i := range cs {
		if cs[i].Key == dir && cs[i].Region != nil {
			if off, _ := cs[i].Region.Layout.Offset(f); off != offset {
				t.Errorf("tick %d: %s: HAMi wrote %s at %d, the %v layout has it at %d", tick, dir, field, offset, cs[i].Region.Layout, off)
			}
		}
	}
}

func checkState(t *testing.T, node *fbNode, tk fbTick) {
	t.Helper()
	for dir, want := range tk.WantState {
		r, err := region.ReadFile(node.path(dir))
		if err != nil {
			t.Errorf("tick %d: %s: %v", tk.Tick, dir, err)
			continue
		}
		if r.Priority != want.Priority || r.RecentKernel != want.RecentKernel || r.UtilizationSwitch != want.UtilizationSwitch {
			t.Errorf("tick %d: %s: priority/recent_kernel/switch %d/%d/%d, want %d/%d/%d", tk.Tick, dir,
				r.Priority, r.RecentKernel, r.UtilizationSwitch, want.Priority, want.RecentKernel, want.UtilizationSwitch)
		}
	}
}

// rawKey is the 96-byte field HAMi-core writes for uuid.
func rawKey(uuid string) gpuKey {
	var k gpuKey
	copy(k[:], uuid)
	return k
}

// checkWant is a check vector's outcome: a bool or {"panic": ...}.
type checkWant struct {
	result, panicked bool
}

func parseCheckWant(t *testing.T, raw json.RawMessage) checkWant {
	t.Helper()
	var b bool
	if err := json.Unmarshal(raw, &b); err == nil {
		return checkWant{result: b}
	}
	var p struct {
		Panic string `json:"panic"`
	}
	if err := json.Unmarshal(raw, &p); err != nil || p.Panic == "" {
		t.Fatalf("outcome %s is neither a bool nor a panic", raw)
	}
	return checkWant{panicked: true}
}

// runCheckVector asserts checkBlocking and checkPriority on a check vector: HAMi v2.10.0's
// rule (denseBlocking/densePriority on HAMi's table) for every vector; v2.9.0's outcome where
// it agrees, else v2.9.0's own rule must explain the vector.
func runCheckVector(t *testing.T, folder vectors.Folder, v fbCheckVector) {
	t.Helper()
	sparse, dense := priorityCounts{}, denseCounts{}
	for uuid, levels := range v.Input.Counts {
		k := rawKey(uuid)
		dense[k] = levels
		sparse[k] = map[int32]int{}
		for p, n := range levels {
			sparse[k][int32(p)] = n
		}
	}
	gpus := make([]gpuKey, 0, len(v.Input.ContainerGPUs))
	for _, g := range v.Input.ContainerGPUs {
		gpus = append(gpus, rawKey(g))
	}
	p := v.Input.Priority
	for _, c := range []struct {
		name string
		sdk  bool
		rule bool
		v290 func() (bool, bool)
		raw  json.RawMessage
	}{
		{"CheckBlocking", checkBlocking(sparse, p, gpus), denseBlocking(dense, p, gpus),
			func() (bool, bool) { return v290Blocking(dense, p, gpus) }, v.WantBlocking},
		{"CheckPriority", checkPriority(sparse, p, gpus), densePriority(dense, p, gpus),
			func() (bool, bool) { return v290Priority(dense, p, gpus) }, v.WantPriority},
	} {
		want := parseCheckWant(t, c.raw)
		if c.sdk != c.rule {
			t.Errorf("%s = %v, HAMi v2.10.0's rule gives %v", c.name, c.sdk, c.rule)
		}
		if !folder.V290 || !want.panicked && want.result == c.rule {
			if want.panicked || want.result != c.sdk {
				t.Errorf("%s = %v, HAMi %s gives %s", c.name, c.sdk, folder.Name(), c.raw)
			}
			continue
		}
		if r, panicked := c.v290(); panicked != want.panicked || !panicked && r != want.result {
			t.Errorf("%s: v2.9.0's rule gives %v (panic %v), the vector %s", c.name, r, panicked, c.raw)
		}
		t.Logf("%s: HAMi v2.9.0 gives %s, the SDK keeps the rule (%v)", c.name, c.raw, c.sdk)
	}
}
