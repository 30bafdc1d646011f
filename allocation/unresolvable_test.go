package allocation

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/hamireg/hamireg/annotation"
)

func TestUnresolvable(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		reason string
		want   bool
	}{
		"unregistered":                  {ReasonNodeUnregistered + ": NVIDIA malformed: bad JSON", true},
		"more GPUs than the node":       {ReasonNodeInsufficientDevice, true},
		"type":                          {"2/2 CardTypeMismatch", true},
		"uuid":                          {"2/2 CardUuidMismatch", true},
		"unhealthy and cordoned":        {"1/2 CardCordoned, 1/2 CardNotHealth", true},
		"mig":                           {"1/1 CardNotFoundCustomFilterRule", true},
		"numa groups too small":         {"1/3 AllocatedCardsInsufficientRequest, 2/3 NumaNotFit", true},
		"too few of the right type":     {"1/3 AllocatedCardsInsufficientRequest, 2/3 CardTypeMismatch", true},
		"memory":                        {"2/2 CardInsufficientMemory", false},
		"cores":                         {"1/1 CardInsufficientCore", false},
		"slots":                         {"1/1 CardTimeSlicingExhausted", false},
		"compute units":                 {"1/1 CardComputeUnitsExhausted", false},
		"exclusive":                     {"1/1 ExclusiveDeviceAllocateConflict", false},
		"one resolvable word is enough": {"1/2 CardInsufficientMemory, 1/2 CardTypeMismatch", false},
		"quota":                         {"ResourceQuotaNotFit", false},
		"mig placement":                 {"1/1 CardMigTopologyInfeasible", false},
		"v2.9.0 says nothing":           {ReasonNodeUnfitPod, false},
		"unknown word":                  {"1/1 SomethingNew", false},
		"empty":                         {"", false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := Unresolvable(tc.reason); got != tc.want {
				t.Errorf("Unresolvable(%q) = %v, want %v", tc.reason, got, tc.want)
			}
		})
	}
}

// TestUnresolvableIsSound: whenever the fit fails with a reason the rule calls unresolvable,
// the same pod fails on the same GPUs with nothing used (every pod removed), on random nodes,
// usage and requests of both versions. Nodes whose failure goes away without usage are counted,
// to show the property is not vacuous.
func TestUnresolvableIsSound(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(21, 5))
	types := []string{"NVIDIA-A10", "NVIDIA-A100", "NVIDIA-T4"}
	var unresolvable, resolvedByRemoval int
	for i := range 20000 {
		n := 1 + rng.IntN(4)
		devs := make([]annotation.Device, n)
		used := map[string]Usage{}
		for j := range devs {
			devs[j] = annotation.Device{ID: fmt.Sprintf("GPU-%d", j), Index: uint(j), Count: int32(1 + rng.IntN(3)), Devmem: int32(8000 + 8000*rng.IntN(3)),
				Devcore: 100, Type: types[rng.IntN(len(types))], Numa: rng.IntN(2), Mode: "hami-core", Health: rng.IntN(8) != 0}
			if rng.IntN(10) == 0 {
				devs[j].Mode = "mig"
			}
			used[devs[j].ID] = Usage{Used: int64(rng.IntN(int(devs[j].Count) + 1)), Usedmem: int64(rng.IntN(int(devs[j].Devmem))), Usedcores: int64(rng.IntN(101))}
		}
		pod := map[string]string{}
		if rng.IntN(4) == 0 {
			pod[KeyUseGPUType] = types[rng.IntN(len(types))]
		}
		if rng.IntN(4) == 0 {
			pod[KeyNUMABind] = "true"
		}
		if rng.IntN(6) == 0 {
			pod[KeyNoUseGPUUUID] = "GPU-0"
		}
		node := map[string]string{}
		if rng.IntN(6) == 0 {
			node[KeyDeviceCordon] = "GPU-1"
		}
		var req PodRequest
		for range 1 + rng.IntN(2) {
			req.Containers = append(req.Containers, Request{Count: int32(1 + rng.IntN(3)), Type: annotation.VendorNVIDIA,
				Memory: int32(rng.IntN(12000)), MemoryPercentage: PercentageUnset, Cores: int32(rng.IntN(4) * 30)})
		}
		cfg := Config{Version: []Version{VersionMaster, VersionV290}[i%2]}
		_, reason, ok := Fit(WithUsage(devs, used), req, pod, node, cfg)
		if ok || !Unresolvable(reason) {
			if !ok {
				if _, _, empty := Fit(WithUsage(devs, nil), req, pod, node, cfg); empty {
					resolvedByRemoval++
				}
			}
			continue
		}
		unresolvable++
		if _, _, empty := Fit(WithUsage(devs, nil), req, pod, node, cfg); empty {
			t.Fatalf("reason %q is called unresolvable, but the pod fits with no pod on the node: devices %+v, used %v, request %+v, pod %v, node %v",
				reason, devs, used, req, pod, node)
		}
	}
	if unresolvable == 0 || resolvedByRemoval == 0 {
		t.Fatalf("vacuous: %d unresolvable failures, %d failures that removal resolves", unresolvable, resolvedByRemoval)
	}
	t.Logf("%d unresolvable failures, all still failing without usage; %d failures resolved by removing every pod", unresolvable, resolvedByRemoval)
}
