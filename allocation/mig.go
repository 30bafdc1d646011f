package allocation

import (
	"fmt"
	"slices"
	"strings"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/mig"
)

// ModeMIG is the [annotation.Device] Mode of an NVIDIA GPU split into MIG instances.
const ModeMIG = "mig"

// ReasonCardMigTopologyInfeasible is HAMi master's reason for a GPU in [ModeMIG] on which no
// profile with enough memory (and, by the SDK's rule, cores) has a free placement.
const ReasonCardMigTopologyInfeasible = "CardMigTopologyInfeasible"

// MIGSlot is the MIG reservation of one device: the profile and placement HAMi master's
// scheduler chose for it on a GPU in [ModeMIG]. The zero value means the device is not a MIG
// device. It is not part of the device list encoding ([EncodePodDevices]): it travels in
// mig.KeyAllocations ([MIGAllocations], [WithMIG]).
type MIGSlot struct {
	Profile   string
	Placement mig.Placement
}

// IsZero reports whether s names no reservation.
func (s MIGSlot) IsZero() bool { return s == MIGSlot{} }

// MIGAllocations returns the reservations HAMi master's scheduler writes into
// mig.KeyAllocations for pd: one per device with a [MIGSlot], ContainerIndex the index of its
// entry in pd (one entry per container, init containers first, as [EncodePodDevices] writes
// them), DeviceIndex its position in the entry, GPUUUID its physical GPU. nil when pd has no
// MIG device (HAMi then writes no annotation).
func MIGAllocations(pd PodDevices) []mig.Allocation {
	var out []mig.Allocation
	for ci, c := range pd {
		for di, d := range c {
			if d.MIG.IsZero() {
				continue
			}
			out = append(out, mig.Allocation{ContainerIndex: ci, DeviceIndex: di, GPUUUID: d.GPU(), Profile: d.MIG.Profile, Placement: d.MIG.Placement})
		}
	}
	return out
}

// WithMIG returns a copy of pd in which each device named by one of allocs (by its entry and
// its position there, as [MIGAllocations] numbers them) carries that reservation's [MIGSlot].
// An allocation that names no device of pd, or a device on another GPU, is an error wrapping
// mig.ErrMalformed (and pd is returned without any slot); the runtime identity is not kept.
// pd is not modified.
func WithMIG(pd PodDevices, allocs []mig.Allocation) (PodDevices, error) {
	out := make(PodDevices, len(pd))
	for i, c := range pd {
		out[i] = slices.Clone(c)
	}
	for _, a := range allocs {
		if a.ContainerIndex < 0 || a.ContainerIndex >= len(out) || a.DeviceIndex < 0 || a.DeviceIndex >= len(out[a.ContainerIndex]) {
			return pd, fmt.Errorf("apply MIG reservation: container %d device %d: no such device in the device list: %w", a.ContainerIndex, a.DeviceIndex, mig.ErrMalformed)
		}
		d := &out[a.ContainerIndex][a.DeviceIndex]
		if d.GPU() != a.GPUUUID {
			return pd, fmt.Errorf("apply MIG reservation: container %d device %d: reservation names GPU %q, the device list %q: %w", a.ContainerIndex, a.DeviceIndex, a.GPUUUID, d.GPU(), mig.ErrMalformed)
		}
		d.MIG = MIGSlot{Profile: a.Profile, Placement: a.Placement}
	}
	return out, nil
}

// MIGUsage returns the placements pd's MIG devices hold, by physical GPU UUID; nil when pd has
// none.
func (pd PodDevices) MIGUsage() map[string][]mig.Placement {
	var out map[string][]mig.Placement
	for _, c := range pd {
		for _, d := range c {
			if d.MIG.IsZero() {
				continue
			}
			if out == nil {
				out = map[string][]mig.Placement{}
			}
			out[d.GPU()] = append(out[d.GPU()], d.MIG.Placement)
		}
	}
	return out
}

// SetMIGUsage sets the MIG placements pods hold on each of devices (by UUID, as
// [PodDevices.MIGUsage] gives them, summed over the pods) and returns devices. Only GPUs in
// [ModeMIG] read them; see [Fit] for a GPU whose devices outnumber its known placements.
func SetMIGUsage(devices []DeviceUsage, placements map[string][]mig.Placement) []DeviceUsage {
	for i := range devices {
		devices[i].MIG = placements[devices[i].ID]
	}
	return devices
}

// migDevice is the fit of one device of request r on the MIG GPU d (HAMi master's order:
// memory, then the placement), picked being what the container has been given so far;
// mem is the request's memory on d and cores its cores. The core checks of other GPUs do not
// apply (rule a of the package doc): the chosen profile has at least cores.
func (f *fitter) migDevice(d *DeviceUsage, r Request, picked ContainerDevices, mem, cores int32) (ContainerDevice, string, bool) {
	if int64(d.Devmem)-d.Usedmem < int64(mem) {
		return ContainerDevice{}, ReasonCardInsufficientMemory, false
	}
	if d.Used > int64(len(d.MIG)) {
		// A device on this GPU whose placement is unknown (its reservation does not decode,
		// or there is none): it may be anywhere, so nothing is placed (rule c).
		return ContainerDevice{}, ReasonCardMigTopologyInfeasible, false
	}
	occupied := slices.Clone(d.MIG)
	for _, p := range picked {
		if p.UUID == d.ID && !p.MIG.IsZero() {
			occupied = append(occupied, p.MIG.Placement)
		}
	}
	prof, at, ok := mig.Select(d.MIGProfiles, occupied, mem, cores)
	if !ok {
		return ContainerDevice{}, ReasonCardMigTopologyInfeasible, false
	}
	return ContainerDevice{UUID: d.ID, Type: r.Type, Usedmem: prof.MemoryMB, Usedcores: prof.Core, MIG: MIGSlot{Profile: prof.Name, Placement: at}}, "", true
}

// isMIGRequest is HAMi master's test for a request that may ask for more devices than the
// node has GPUs (they stack on one GPU): an NVIDIA request whose pod allows MIG (no
// [KeyVGPUMode], or one that names "mig") on a node with a GPU in [ModeMIG].
func (f *fitter) isMIGRequest(devices []DeviceUsage, r Request) bool {
	if f.c.Version != VersionMaster || r.Type != annotation.VendorNVIDIA {
		return false
	}
	if mode, ok := f.pod[KeyVGPUMode]; ok && !strings.Contains(mode, ModeMIG) {
		return false
	}
	return slices.ContainsFunc(devices, func(d DeviceUsage) bool { return d.Mode == ModeMIG })
}
