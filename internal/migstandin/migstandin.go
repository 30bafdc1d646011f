// Package migstandin stands in for package mig's reservation codec (DecodeAllocations,
// EncodeAllocations) until it is merged: the same signatures and rules. TODO(merge): replace
// every use with mig.DecodeAllocations / mig.EncodeAllocations and delete this package.
package migstandin

import (
	"encoding/json"
	"fmt"

	"github.com/hamireg/hamireg/mig"
)

type standinPlacement struct {
	Start uint32 `json:"start"`
	Size  uint32 `json:"size"`
}

type standinAllocation struct {
	ContainerIndex    int              `json:"containerIndex"`
	DeviceIndex       int              `json:"deviceIndex"`
	GPUUUID           string           `json:"gpuUUID"`
	Profile           string           `json:"profile"`
	Placement         standinPlacement `json:"placement"`
	MigUUID           string           `json:"migUUID,omitempty"`
	GPUInstanceID     *uint32          `json:"gpuInstanceID,omitempty"`
	ComputeInstanceID *uint32          `json:"computeInstanceID,omitempty"`
}

// DecodeAllocations is mig.DecodeAllocations.
func DecodeAllocations(value string) ([]mig.Allocation, error) {
	if value == "" || value == "null" || value == "[]" {
		return nil, nil
	}
	var in []standinAllocation
	if err := json.Unmarshal([]byte(value), &in); err != nil {
		return nil, fmt.Errorf("%w: %v", mig.ErrMalformed, err)
	}
	var out []mig.Allocation
	seen := map[[2]int]bool{}
	for _, a := range in {
		runtime := a.MigUUID != "" || a.GPUInstanceID != nil || a.ComputeInstanceID != nil
		full := a.MigUUID != "" && a.GPUInstanceID != nil && a.ComputeInstanceID != nil
		key := [2]int{a.ContainerIndex, a.DeviceIndex}
		if a.ContainerIndex < 0 || a.DeviceIndex < 0 || a.GPUUUID == "" || a.Profile == "" || a.Placement.Size == 0 || runtime != full || seen[key] {
			return nil, fmt.Errorf("%w: %+v", mig.ErrMalformed, a)
		}
		seen[key] = true
		m := mig.Allocation{ContainerIndex: a.ContainerIndex, DeviceIndex: a.DeviceIndex, GPUUUID: a.GPUUUID, Profile: a.Profile,
			Placement: mig.Placement(a.Placement)}
		if full {
			m.Runtime = &mig.Runtime{MigUUID: a.MigUUID, GPUInstanceID: *a.GPUInstanceID, ComputeInstanceID: *a.ComputeInstanceID}
		}
		out = append(out, m)
	}
	return out, nil
}

// EncodeAllocations is mig.EncodeAllocations.
func EncodeAllocations(allocs []mig.Allocation) string {
	if len(allocs) == 0 {
		return ""
	}
	out := make([]standinAllocation, len(allocs))
	for i, a := range allocs {
		out[i] = standinAllocation{ContainerIndex: a.ContainerIndex, DeviceIndex: a.DeviceIndex, GPUUUID: a.GPUUUID, Profile: a.Profile,
			Placement: standinPlacement(a.Placement)}
		if a.Runtime != nil {
			gi, ci := a.Runtime.GPUInstanceID, a.Runtime.ComputeInstanceID
			out[i].MigUUID, out[i].GPUInstanceID, out[i].ComputeInstanceID = a.Runtime.MigUUID, &gi, &ci
		}
	}
	data, _ := json.Marshal(out)
	return string(data)
}
