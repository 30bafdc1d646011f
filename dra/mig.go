package dra

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/mig"
)

// Attributes of a MIG device (unqualified: they belong to the profile's driver).
const (
	// AttributeProfile is the MIG profile name of a MIG device, e.g. "1g.10gb"; only MIG
	// devices have it, which is how [DeviceClass] and [MIGDeviceClass] tell them apart.
	AttributeProfile resourcev1.QualifiedName = "profile"
	// AttributeParentUUID is the UUID of the GPU a MIG device is a placement of.
	AttributeParentUUID resourcev1.QualifiedName = "parentUUID"
	// AttributePlacementStart and AttributePlacementSize are the MIG placement: the first
	// memory slice and the number of memory slices.
	AttributePlacementStart resourcev1.QualifiedName = "placementStart"
	AttributePlacementSize  resourcev1.QualifiedName = "placementSize"
)

// MIGType is the "type" attribute of a MIG device in the HAMi profile (HAMi-DRA's class
// selects type == "hami-gpu", so it never gets one). In the SDK profile "type" keeps the
// GPU's HAMi model and "mode" is [ModeMIG].
const MIGType = "mig"

// MIGClassPrefix prefixes the driver name in the name of [MIGDeviceClass]: "mig.gpu.hamireg.io".
const MIGClassPrefix = "mig."

// MemorySliceCounter is the name of the counter of memory slice i in a MIG GPU's counter
// set: "memory-slice-<i>", value 1.
func MemorySliceCounter(i uint32) string { return "memory-slice-" + strconv.FormatUint(uint64(i), 10) }

// Slice is one ResourceSlice of the node's pool as [Slices] lays it out: devices, or counter
// sets (the API takes one or the other in a slice). It has the fields of
// k8s.io/dynamic-resource-allocation/resourceslice.Slice that this package fills.
type Slice struct {
	Devices        []resourcev1.Device
	SharedCounters []resourcev1.CounterSet
}

// CounterSetName is the name of the counter set of the MIG GPU with NVML index i:
// p.DevicePrefix, i, "-memory-slices" ("gpu-0-memory-slices").
func (p Profile) CounterSetName(i uint) string { return p.DeviceName(i) + "-memory-slices" }

// MIGDeviceName is the DRA device name of the MIG placement pl of profile on the GPU with
// NVML index i: "<DevicePrefix><i>-mig-<profile>-<start>", the profile name lower-cased
// with '.' written as '-' and '+' as "-plus-" ("gpu-0-mig-1g-10gb-6",
// "gpu-0-mig-1g-5gb-plus-me-3"). Other characters outside [a-z0-9-] become '-'; [Slices]
// fails when two placements of a GPU get the same name.
func (p Profile) MIGDeviceName(i uint, profile string, pl mig.Placement) string {
	var b strings.Builder
	b.WriteString(p.DeviceName(i))
	b.WriteString("-mig-")
	for _, c := range strings.ToLower(profile) {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-':
			b.WriteRune(c)
		case c == '+':
			b.WriteString("-plus-")
		default:
			b.WriteByte('-')
		}
	}
	b.WriteByte('-')
	b.WriteString(strconv.FormatUint(uint64(pl.Start), 10))
	return b.String()
}

// MIGDevice is one allocation result read back by [MIGFromResult]: the MIG placement a claim
// got.
type MIGDevice struct {
	// Index and GPUUUID are the parent GPU's.
	Index   uint
	GPUUUID string
	// Profile is the profile as the GPU publishes it; Placement the placement.
	Profile   annotation.MigProfile
	Placement mig.Placement
}

// migPublishable reports whether Slices publishes the MIG GPU d: in MIG mode, owned, with
// at least one placement.
func migPublishable(d annotation.Device, opts Options) bool {
	return d.Mode == ModeMIG && (opts.Owned == nil || opts.Owned(d)) &&
		slices.ContainsFunc(d.MIGProfiles, func(p annotation.MigProfile) bool { return len(p.Placements) > 0 })
}

// Slices maps the scanned devices to the slices of the node's pool: the GPU devices of
// [Devices], and for every GPU in MIG mode that the DRA world owns ([Options.Owned]; nil:
// all) and that publishes MIG profiles, a partitionable device (KEP-4815) per placement of
// each profile.
//
// Such a GPU gets a counter set ([Profile.CounterSetName]) with one counter per memory slice
// ([MemorySliceCounter], value 1, as many as its placements reach), and each placement a
// device ([Profile.MIGDeviceName]) that consumes the counters of its memory slices: once a
// claim has one placement, kube-scheduler gives no claim a placement that overlaps it, which
// is what NVML refuses too. A MIG device is not shared (no allowMultipleAllocations): it has
// the attributes profile, parentUUID, placementStart and placementSize besides the GPU
// device's (SDK profile: type = the GPU's model, mode = "mig"; HAMi profile: type =
// [MIGType]), and the capacities memory (the profile's MiB in bytes) and cores (its Core).
// The placements of a GPU come in the order HAMi's packer tries them (mig.SortProfiles,
// mig.OrderedPlacements): the allocator takes the first that fits, so a 1g claim gets the
// highest free 1g placement and leaves the low ones to larger profiles. An unhealthy GPU's
// placements carry the <driver>/unhealthy taint. A MIG GPU not owned is left out (the device
// plugin's MIG path serves it), so is one without placements.
//
// The slices respect the API's limits: the counter sets come first, at most
// [resourcev1.ResourceSliceMaxCounterSets] per slice, in slices of their own; then the
// devices, GPU devices first, at most [resourcev1.ResourceSliceMaxDevicesWithAdvancedFeatures]
// per slice. Without a MIG GPU to publish, the result is one slice with the devices of
// [Devices]. Errors wrap [ErrInvalidDevice]: those of [Devices], a MIG GPU whose placements
// reach beyond [resourcev1.ResourceSliceMaxCountersPerCounterSet] memory slices, a placement
// of size 0, two placements with the same device name, a name that is not a DNS label.
func Slices(devs []annotation.Device, opts Options) ([]Slice, error) {
	gpuDevs, err := Devices(devs, opts)
	if err != nil {
		return nil, err
	}
	var migGPUs []annotation.Device
	for _, d := range devs {
		if migPublishable(d, opts) {
			migGPUs = append(migGPUs, d)
		}
	}
	if len(migGPUs) == 0 {
		return []Slice{{Devices: gpuDevs}}, nil
	}
	slices.SortStableFunc(migGPUs, func(a, b annotation.Device) int { return cmp.Compare(a.Index, b.Index) })
	p := opts.Profile
	var (
		sets    []resourcev1.CounterSet
		migDevs []resourcev1.Device
	)
	for i, d := range migGPUs {
		switch {
		case d.ID == "":
			return nil, fmt.Errorf("map devices: MIG GPU %d has an empty ID: the device source must set its UUID: %w", d.Index, ErrInvalidDevice)
		case i > 0 && migGPUs[i-1].Index == d.Index:
			return nil, fmt.Errorf("map devices: MIG GPUs %s and %s both have index %d: device names would collide: %w", migGPUs[i-1].ID, d.ID, d.Index, ErrInvalidDevice)
		case slices.ContainsFunc(devs, func(g annotation.Device) bool { return g.Mode != ModeMIG && g.Index == d.Index }):
			return nil, fmt.Errorf("map devices: MIG GPU %s has index %d, as a GPU not in MIG mode: device names would collide: %w", d.ID, d.Index, ErrInvalidDevice)
		case slices.ContainsFunc(migGPUs[:i], func(g annotation.Device) bool { return g.ID == d.ID }):
			return nil, fmt.Errorf("map devices: MIG GPU %s listed twice: %w", d.ID, ErrInvalidDevice)
		}
		set, ds, err := migGPU(p, d, opts)
		if err != nil {
			return nil, fmt.Errorf("map devices: MIG GPU %s (index %d): %w", d.ID, d.Index, err)
		}
		sets = append(sets, set)
		migDevs = append(migDevs, ds...)
	}
	var out []Slice
	for chunk := range slices.Chunk(sets, resourcev1.ResourceSliceMaxCounterSets) {
		out = append(out, Slice{SharedCounters: chunk})
	}
	all := append(slices.Clip(gpuDevs), migDevs...)
	for chunk := range slices.Chunk(all, resourcev1.ResourceSliceMaxDevicesWithAdvancedFeatures) {
		out = append(out, Slice{Devices: chunk})
	}
	return out, nil
}

// migPlacements returns the placements of d in the order they are published, with their
// profiles.
func migPlacements(d annotation.Device) []struct {
	profile   annotation.MigProfile
	placement mig.Placement
} {
	var out []struct {
		profile   annotation.MigProfile
		placement mig.Placement
	}
	for _, prof := range mig.SortProfiles(d.MIGProfiles) {
		for _, pl := range mig.OrderedPlacements(prof) {
			out = append(out, struct {
				profile   annotation.MigProfile
				placement mig.Placement
			}{prof, pl})
		}
	}
	return out
}

// migGPU maps one MIG GPU to its counter set and its devices.
func migGPU(p Profile, d annotation.Device, opts Options) (resourcev1.CounterSet, []resourcev1.Device, error) {
	setName := p.CounterSetName(d.Index)
	if errs := validation.IsDNS1123Label(setName); len(errs) > 0 {
		return resourcev1.CounterSet{}, nil, fmt.Errorf("counter set name %q is not a DNS label (%s): fix the profile's DevicePrefix: %w",
			setName, strings.Join(errs, "; "), ErrInvalidDevice)
	}
	placements := migPlacements(d)
	var end uint64
	for _, pp := range placements {
		if pp.placement.Size == 0 {
			return resourcev1.CounterSet{}, nil, fmt.Errorf("profile %s has a placement of size 0 at %d: the device source must report NVML's placements: %w",
				pp.profile.Name, pp.placement.Start, ErrInvalidDevice)
		}
		end = max(end, uint64(pp.placement.Start)+uint64(pp.placement.Size))
	}
	if end > resourcev1.ResourceSliceMaxCountersPerCounterSet {
		return resourcev1.CounterSet{}, nil, fmt.Errorf("its placements reach memory slice %d, but a counter set holds at most %d counters: leave the profiles with such placements out of the MIG allowlist: %w",
			end-1, resourcev1.ResourceSliceMaxCountersPerCounterSet, ErrInvalidDevice)
	}
	one := resource.MustParse("1")
	set := resourcev1.CounterSet{Name: setName, Counters: make(map[string]resourcev1.Counter, end)}
	for s := range uint32(end) {
		set.Counters[MemorySliceCounter(s)] = resourcev1.Counter{Value: one}
	}

	extra := opts.Extras[d.ID]
	var taints []resourcev1.DeviceTaint
	if !d.Health {
		taints = append(taints, resourcev1.DeviceTaint{Key: p.UnhealthyTaint(), Effect: resourcev1.DeviceTaintEffectNoSchedule})
	}
	out := make([]resourcev1.Device, 0, len(placements))
	names := make(map[string]bool, len(placements))
	for _, pp := range placements {
		prof, pl := pp.profile, pp.placement
		name := p.MIGDeviceName(d.Index, prof.Name, pl)
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			return resourcev1.CounterSet{}, nil, fmt.Errorf("device name %q of profile %q is not a DNS label (%s): leave the profile out of the MIG allowlist: %w",
				name, prof.Name, strings.Join(errs, "; "), ErrInvalidDevice)
		}
		if names[name] {
			return resourcev1.CounterSet{}, nil, fmt.Errorf("two placements of the GPU get the device name %q (profile %q listed twice, or two profile names that differ in characters outside [a-z0-9.+-]): %w",
				name, prof.Name, ErrInvalidDevice)
		}
		names[name] = true
		attrs := map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{}
		str := func(k resourcev1.QualifiedName, v string) { attrs[k] = resourcev1.DeviceAttribute{StringValue: &v} }
		num := func(k resourcev1.QualifiedName, v int64) { attrs[k] = resourcev1.DeviceAttribute{IntValue: &v} }
		str(AttributeProfile, prof.Name)
		str(AttributeParentUUID, d.ID)
		num(AttributePlacementStart, int64(pl.Start))
		num(AttributePlacementSize, int64(pl.Size))
		str("productName", strings.TrimPrefix(d.Type, "NVIDIA-"))
		if p.HAMiAttributes {
			str("type", MIGType)
			num("minor", int64(d.Index))
			if extra.PCIBusID != "" {
				str("pcieBusID", extra.PCIBusID)
			}
		} else {
			str("type", d.Type)
			str("mode", ModeMIG)
			num("index", int64(d.Index))
			num("numa", int64(d.Numa))
		}
		if extra.PCIBusID != "" {
			str(AttributePCIBusID, extra.PCIBusID)
		}
		for k, a := range attrs {
			if a.StringValue != nil && len(*a.StringValue) > resourcev1.DeviceAttributeMaxValueLength {
				return resourcev1.CounterSet{}, nil, fmt.Errorf("attribute %s %q of %s is longer than the API's %d characters: %w",
					k, *a.StringValue, name, resourcev1.DeviceAttributeMaxValueLength, ErrInvalidDevice)
			}
		}
		consumed := make(map[string]resourcev1.Counter, pl.Size)
		for s := pl.Start; s < pl.Start+pl.Size; s++ {
			consumed[MemorySliceCounter(s)] = resourcev1.Counter{Value: one}
		}
		out = append(out, resourcev1.Device{
			Name:       name,
			Attributes: attrs,
			Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
				CapacityMemory: {Value: *quantity(max(int64(prof.MemoryMB), 0)*mib, resource.BinarySI)},
				CapacityCores:  {Value: *quantity(max(int64(prof.Core), 0), resource.DecimalSI)},
			},
			ConsumesCounters: []resourcev1.DeviceCounterConsumption{{CounterSet: setName, Counters: consumed}},
			Taints:           slices.Clone(taints),
		})
	}
	return set, out, nil
}

// MIGDeviceClass is the DeviceClass of the MIG devices of p: named [MIGClassPrefix] +
// p.Driver, selecting the devices of the driver that have the attribute profile. A claim
// picks a profile with a selector on it:
//
//	device.attributes["gpu.hamireg.io"].profile == "1g.10gb"
func MIGDeviceClass(p Profile) *resourcev1.DeviceClass {
	cel := fmt.Sprintf("device.driver == %q && has(device.attributes[%q].%s)", p.Driver, p.Driver, AttributeProfile)
	return &resourcev1.DeviceClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: resourcev1.SchemeGroupVersion.String(), Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{Name: MIGClassPrefix + p.Driver},
		Spec: resourcev1.DeviceClassSpec{
			Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: cel}}},
		},
	}
}

// ProfileSelector is the CEL expression that selects the MIG devices of profile (e.g.
// "1g.10gb") for a request of [MIGDeviceClass].
func ProfileSelector(p Profile, profile string) string {
	return fmt.Sprintf("device.attributes[%q].%s == %q", p.Driver, AttributeProfile, profile)
}

// IsMIGDeviceName reports whether name has the shape of [Profile.MIGDeviceName] of p:
// p's device name of a GPU followed by "-mig-".
func (p Profile) IsMIGDeviceName(name string) bool {
	gpu, _, ok := strings.Cut(name, "-mig-")
	if !ok {
		return false
	}
	_, ok = p.IndexOf(gpu)
	return ok
}

// MIGFromResult reads one allocation result of a claim that names a MIG device: the parent
// GPU and the placement, found among the devices [Slices] publishes for gpus, the node's
// scanned GPUs (a GPU in MIG mode with profiles; the ownership is the caller's to check). A
// result of another driver, or naming a device that is not a MIG placement of one of gpus,
// is an error wrapping [ErrInvalidResult].
func MIGFromResult(p Profile, r resourcev1.DeviceRequestAllocationResult, gpus []annotation.Device) (MIGDevice, error) {
	fail := func(format string, args ...any) (MIGDevice, error) {
		return MIGDevice{}, fmt.Errorf("read allocation result %s/%s of request %q: %s: %w",
			r.Pool, r.Device, r.Request, fmt.Sprintf(format, args...), ErrInvalidResult)
	}
	if r.Driver != p.Driver {
		return fail("driver %q is not this profile's %q", r.Driver, p.Driver)
	}
	gpuName, _, ok := strings.Cut(r.Device, "-mig-")
	index, okIndex := p.IndexOf(gpuName)
	if !ok || !okIndex {
		return fail("not a MIG device name of profile %q (want %s<index>-mig-<profile>-<start>)", p.Name, p.DevicePrefix)
	}
	i := slices.IndexFunc(gpus, func(g annotation.Device) bool { return g.Index == index && g.Mode == ModeMIG })
	if i < 0 {
		return fail("GPU %d is not a GPU of this node in MIG mode", index)
	}
	g := gpus[i]
	for _, pp := range migPlacements(g) {
		if p.MIGDeviceName(index, pp.profile.Name, pp.placement) == r.Device {
			return MIGDevice{Index: index, GPUUUID: g.ID, Profile: pp.profile, Placement: pp.placement}, nil
		}
	}
	return fail("GPU %d (%s) publishes no such MIG placement", index, g.ID)
}
