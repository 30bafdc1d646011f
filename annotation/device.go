package annotation

import (
	"cmp"
	"slices"
)

// Device is one physical accelerator (a GPU, NPU, MLU, XPU, ...) as a HAMi node agent
// publishes it in its vendor's register annotation. The fields are HAMi's for every vendor
// with a JSON register annotation; NVIDIA's values are given as examples.
//
// Field names and types follow HAMi's wire struct so that every value HAMi can write or read
// round-trips exactly: Index is unsigned (HAMi accepts up to 2^64-1), Count, Devmem and
// Devcore are int32, Numa is a platform int. Zero values are omitted on the wire (HAMi's
// omitempty), so a decoded device with Index 0, Numa 0 or Health false simply had no such key.
// In particular a missing "health" key means the device is unhealthy.
type Device struct {
	// ID identifies the device on the node and across the cluster, stably across restarts:
	// the GPU UUID for NVIDIA (e.g. "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4"), the vendor's
	// own unique ID otherwise. Pod annotations name devices by it, so it must not contain
	// ',', ':' or ';' (HAMi does not escape them there); the kubelet sees its Count replicas as
	// "<ID>-<i>" (kubeletplugin.VirtualDeviceID).
	ID string
	// Index is the device's index on its node (NVIDIA: the NVML index).
	Index uint
	// Count is the split count: how many containers may share the device (1: not shared).
	Count int32
	// Devmem is the device memory in MiB that may be handed out (after memory scaling).
	Devmem int32
	// Devcore is the compute share that may be handed out, in percent of the device (100 =
	// the whole device, after core scaling).
	Devcore int32
	// Type is the model as pods select it with their type annotations; NVIDIA's is the model
	// prefixed "NVIDIA-" unless the model name starts with "NVIDIA".
	Type string
	// Numa is the NUMA node of the device's PCI function (0 when unknown).
	Numa int
	// Mode is the sharing mode, where the vendor has several: NVIDIA's "hami-core", "mig" or
	// "mps"; empty for vendors with one.
	Mode string
	// MIGProfiles lists the MIG profiles a GPU in "mig" mode offers (HAMi master only;
	// never written in the v2.9.0 shape).
	MIGProfiles []MigProfile
	// Health reports whether the device plugin considers the device healthy.
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
