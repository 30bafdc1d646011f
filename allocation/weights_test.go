package allocation

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/internal/vectors"
)

func TestParseScoringWeights(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		value string
		want  ScoringWeights
		err   string // the reason, after HAMi's prefix
	}{
		{value: "slot=1,core=1,memory=3", want: ScoringWeights{1, 1, 3}},
		{value: " slot = 2 ,\tcore=0, memory =\t5 ", want: ScoringWeights{2, 0, 5}},
		{value: "memory=+7,slot=0,core=0", want: ScoringWeights{0, 0, 7}},
		{value: "slot=9223372036854775807,core=0,memory=0", want: ScoringWeights{Slot: 1<<63 - 1}},
		{value: "", err: "expected slot, core, and memory weights"},
		{value: "slot=1,core=1", err: "expected slot, core, and memory weights"},
		{value: "slot=1,core=1,memory=1,", err: "expected slot, core, and memory weights"},
		{value: "slot=1,core,memory=1", err: "expected key=value entries"},
		{value: "slot=1,slot=x,memory=1", err: `duplicate "slot" weight`},
		{value: " slot=1,slot =2,memory=1", err: `duplicate "slot" weight`},
		{value: "slot=1,core=1.5,memory=1", err: `"core" weight must be an integer`},
		{value: "slot=1,core=1,memory=1=2", err: `"memory" weight must be an integer`},
		{value: "slot=9223372036854775808,core=1,memory=1", err: `"slot" weight must be an integer`},
		{value: "slot=,core=1,memory=1", err: `"slot" weight must be an integer`},
		{value: "slot=-1,core=1,memory=1", err: `"slot" weight must not be negative`},
		{value: "foo=-1,core=1,memory=1", err: `"foo" weight must not be negative`}, // value checks before the key
		{value: "slot=1,core=1,mem=3", err: `unknown weight "mem"`},
		{value: "=1,core=1,memory=1", err: `unknown weight ""`},
		{value: "Slot=1,core=1,memory=1", err: `unknown weight "Slot"`},
		{value: "slot=0,core=0,memory=0", err: "at least one weight must be positive"},
	} {
		got, err := ParseScoringWeights(tc.value)
		if tc.err == "" {
			if err != nil || got != tc.want {
				t.Errorf("ParseScoringWeights(%q) = %+v, %v; want %+v", tc.value, got, err, tc.want)
			}
			continue
		}
		want := fmt.Sprintf("invalid hami.io/device-scoring-weights annotation %q: %s", tc.value, tc.err)
		var we *ScoringWeightsError
		if err == nil || err.Error() != want || !errors.Is(err, ErrInvalidScoringWeights) || !errors.As(err, &we) || we.Value != tc.value {
			t.Errorf("ParseScoringWeights(%q) = %+v, %v; want error %q", tc.value, got, err, want)
		}
	}
}

func TestPodScoringWeights(t *testing.T) {
	t.Parallel()
	bad := map[string]string{KeyDeviceScoringWeights: ""}
	if w, err := PodScoringWeights(nil, VersionMaster); err != nil || w != DefaultScoringWeights {
		t.Errorf("no annotations: %+v, %v", w, err)
	}
	if _, err := PodScoringWeights(bad, VersionMaster); !errors.Is(err, ErrInvalidScoringWeights) {
		t.Errorf("present but empty: %v, want an error", err)
	}
	if w, err := PodScoringWeights(bad, VersionV290); err != nil || w != DefaultScoringWeights {
		t.Errorf("v2.9.0 ignores the annotation: %+v, %v", w, err)
	}
}

// TestConformanceScoringWeightsParse checks want_parse of scoring-weights.json (v2.10.0) with
// PodScoringWeights on the vector's pod annotations; v2.9.0's vectors have none and the SDK
// must ignore the annotation there.
func TestConformanceScoringWeightsParse(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		var f struct {
			Vectors []struct {
				Name  string `json:"name"`
				Input struct {
					Pod struct {
						Annotations map[string]string `json:"annotations"`
					} `json:"pod"`
				} `json:"input"`
				WantParse *struct {
					Weights *struct{ Slot, Core, Memory int64 } `json:"weights"`
					Error   string                              `json:"error"`
				} `json:"want_parse"`
			} `json:"vectors"`
		}
		if !folder.Read(t, "scoring-weights.json", &f) {
			continue
		}
		version := vectors.Pick(folder, VersionMaster, VersionV290)
		t.Logf("checked %d vectors from %s", len(f.Vectors), folder.Dir)
		for _, v := range f.Vectors {
			got, err := PodScoringWeights(v.Input.Pod.Annotations, version)
			switch {
			case v.WantParse == nil:
				if version == VersionMaster {
					t.Errorf("%s: v2.10.0 vector without want_parse", v.Name)
				}
				if err != nil || got != DefaultScoringWeights {
					t.Errorf("%s/%s: %+v, %v; v2.9.0 ignores the annotation", folder.Name(), v.Name, got, err)
				}
			case v.WantParse.Error != "":
				if err == nil || err.Error() != v.WantParse.Error {
					t.Errorf("%s: %+v, %v; HAMi %q", v.Name, got, err, v.WantParse.Error)
				}
			default:
				want := ScoringWeights(*v.WantParse.Weights)
				if err != nil || got != want {
					t.Errorf("%s: %+v, %v; HAMi %+v", v.Name, got, err, want)
				}
			}
		}
	}
}

// a10 is an NVIDIA A10 as scoring-weights.json describes it, with usage.
func a10(id string, used, usedmem, usedcores int64) DeviceUsage {
	return DeviceUsage{Device: annotation.Device{ID: id, Count: 10, Devmem: 23028, Devcore: 100, Type: "NVIDIA A10", Mode: "hami-core", Health: true},
		Usage: Usage{Used: used, Usedmem: usedmem, Usedcores: usedcores}}
}

// TestDeviceScore checks the float32 score against the values HAMi printed (%f) in
// scoring-weights.json.
func TestDeviceScore(t *testing.T) {
	t.Parallel()
	gpu0, gpu1 := a10("g0", 6, 1200, 0), a10("g1", 1, 11000, 0)
	for _, tc := range []struct {
		w    ScoringWeights
		d    DeviceUsage
		want string
	}{
		{DefaultScoringWeights, gpu0, "6.521105"},
		{DefaultScoringWeights, gpu1, "5.776793"},
		{ScoringWeights{1, 1, 10}, gpu0, "11.211047"},
		{ScoringWeights{1, 1, 10}, gpu1, "48.767933"},
		{DefaultScoringWeights, a10("g", 1, 2000, 50), "6.868508"},
		{ScoringWeights{5, 1, 1}, a10("g", 1, 2000, 50), "10.868507"},
		{ScoringWeights{5, 1, 1}, a10("g", 3, 2000, 0), "15.868507"},
		{DefaultScoringWeights, DeviceUsage{Usage: Usage{Used: 3}}, "0.000000"}, // no totals
	} {
		if got := fmt.Sprintf("%f", tc.w.DeviceScore(tc.d)); got != tc.want {
			t.Errorf("%+v.DeviceScore(%+v) = %s, HAMi %s", tc.w, tc.d.Usage, got, tc.want)
		}
	}
}

// TestFitScoringWeights checks that the weights order the GPUs (spread takes the lowest score)
// with v2.10.0 only, and the fallback rule: a pod whose greedy fit fails in the weighted order
// fits in the default order.
func TestFitScoringWeights(t *testing.T) {
	t.Parallel()
	devices := []DeviceUsage{a10("g0", 6, 1200, 0), a10("g1", 1, 11000, 0)}
	heavy := map[string]string{KeyDeviceScoringWeights: "slot=1,core=1,memory=10"}
	one := PodRequest{Containers: []Request{{Count: 1, Type: annotation.VendorNVIDIA, Memory: 8000, MemoryPercentage: PercentageUnset}}}
	for _, tc := range []struct {
		v    Version
		pod  map[string]string
		want string
	}{
		{VersionMaster, nil, "g1"},
		{VersionMaster, heavy, "g0"},
		{VersionV290, heavy, "g1"},
	} {
		pd, reason, ok := Fit(devices, one, tc.pod, nil, Config{Version: tc.v, GPUSchedulerPolicy: PolicySpread})
		if !ok || pd[0][0].UUID != tc.want {
			t.Errorf("%v %v: %v %q %v, want %s", tc.v, tc.pod, pd, reason, ok, tc.want)
		}
	}
	// c0 in the weighted order takes g0 and leaves no GPU with 20000 MiB for c1; in the
	// default order c0 takes g1 and c1 fits on g0.
	two := PodRequest{Containers: []Request{one.Containers[0], {Count: 1, Type: annotation.VendorNVIDIA, Memory: 20000, MemoryPercentage: PercentageUnset}}}
	c := Config{Version: VersionMaster, GPUSchedulerPolicy: PolicySpread}
	want, _, ok := Fit(devices, two, nil, nil, c)
	if !ok {
		t.Fatal("the default order does not fit")
	}
	got, reason, ok := Fit(devices, two, heavy, nil, c)
	if !ok {
		t.Fatalf("weights made a placeable pod unfit: %s", reason)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("fallback (-default order +got):\n%s", diff)
	}
	// NUMA binding: in the weighted order the walk alternates NUMA nodes and no two GPUs of one
	// NUMA node come together; the default order puts the two idlest (NUMA 0) last.
	gpu := func(id string, numa int, used, mem int64) DeviceUsage {
		return DeviceUsage{Device: annotation.Device{ID: id, Count: 10, Devmem: 10000, Devcore: 100, Type: "NVIDIA A10", Numa: numa, Mode: "hami-core", Health: true},
			Usage: Usage{Used: used, Usedmem: mem}}
	}
	numa := []DeviceUsage{gpu("a", 0, 0, 3000), gpu("b", 0, 0, 1000), gpu("c", 1, 8, 2000), gpu("d", 1, 9, 0)}
	bound := map[string]string{KeyNUMABind: "true", KeyDeviceScoringWeights: "slot=1,core=1,memory=10"}
	pair := PodRequest{Containers: []Request{{Count: 2, Type: annotation.VendorNVIDIA, Memory: 100, MemoryPercentage: PercentageUnset}}}
	if pd, reason, ok := Fit(numa, pair, bound, nil, c); !ok || pd[0][0].UUID != "b" || pd[0][1].UUID != "a" {
		t.Errorf("NUMA-bound pair: %v %q %v, want b and a (the default order)", pd, reason, ok)
	}
	// Both orders fail: the weighted order's reason (HAMi's) stands.
	three := PodRequest{Containers: append(two.Containers, two.Containers[1])}
	if _, reason, ok := Fit(devices, three, heavy, nil, c); ok || !strings.Contains(reason, ReasonCardInsufficientMemory) {
		t.Errorf("three containers: %q %v, want a CardInsufficientMemory failure", reason, ok)
	}
}

// FuzzParseScoringWeights checks that parsing never panics, that every error is
// ErrInvalidScoringWeights with HAMi's prefix, and that what parses formats back to the same
// weights.
func FuzzParseScoringWeights(f *testing.F) {
	for _, s := range []string{"slot=1,core=1,memory=3", " slot = 2 ,\tcore=0, memory =\t5 ", "", "abc", "slot=1,slot=2,memory=1",
		"=1,core=1,memory=1", "slot=+1,core=-0,memory=0", "slot=1,core=1,memory=1=2", ",,", "a=1,b=2,c=3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		w, err := ParseScoringWeights(value)
		if err != nil {
			prefix := fmt.Sprintf("invalid hami.io/device-scoring-weights annotation %q: ", value)
			if !errors.Is(err, ErrInvalidScoringWeights) || !strings.HasPrefix(err.Error(), prefix) || w != (ScoringWeights{}) {
				t.Fatalf("%q: %+v, %v", value, w, err)
			}
			return
		}
		if w.Slot < 0 || w.Core < 0 || w.Memory < 0 || w == (ScoringWeights{}) {
			t.Fatalf("%q: invalid weights %+v accepted", value, w)
		}
		again, err := ParseScoringWeights(fmt.Sprintf("memory=%d,core=%d,slot=%d", w.Memory, w.Core, w.Slot))
		if err != nil || again != w {
			t.Fatalf("%q: %+v does not round-trip: %+v, %v", value, w, again, err)
		}
		_ = w.DeviceScore(a10("g", 3, 100, 5))
	})
}
