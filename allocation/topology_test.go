package allocation

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/hamireg/hamireg/annotation"
)

func TestDevicePolicyHas(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		policy     Policy
		v290, mast bool
	}{
		"exact":          {policy: "topology-aware", v290: true, mast: true},
		"comma list":     {policy: "binpack,topology-aware", mast: true},
		"trimmed member": {policy: "topology-aware , mutex", mast: true},
		"prefix only":    {policy: "topology-aware-x"},
		"other":          {policy: "spread"},
		"empty":          {},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := devicePolicyHas(tc.policy, PolicyTopologyAware, VersionV290); got != tc.v290 {
				t.Errorf("v2.9.0: %v", got)
			}
			if got := devicePolicyHas(tc.policy, PolicyTopologyAware, VersionMaster); got != tc.mast {
				t.Errorf("master: %v", got)
			}
		})
	}
}

// TestTopologyPick covers the choice among candidates given in walk order.
func TestTopologyPick(t *testing.T) {
	t.Parallel()
	ids := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("g%d", i)
		}
		return out
	}
	// scores[i][j] is gi's score to gj.
	build := func(scores [][]int) ([]DeviceUsage, ContainerDevices) {
		var devs []DeviceUsage
		var cands ContainerDevices
		for i, row := range scores {
			m := map[string]int{}
			for j, s := range row {
				if i != j && s != 0 {
					m[fmt.Sprintf("g%d", j)] = s
				}
			}
			if len(m) == 0 {
				m = nil
			}
			devs = append(devs, DeviceUsage{Device: annotation.Device{ID: fmt.Sprintf("g%d", i)}, PairScores: m})
			cands = append(cands, ContainerDevice{UUID: fmt.Sprintf("g%d", i)})
		}
		return devs, cands
	}
	tests := map[string]struct {
		scores [][]int
		need   int
		want   []string
	}{
		"all candidates": {scores: [][]int{{0, 1}, {1, 0}}, need: 2, want: []string{"g0", "g1"}},
		"no scores, first of the walk (v2.9.0 fixed)": {scores: make([][]int, 4), need: 2, want: []string{"g0", "g1"}},
		"no scores, one gpu":                          {scores: make([][]int, 3), need: 1, want: []string{"g0"}},
		"worst connected single":                      {scores: [][]int{{0, 450, 20}, {450, 0, 20}, {20, 20, 0}}, need: 1, want: []string{"g2"}},
		"worst tie: first in walk order":              {scores: [][]int{{0, 10, 10}, {10, 0, 10}, {10, 10, 0}}, need: 1, want: []string{"g0"}},
		"best pair":                                   {scores: [][]int{{0, 20, 20, 20}, {20, 0, 20, 20}, {20, 20, 0, 450}, {20, 20, 450, 0}}, need: 2, want: []string{"g2", "g3"}},
		"best pair tie: first combination":            {scores: [][]int{{0, 450, 20, 20}, {450, 0, 20, 20}, {20, 20, 0, 450}, {20, 20, 450, 0}}, need: 2, want: []string{"g0", "g1"}},
		// Only the first GPU's map counts (HAMi): g1→g0 is 500 but g0→g1 is 0.
		"asymmetric: first map only":            {scores: [][]int{{0, 0, 30}, {500, 0, 0}, {0, 0, 0}}, need: 2, want: []string{"g0", "g2"}},
		"negative scores, master's first best":  {scores: [][]int{{0, -5, -5}, {-5, 0, -1}, {-5, -1, 0}}, need: 2, want: []string{"g1", "g2"}},
		"three of five, best triangle":          {scores: [][]int{{0, 1, 1, 1, 1}, {1, 0, 1, 1, 1}, {1, 1, 0, 9, 9}, {1, 1, 9, 0, 9}, {1, 1, 9, 9, 0}}, need: 3, want: []string{"g2", "g3", "g4"}},
		"eight choose four, nvlink quads":       {scores: quads(), need: 4, want: []string{"g0", "g1", "g2", "g3"}},
		"sixteen choose eight runs (C = 12870)": {scores: make([][]int, 16), need: 8, want: ids(8)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			devs, cands := build(tc.scores)
			var got []string
			for _, c := range topologyPick(devs, cands, tc.need) {
				got = append(got, c.UUID)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// quads is an 8-GPU node with two fully NVLinked quads (0-3, 4-7).
func quads() [][]int {
	s := make([][]int, 8)
	for i := range s {
		s[i] = make([]int, 8)
		for j := range s[i] {
			s[i][j] = 10
			if i/4 == j/4 {
				s[i][j] = 300
			}
		}
	}
	return s
}

// TestFitTopologyV290Empty: where HAMi v2.9.0 answers a fit with no GPUs (no scores), the
// SDK allocates the request in walk order, in both versions; fewer candidates than asked fail
// with each version's AllocatedCardsInsufficientRequest count.
func TestFitTopologyV290Empty(t *testing.T) {
	t.Parallel()
	gpus := []annotation.Device{
		{ID: "GPU-0", Count: 10, Devmem: 1000, Devcore: 100, Type: "NVIDIA T4", Health: true},
		{ID: "GPU-1", Index: 1, Count: 10, Devmem: 1000, Devcore: 100, Type: "NVIDIA T4", Health: true},
		{ID: "GPU-2", Index: 2, Count: 10, Devmem: 1000, Devcore: 100, Type: "NVIDIA T4", Health: true},
	}
	full := map[string]Usage{"GPU-0": {Used: 1, Usedmem: 1000}, "GPU-1": {Used: 1, Usedmem: 1000}}
	for _, v := range []Version{VersionV290, VersionMaster} {
		cfg := Config{GPUSchedulerPolicy: PolicyTopologyAware, Version: v}
		req := PodRequest{Containers: []Request{{Count: 2, Type: "NVIDIA", Memory: 100}}}
		pd, reason, ok := Fit(WithUsage(gpus, nil), req, nil, nil, cfg)
		if got := EncodePodDevices(pd); !ok || got != "GPU-2,NVIDIA,100,0:GPU-1,NVIDIA,100,0:;" {
			t.Errorf("%v: %q %q %v", v, got, reason, ok)
		}
		_, reason, ok = Fit(WithUsage(gpus, full), req, nil, nil, cfg)
		want := map[Version]string{VersionV290: "1/3 AllocatedCardsInsufficientRequest, 2/3 CardInsufficientMemory",
			VersionMaster: "1/3 AllocatedCardsInsufficientRequest, 2/3 CardInsufficientMemory"}[v]
		if ok || reason != want {
			t.Errorf("%v: fewer candidates: %q %v, want %q", v, reason, ok, want)
		}
	}
}
