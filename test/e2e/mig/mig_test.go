package mig_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// a100Profiles is what HAMi master publishes for an A100-SXM4-40GB under the chart's
// allowlist (spec mig.md §1): NVML's memory and placements, cores rounded up against the 7g
// profile's 98 SMs.
var a100Profiles = []annotation.MigProfile{
	{Name: "1g.5gb", MemoryMB: 4864, Core: 15, SliceCount: 1, Placements: placements(1, 0, 1, 2, 3, 4, 5, 6)},
	{Name: "2g.10gb", MemoryMB: 9856, Core: 29, SliceCount: 2, Placements: placements(2, 0, 2, 4)},
	{Name: "3g.20gb", MemoryMB: 19968, Core: 43, SliceCount: 3, Placements: placements(4, 0, 4)},
	{Name: "7g.40gb", MemoryMB: 40192, Core: 100, SliceCount: 7, Placements: placements(8, 0)},
}

func placements(size uint32, starts ...uint32) []annotation.MigPlacement {
	out := make([]annotation.MigPlacement, len(starts))
	for i, s := range starts {
		out[i] = annotation.MigPlacement{Start: s, Size: size}
	}
	return out
}

// TestMIGEndToEnd runs the scenario of issue 22 on one MIG node (see the package doc). The
// steps share the node and run in order, each leaving the node empty (every pod deleted,
// every instance destroyed) for the next.
func TestMIGEndToEnd(t *testing.T) {
	t.Parallel()
	s := newStack(t)

	// Every GPU as HAMi master registers it (reported for the first that differs).
	for uuid, d := range s.gpus {
		if d.Mode != "mig" || d.Count != 7 || d.Devmem != 40960 || d.Devcore != 100 || !d.Health {
			t.Fatalf("GPU %s registered as %+v, want mode mig, count 7 (the 1g profile's instances), devmem 40960, devcore 100, healthy", uuid, d)
		}
		if diff := cmp.Diff(a100Profiles, d.MIGProfiles); diff != "" {
			t.Fatalf("GPU %s: migProfiles (-want +got):\n%s", uuid, diff)
		}
	}
	s.checkSim(t, "start")
	if t.Failed() {
		t.FailNow()
	}

	// The steps run one after the other (not in parallel): they share the node's GPUs.
	t.Run("profiles chosen by NVML's memory", func(t *testing.T) {
		var got []placed
		for _, c := range []struct {
			mem     int64
			profile string
		}{
			{4000, "1g.5gb"},   // 4864 MiB
			{9000, "2g.10gb"},  // 9856 MiB
			{19000, "3g.20gb"}, // 19968 MiB
			{5120, "2g.10gb"},  // 5 GiB is more than 1g.5gb's 4864 MiB: the name does not decide
		} {
			name := fmt.Sprintf("mem-%d", c.mem)
			s.createPod(t, name, c.mem, 0)
			got = append(got, s.waitPlaced(t, name, c.profile))
		}
		s.checkSim(t, "profiles", got...)

		// No placement fits: Pending with HAMi's reasons. 41000 MiB is above every GPU's
		// devmem (the memory check comes first); a whole GPU (100 % = devmem 40960) is above
		// the 7g profile's 40192.
		s.createPod(t, "mem-41000", 41000, 0)
		s.waitPending(t, "mem-41000", allocation.ReasonCardInsufficientMemory)
		s.createPod(t, "whole-gpu", 0, 0)
		s.waitPending(t, "whole-gpu", allocation.ReasonCardMigTopologyInfeasible)
		s.checkSim(t, "pending", got...)
		s.deleteAll(t, "profiles")
	})

	t.Run("1g pods fill a GPU then the next", func(t *testing.T) {
		const n = 8
		for i := range n {
			s.createPod(t, fmt.Sprintf("fill-%d", i), 4000, 0)
		}
		byGPU := map[string][]placed{}
		var all []placed
		for i := range n {
			p := s.waitPlaced(t, fmt.Sprintf("fill-%d", i), "1g.5gb")
			byGPU[p.gpu] = append(byGPU[p.gpu], p)
			all = append(all, p)
		}
		s.checkSim(t, "fill", all...)
		var full string
		for gpu, ps := range byGPU {
			if len(ps) == 7 {
				full = gpu
			}
		}
		if full == "" || len(byGPU) != 2 {
			t.Fatalf("8 pods of 1g.5gb on %d GPUs %v, want 7 on one GPU (binpack) and the eighth on another", len(byGPU), counts(byGPU))
		}
		starts := make([]uint32, 0, 7)
		for _, p := range byGPU[full] {
			starts = append(starts, p.at.Start)
		}
		slices.Sort(starts)
		if !slices.Equal(starts, []uint32{0, 1, 2, 3, 4, 5, 6}) {
			t.Errorf("the full GPU's 1g placements start at %v, want each of 0..6 once", starts)
		}

		// The full GPU's own reason, as HAMi master gives it for the eighth 1g pod (vector
		// fill_1g_step_8): the count (7) before the MIG rule. A pod pinned to that GPU shows it.
		s.createAnnotatedPod(t, "fill-pinned", 4000, 0, map[string]string{allocation.KeyUseGPUUUID: full})
		s.waitPending(t, "fill-pinned", "1/8 "+allocation.ReasonCardTimeSlicingExhausted)
		s.deletePod(t, "fill-pinned")

		// Deleting a pod frees its placement: the agent destroys the instance, and the next
		// 1g pod (binpack: the fullest GPU first) gets exactly that placement.
		var victim placed
		for _, p := range byGPU[full] {
			if p.at.Start == 3 {
				victim = p
			}
		}
		s.deletePod(t, victim.name)
		waitGone(t, s, victim.migUUID)
		rest := slices.DeleteFunc(slices.Clone(all), func(p placed) bool { return p.name == victim.name })
		s.checkSim(t, "after delete", rest...)
		s.createPod(t, "fill-again", 4000, 0)
		again := s.waitPlaced(t, "fill-again", "1g.5gb")
		if again.gpu != victim.gpu || again.at != victim.at {
			t.Errorf("the next 1g pod got %s at %+v, want the freed placement %s at %+v", again.gpu, again.at, victim.gpu, victim.at)
		}
		if again.migUUID == victim.migUUID {
			t.Errorf("the next pod got the deleted pod's MIG device %s, want a new instance", again.migUUID)
		}
		s.checkSim(t, "refill", append(rest, again)...)
		s.deleteAll(t, "fill")
	})

	t.Run("three 2g and one 1g fill a GPU", func(t *testing.T) {
		var got []placed
		for i := range 3 {
			name := fmt.Sprintf("two-%d", i)
			s.createPod(t, name, 9000, 0)
			got = append(got, s.waitPlaced(t, name, "2g.10gb"))
		}
		s.createPod(t, "one", 4000, 0)
		got = append(got, s.waitPlaced(t, "one", "1g.5gb"))
		gpu := got[0].gpu
		var cores int32
		for _, p := range got {
			if p.gpu != gpu {
				t.Fatalf("pod %s on %s, want every pod on %s (binpack)", p.name, p.gpu, gpu)
			}
			cores += s.profile(t, gpu, p.profile).Core
		}
		// HAMi's view, which the annotations keep: 3×29+15 = 102 % of the GPU's cores, so
		// HAMi refuses even a zero-core request here. The GPU is full for the SDK as well
		// (every slice is taken), so both send the next pod elsewhere.
		if cores != 102 {
			t.Errorf("the pods' cores sum to %d on %s, want HAMi's 102", cores, gpu)
		}
		s.createPod(t, "next", 4000, 0)
		next := s.waitPlaced(t, "next", "1g.5gb")
		if next.gpu == gpu {
			t.Errorf("pod next placed on the full GPU %s at %+v", gpu, next.at)
		}
		// Pinned to the full GPU, a zero-core pod is refused by the placement rule
		// (CardMigTopologyInfeasible: memory and count still pass); HAMi refuses it too, with
		// CardInsufficientCore (vector profile_cores_sum_above_100_blocks_zero_core_request).
		s.createAnnotatedPod(t, "two-pinned", 4000, 0, map[string]string{allocation.KeyUseGPUUUID: gpu})
		s.waitPending(t, "two-pinned", "1/8 "+allocation.ReasonCardMigTopologyInfeasible)
		s.deletePod(t, "two-pinned")
		s.checkSim(t, "2g+1g", append(got, next)...)
		s.deleteAll(t, "2g+1g")
	})

	// HAMi subtracts the rounded-up cores of the GPU's profiles from 100: with two 2g.10gb
	// (58) it refuses a 43 % request (CardInsufficientCore) although the 3g.20gb placement
	// [4,8) is free. The SDK lets the placement decide: the request gets the first profile by
	// memory whose cores cover 43 %, 3g.20gb, on the same GPU.
	t.Run("the placement decides, not the sum of cores", func(t *testing.T) {
		var got []placed
		for i := range 2 {
			name := fmt.Sprintf("pair-%d", i)
			s.createPod(t, name, 9000, 0)
			got = append(got, s.waitPlaced(t, name, "2g.10gb"))
		}
		if got[0].gpu != got[1].gpu {
			t.Fatalf("the two 2g pods on %s and %s, want one GPU (binpack)", got[0].gpu, got[1].gpu)
		}
		s.createPod(t, "cores-43", 4000, 43)
		p := s.waitPlaced(t, "cores-43", "3g.20gb")
		if p.gpu != got[0].gpu || p.at != (mig.Placement{Start: 4, Size: 4}) {
			t.Errorf("pod cores-43 got %s at %+v, want the free 3g placement {4 4} of %s", p.gpu, p.at, got[0].gpu)
		}
		s.checkSim(t, "cores", append(got, p)...)
		s.deleteAll(t, "cores")
	})
}

// waitGone waits until the simulation no longer lists the MIG device uuid.
func waitGone(t *testing.T, s *stack, uuid string) {
	t.Helper()
	harness.Eventually(t, "the agent destroys "+uuid, waitReconcile, func() bool {
		_, ok := s.sim(t).live()[uuid]
		return !ok
	})
}

func counts(byGPU map[string][]placed) map[string]int {
	out := map[string]int{}
	for g, ps := range byGPU {
		out[g] = len(ps)
	}
	return out
}
