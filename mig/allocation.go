package mig

import (
	"github.com/hamireg/hamireg/annotation"
)

// KeyAllocations is the pod annotation in which HAMi master's scheduler records the MIG
// reservation of each device it chose, and the device plugin the runtime identity of the
// instance it created for it.
const KeyAllocations = "hami.io/vgpu-mig-allocations"

// Placement is a MIG placement: the first memory slice and the number of slices.
type Placement = annotation.MigPlacement

// Profile is a MIG profile a GPU offers, as published in the register annotation.
type Profile = annotation.MigProfile

// Allocation is one element of [KeyAllocations]: the reservation of the DeviceIndex-th device
// of container ContainerIndex (its index among init containers then containers, as the device
// annotation counts them), and, once the node realised it, the instance's runtime identity.
type Allocation struct {
	ContainerIndex int
	DeviceIndex    int
	GPUUUID        string
	Profile        string
	Placement      Placement
	// Runtime is the realised instance; nil until the device plugin created it. HAMi writes
	// the three fields (migUUID, gpuInstanceID, computeInstanceID) all or none.
	Runtime *Runtime
}

// Runtime is the identity of a realised MIG device.
type Runtime struct {
	MigUUID           string
	GPUInstanceID     uint32
	ComputeInstanceID uint32
}

// Instance is a MIG device on a node: a GPU instance of Profile at Placement on the GPU
// GPUUUID and the compute instance that fills it. Profile is the published profile name;
// ProfileID is NVML's GPU-instance profile id (the nvidia-smi id: 19 for A100's 1g.5gb), 0 when
// unknown.
type Instance struct {
	GPUUUID   string
	Profile   string
	ProfileID uint32
	Placement Placement
	Runtime
}

// Overlaps reports whether two placements share a slice ([start, start+size) intervals).
func Overlaps(a, b Placement) bool {
	return uint64(a.Start) < uint64(b.Start)+uint64(b.Size) && uint64(b.Start) < uint64(a.Start)+uint64(a.Size)
}
