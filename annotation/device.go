package annotation

import (
	"cmp"
	"slices"
)

// Device is one physical device (a GPU, an NPU, ...) as HAMi's node agent publishes it in the
// register annotation, for any vendor.
//
// Field names and types follow HAMi's wire struct so that every value HAMi can write or read
// round-trips exactly: Index is unsigned (HAMi accepts up to 2^64-1), Count, Devmem and
// Devcore are int32, Numa is a platform int. Zero values are omitted on the wire (HAMi's
// omitempty), so a decoded device with Index 0, Numa 0 or Health false simply had no such key.
// In particular a missing "health" key means the device is unhealthy.
type Device struct {
	// ID identifies the device on every channel: the GPU UUID for NVIDIA, e.g.
	// "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4"; any vendor's unique id otherwise. It must
	// stay the same across restarts of the plugin (the scheduler's pod annotations name it),
	// and must not contain ',', ':' or ';' (HAMi's pod annotations do not escape them). The
	// kubelet sees its Count replicas as "<ID>-<i>" (kubeletplugin.VirtualDeviceID).
	ID string
	// Index is the index of the device on its node: the NVML index for NVIDIA.
	Index uint
	// Count is the split count: how many tasks may share the GPU.
	Count int32
	// Devmem is the device memory in MiB after memory scaling.
	Devmem int32
	// Devcore is the core percentage after core scaling (100 = the whole GPU).
	Devcore int32
	// Type is the model; NVIDIA's are prefixed "NVIDIA-" unless the model name starts with
	// "NVIDIA".
	Type string
	// Numa is the NUMA node of the GPU's PCI device (0 when unknown).
	Numa int
	// Mode is NVIDIA's operating mode: "hami-core", "mig" or "mps"; other vendors leave it
	// empty.
	Mode string
	// MIGProfiles lists the MIG profiles a GPU in "mig" mode offers (HAMi master only;
	// never written in the v2.9.0 shape).
	MIGProfiles []MigProfile
	// Health reports whether the device plugin considers the GPU healthy.
	Health bool
}

// MigProfile is one MIG profile a GPU offers (HAMi master's "migProfiles" element).
type MigProfile struct {
	Name       string
	MemoryMB   int32
	Core       int32
	SliceCount uint32
	// Placements is written as null when nil (the wire field has no omitempty).
	Placements []MigPlacement
}

// MigPlacement is a MIG placement: the first slice and the number of slices.
type MigPlacement struct {
	Start uint32
	Size  uint32
}

// Compare orders devices canonically: by Index, then by ID. Writers publish devices in this
// order so that an unchanged device set always encodes to the same bytes (HAMi's agent
// publishes in random map order and re-patches almost every cycle on multi-GPU nodes).
func Compare(a, b Device) int {
	if c := cmp.Compare(a.Index, b.Index); c != 0 {
		return c
	}
	return cmp.Compare(a.ID, b.ID)
}

// SortDevices sorts devices in place in canonical order (see [Compare]).
func SortDevices(devices []Device) {
	slices.SortStableFunc(devices, Compare)
}

// Canonical returns a copy of devices in canonical order (see [Compare]); the input is not
// modified. A nil input gives nil.
func Canonical(devices []Device) []Device {
	if devices == nil {
		return nil
	}
	out := slices.Clone(devices)
	SortDevices(out)
	return out
}
