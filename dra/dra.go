package dra

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/hamireg/hamireg/annotation"
)

// Names of the SDK's own profile ([SDKProfile]).
const (
	// SDKDriver is the driver name of [SDKProfile], and the name of its DeviceClass.
	SDKDriver = "gpu.hamireg.io"
	// HAMiDriver is HAMi-DRA's driver name ([HAMiProfile]), and the name of its DeviceClass.
	HAMiDriver = "hami-core-gpu.project-hami.io"
	// HAMiType is the value of HAMi-DRA's "type" attribute, which its DeviceClass and webhook
	// select on.
	HAMiType = "hami-gpu"
)

// Capacity names (unqualified: they belong to the profile's driver).
const (
	// CapacityMemory is the device memory in bytes.
	CapacityMemory resourcev1.QualifiedName = "memory"
	// CapacityCores is the compute share in percent of the device.
	CapacityCores resourcev1.QualifiedName = "cores"
	// CapacityShares caps the allocations per device at the split count (SDK profile only).
	CapacityShares resourcev1.QualifiedName = "shares"
)

// Taint key suffixes; the full key is <driver>/<suffix> ([Profile.UnhealthyTaint],
// [Profile.OwnedByHAMiTaint]).
const (
	TaintUnhealthy   = "unhealthy"
	TaintOwnedByHAMi = "owned-by-hami"
	// TaintCordoned is the suffix of the key of the NoSchedule taint that an operator's
	// cordon (kubectl hami-doctor cordon, a DeviceTaintRule) puts on a device: no new claim
	// gets it, claims that hold it keep it.
	TaintCordoned = "cordoned"
)

// Errors, for errors.Is.
var (
	// ErrInvalidDevice: a scanned device cannot be published (no ID, too many devices for one
	// slice, ...).
	ErrInvalidDevice = errors.New("invalid device")
	// ErrInvalidResult: an allocation result of a claim cannot be read back (unknown device
	// name, missing or negative consumed capacity, another driver).
	ErrInvalidResult = errors.New("invalid allocation result")
)

// Profile is how the scanned GPUs are named in DRA: driver, device names, attributes,
// capacities and their defaults. [SDKProfile] and [HAMiProfile] are the two this package
// offers; a zero Profile is not valid.
type Profile struct {
	// Name is "sdk" or "hami", for flags and logs.
	Name string
	// Driver is the DRA driver name (ResourceSlice spec.driver, DeviceClass name).
	Driver string
	// DevicePrefix prefixes the GPU index in the device name: "gpu-" gives "gpu-0".
	DevicePrefix string
	// CoresDefault is the cores a claim that asks none consumes: 0 in the SDK profile (HAMi's
	// device-plugin meaning: no limit), 100 in HAMi-DRA's (exclusive compute).
	CoresDefault int64
	// Shares publishes the "shares" capacity (the split count).
	Shares bool
	// HAMiAttributes writes HAMi-DRA's attribute set (type=hami-gpu, minor, pcieBusID)
	// instead of the SDK's (type=<HAMi model>, index, numa, mode, resource.kubernetes.io/pciBusID).
	HAMiAttributes bool
}

// SDKProfile is the SDK's own profile: driver [SDKDriver], devices gpu-<index>, capacities
// memory, cores (default 0) and shares.
func SDKProfile() Profile {
	return Profile{Name: "sdk", Driver: SDKDriver, DevicePrefix: "gpu-", CoresDefault: 0, Shares: true}
}

// HAMiProfile is HAMi-DRA's contract verbatim: driver [HAMiDriver], devices
// hami-gpu-<index>, attribute type=[HAMiType], capacities cores (default 100) and memory.
func HAMiProfile() Profile {
	return Profile{Name: "hami", Driver: HAMiDriver, DevicePrefix: "hami-gpu-", CoresDefault: 100, HAMiAttributes: true}
}

// ProfileByName returns the profile named "sdk" ([SDKProfile]) or "hami" ([HAMiProfile]), as
// a flag names it.
func ProfileByName(name string) (Profile, error) {
	for _, p := range []Profile{SDKProfile(), HAMiProfile()} {
		if p.Name == name {
			return p, nil
		}
	}
	return Profile{}, fmt.Errorf("unknown DRA profile %q: use %q (the SDK's driver %s) or %q (HAMi-DRA's driver %s)",
		name, "sdk", SDKDriver, "hami", HAMiDriver)
}

// UnhealthyTaint is the taint key of an unhealthy device: <driver>/unhealthy.
func (p Profile) UnhealthyTaint() string { return p.Driver + "/" + TaintUnhealthy }

// OwnedByHAMiTaint is the taint key of a GPU the device-plugin world owns:
// <driver>/owned-by-hami.
func (p Profile) OwnedByHAMiTaint() string { return p.Driver + "/" + TaintOwnedByHAMi }

// DeviceName is the DRA device name of the GPU with NVML index i: p.DevicePrefix followed by
// i in decimal.
func (p Profile) DeviceName(i uint) string {
	return p.DevicePrefix + strconv.FormatUint(uint64(i), 10)
}

// IndexOf is the GPU index a device name of p names; false for a name that is not p's. Only
// the names [Profile.DeviceName] writes are p's: the prefix and a decimal index without sign
// or leading zeros that fits a uint ("gpu-01", "gpu-" and "gpu-+1" are not).
func (p Profile) IndexOf(name string) (uint, bool) {
	digits, ok := strings.CutPrefix(name, p.DevicePrefix)
	if !ok || digits == "" || (len(digits) > 1 && digits[0] == '0') {
		return 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	i, err := strconv.ParseUint(digits, 10, strconv.IntSize)
	if err != nil {
		return 0, false
	}
	return uint(i), true
}

// Extra is what the scan knows of a GPU besides its annotation.Device.
type Extra struct {
	// PCIBusID is the PCI address, e.g. "0000:07:00.0" (NVML's bus ID, lower-case, with a
	// 4-digit domain).
	PCIBusID string
	// NUMANode is the GPU's NUMA node as the kernel reports it (sysfs numa_node), nil when
	// the scan does not know it or the GPU has no NUMA affinity (numa_node -1): the standard
	// attribute resource.kubernetes.io/numaNode ([AttributeNUMANode]) is then left out, as
	// KEP-6072 asks. A negative value counts as unknown.
	NUMANode *int
}

// Options of [Devices].
type Options struct {
	// Profile names the devices; required.
	Profile Profile
	// Owned reports whether the DRA world owns a GPU. A GPU it does not own is published
	// with the NoSchedule taint <driver>/owned-by-hami so that no claim gets it. Nil: DRA
	// owns every GPU.
	Owned func(annotation.Device) bool
	// Extras are keyed by device ID (UUID).
	Extras map[string]Extra
}

// Devices maps the scanned devices to DRA devices, one per GPU, sorted by index (the
// allocator picks first fit in slice order). GPUs in MIG mode are left out ([Slices]
// publishes their placements). Unhealthy GPUs
// stay, with the NoSchedule taint <driver>/unhealthy. Errors wrap [ErrInvalidDevice].
//
// Every device allows multiple allocations and carries the capacities memory (Devmem MiB in
// bytes; requests in steps of 1 MiB, default the whole memory), cores (Devcore; requests
// 0..Devcore in steps of 1, default p.CoresDefault, at most Devcore) and, with p.Shares,
// shares (Count; every allocation takes 1, so Count allocations at most). A GPU that is not
// owned ([Options.Owned]) also gets the NoSchedule taint <driver>/owned-by-hami. An unhealthy
// GPU whose memory, cores or count the scan could not read (0 or less) publishes that capacity
// as 0 without a request policy: the taint keeps claims off it anyway.
//
// It fails, naming the device and the fix, for: no profile; a device with an empty ID; two
// devices with the same index or ID; a healthy device with Devmem, Devcore or Count of 0 or
// less; a string attribute over the API's 64 characters; and more devices than one slice may
// hold with taints, [resourcev1.ResourceSliceMaxDevicesWithAdvancedFeatures] (the limit
// applies whether a taint is set or not, so a GPU turning unhealthy never makes the slice
// invalid).
func Devices(devs []annotation.Device, opts Options) ([]resourcev1.Device, error) {
	p := opts.Profile
	if p.Driver == "" || p.DevicePrefix == "" {
		return nil, fmt.Errorf("map devices: no profile: set Options.Profile to dra.SDKProfile() or dra.HAMiProfile(): %w", ErrInvalidDevice)
	}
	if errs := validation.IsDNS1123Subdomain(p.Driver); len(errs) > 0 || len(p.Driver) > resourcev1.DriverNameMaxLength {
		return nil, fmt.Errorf("map devices: driver name %q of profile %q is not a DNS subdomain of at most %d characters: %w",
			p.Driver, p.Name, resourcev1.DriverNameMaxLength, ErrInvalidDevice)
	}
	published := make([]annotation.Device, 0, len(devs))
	for _, d := range devs {
		if d.Mode != ModeMIG {
			published = append(published, d)
		}
	}
	if n := len(published); n > resourcev1.ResourceSliceMaxDevicesWithAdvancedFeatures {
		return nil, fmt.Errorf("map devices: %d GPUs, but a ResourceSlice with device taints holds at most %d: publish fewer GPUs (nodedra.Options.GPUs): %w",
			n, resourcev1.ResourceSliceMaxDevicesWithAdvancedFeatures, ErrInvalidDevice)
	}
	slices.SortStableFunc(published, func(a, b annotation.Device) int { return cmp.Compare(a.Index, b.Index) })
	out := make([]resourcev1.Device, 0, len(published))
	ids := make(map[string]bool, len(published))
	for i, d := range published {
		if d.ID == "" {
			return nil, fmt.Errorf("map devices: GPU %d has an empty ID: the device source must set its UUID: %w", d.Index, ErrInvalidDevice)
		}
		if i > 0 && published[i-1].Index == d.Index {
			return nil, fmt.Errorf("map devices: GPUs %s and %s both have index %d: device names would collide: %w",
				published[i-1].ID, d.ID, d.Index, ErrInvalidDevice)
		}
		if ids[d.ID] {
			return nil, fmt.Errorf("map devices: GPU %s listed twice: %w", d.ID, ErrInvalidDevice)
		}
		ids[d.ID] = true
		dev, err := device(p, d, opts)
		if err != nil {
			return nil, fmt.Errorf("map devices: GPU %s (index %d): %w", d.ID, d.Index, err)
		}
		out = append(out, dev)
	}
	return out, nil
}

// ModeMIG is the [annotation.Device] Mode of a GPU split into MIG instances; [Devices] leaves
// such GPUs out.
const ModeMIG = "mig"

// AttributePCIBusID is the standard attribute of a device's PCI address
// (k8s.io/dynamic-resource-allocation/deviceattribute's StandardDeviceAttributePCIBusID).
const AttributePCIBusID resourcev1.QualifiedName = "resource.kubernetes.io/pciBusID"

// AttributeNUMANode is the standard attribute of a device's NUMA node, a scalar int
// (k8s.io/dynamic-resource-allocation/deviceattribute's StandardDeviceAttributeNUMANode,
// KEP-6072, GA in Kubernetes 1.37). Both profiles publish it when the scan knows the node
// ([Extra].NUMANode); a claim aligns GPUs with other devices through a matchAttribute
// constraint on it.
const AttributeNUMANode resourcev1.QualifiedName = "resource.kubernetes.io/numaNode"

// Size of one MiB, the unit of Devmem.
const mib = 1 << 20

// device maps one GPU that is to be published.
func device(p Profile, d annotation.Device, opts Options) (resourcev1.Device, error) {
	name := p.DeviceName(d.Index)
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return resourcev1.Device{}, fmt.Errorf("device name %q is not a DNS label (%s): fix the profile's DevicePrefix: %w",
			name, strings.Join(errs, "; "), ErrInvalidDevice)
	}
	if d.Health {
		for _, c := range []struct {
			field string
			v     int32
		}{{"Devmem", d.Devmem}, {"Devcore", d.Devcore}, {"Count", d.Count}} {
			if c.v <= 0 {
				return resourcev1.Device{}, fmt.Errorf("%s is %d on a healthy GPU: the device source must report it, or mark the GPU unhealthy: %w",
					c.field, c.v, ErrInvalidDevice)
			}
		}
	}
	extra := opts.Extras[d.ID]
	attrs := map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{}
	str := func(k resourcev1.QualifiedName, v string) { attrs[k] = resourcev1.DeviceAttribute{StringValue: &v} }
	num := func(k resourcev1.QualifiedName, v int64) { attrs[k] = resourcev1.DeviceAttribute{IntValue: &v} }
	product := strings.TrimPrefix(d.Type, "NVIDIA-")
	str("uuid", d.ID)
	str("productName", product)
	if p.HAMiAttributes {
		str("type", HAMiType)
		num("minor", int64(d.Index))
		if extra.PCIBusID != "" {
			str("pcieBusID", extra.PCIBusID)
		}
	} else {
		str("type", d.Type)
		num("index", int64(d.Index))
		num("numa", int64(d.Numa))
		if d.Mode != "" {
			str("mode", d.Mode)
		}
	}
	if extra.PCIBusID != "" {
		str(AttributePCIBusID, extra.PCIBusID)
	}
	if extra.NUMANode != nil && *extra.NUMANode >= 0 {
		num(AttributeNUMANode, int64(*extra.NUMANode))
	}
	for k, a := range attrs {
		if a.StringValue != nil && len(*a.StringValue) > resourcev1.DeviceAttributeMaxValueLength {
			return resourcev1.Device{}, fmt.Errorf("attribute %s %q is longer than the API's %d characters: %w",
				k, *a.StringValue, resourcev1.DeviceAttributeMaxValueLength, ErrInvalidDevice)
		}
	}

	coresDefault := min(max(p.CoresDefault, 0), int64(d.Devcore))
	caps := map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
		CapacityMemory: capacity(int64(d.Devmem)*mib, resource.BinarySI, func(v int64) *resourcev1.CapacityRequestPolicy {
			r := &resourcev1.CapacityRequestPolicyRange{Min: quantity(mib, resource.BinarySI)}
			if v >= 2*mib { // the API wants min+step within the value
				r.Step = quantity(mib, resource.BinarySI)
			}
			return &resourcev1.CapacityRequestPolicy{Default: quantity(v, resource.BinarySI), ValidRange: r}
		}),
		CapacityCores: capacity(int64(d.Devcore), resource.DecimalSI, func(v int64) *resourcev1.CapacityRequestPolicy {
			return &resourcev1.CapacityRequestPolicy{
				Default: quantity(coresDefault, resource.DecimalSI),
				ValidRange: &resourcev1.CapacityRequestPolicyRange{
					Min: quantity(0, resource.DecimalSI), Max: quantity(v, resource.DecimalSI), Step: quantity(1, resource.DecimalSI),
				},
			}
		}),
	}
	if p.Shares {
		caps[CapacityShares] = capacity(int64(d.Count), resource.DecimalSI, func(int64) *resourcev1.CapacityRequestPolicy {
			return &resourcev1.CapacityRequestPolicy{
				Default:     quantity(1, resource.DecimalSI),
				ValidValues: []resource.Quantity{*quantity(1, resource.DecimalSI)},
			}
		})
	}

	var taints []resourcev1.DeviceTaint
	if !d.Health {
		taints = append(taints, resourcev1.DeviceTaint{Key: p.UnhealthyTaint(), Effect: resourcev1.DeviceTaintEffectNoSchedule})
	}
	if opts.Owned != nil && !opts.Owned(d) {
		taints = append(taints, resourcev1.DeviceTaint{Key: p.OwnedByHAMiTaint(), Effect: resourcev1.DeviceTaintEffectNoSchedule})
	}
	shared := true
	return resourcev1.Device{
		Name:                     name,
		Attributes:               attrs,
		Capacity:                 caps,
		Taints:                   taints,
		AllowMultipleAllocations: &shared,
	}, nil
}

// capacity is a capacity of value v with the request policy policy(v); a value of 0 or less
// (an unhealthy GPU the scan could not read) is 0 without a policy, which the API would reject.
func capacity(v int64, f resource.Format, policy func(v int64) *resourcev1.CapacityRequestPolicy) resourcev1.DeviceCapacity {
	if v <= 0 {
		return resourcev1.DeviceCapacity{Value: *quantity(0, f)}
	}
	return resourcev1.DeviceCapacity{Value: *quantity(v, f), RequestPolicy: policy(v)}
}

func quantity(v int64, f resource.Format) *resource.Quantity { return resource.NewQuantity(v, f) }

// DeviceClass is the DeviceClass of p: named p.Driver, selecting the GPU devices of the
// driver, not its MIG devices (SDK profile: no attribute profile; HAMi profile: HAMi-DRA
// chart's CEL on type == "hami-gpu"). [MIGDeviceClass] selects the MIG devices.
func DeviceClass(p Profile) *resourcev1.DeviceClass {
	cel := fmt.Sprintf("device.driver == %q", p.Driver)
	if p.HAMiAttributes {
		cel += fmt.Sprintf(" && device.attributes[%q].type == %q", p.Driver, HAMiType)
	} else {
		cel += fmt.Sprintf(" && !has(device.attributes[%q].%s)", p.Driver, AttributeProfile)
	}
	return &resourcev1.DeviceClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: resourcev1.SchemeGroupVersion.String(), Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{Name: p.Driver},
		Spec: resourcev1.DeviceClassSpec{
			Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: cel}}},
		},
	}
}

// Consumed is what one allocation result takes from a GPU.
type Consumed struct {
	// Index is the GPU index of the result's device.
	Index uint
	// MemoryMiB is the consumed memory in MiB (rounded up); Cores the consumed cores.
	MemoryMiB, Cores int64
}

// ConsumedFromResult reads one allocation result of a claim: the device's GPU index and
// consumedCapacity. A result without consumedCapacity (a device not shared) consumes the
// whole GPU: its memory and cores from gpus, the node's scanned GPUs. A result of another
// driver, or naming a GPU not in gpus, is an error. Errors wrap [ErrInvalidResult].
//
// The consumed memory is rounded up to whole MiB, fractional cores up to whole cores. A
// consumedCapacity that lacks memory or cores, or holds a negative value or one beyond
// int64, is an error. p.CoresDefault is not applied: the allocator already wrote the
// request policy's default into consumedCapacity for a claim that asked no cores.
func ConsumedFromResult(p Profile, r resourcev1.DeviceRequestAllocationResult, gpus []annotation.Device) (Consumed, error) {
	fail := func(format string, args ...any) (Consumed, error) {
		return Consumed{}, fmt.Errorf("read allocation result %s/%s of request %q: %s: %w",
			r.Pool, r.Device, r.Request, fmt.Sprintf(format, args...), ErrInvalidResult)
	}
	if r.Driver != p.Driver {
		return fail("driver %q is not this profile's %q", r.Driver, p.Driver)
	}
	index, ok := p.IndexOf(r.Device)
	if !ok {
		return fail("not a device name of profile %q (want %s<index>)", p.Name, p.DevicePrefix)
	}
	i := slices.IndexFunc(gpus, func(g annotation.Device) bool { return g.Index == index && g.Mode != ModeMIG })
	if i < 0 {
		return fail("GPU %d is not a published GPU of this node", index)
	}
	c := Consumed{Index: index}
	if len(r.ConsumedCapacity) == 0 {
		c.MemoryMiB, c.Cores = max(int64(gpus[i].Devmem), 0), max(int64(gpus[i].Devcore), 0)
		return c, nil
	}
	memory, err := consumedValue(r.ConsumedCapacity, CapacityMemory)
	if err != nil {
		return fail("%v", err)
	}
	cores, err := consumedValue(r.ConsumedCapacity, CapacityCores)
	if err != nil {
		return fail("%v", err)
	}
	c.MemoryMiB = memory / mib
	if memory%mib != 0 {
		c.MemoryMiB++
	}
	c.Cores = cores
	return c, nil
}

// consumedValue is the consumed amount of capacity name, rounded up to an integer.
func consumedValue(consumed map[resourcev1.QualifiedName]resource.Quantity, name resourcev1.QualifiedName) (int64, error) {
	q, ok := consumed[name]
	switch {
	case !ok:
		return 0, fmt.Errorf("consumedCapacity has no %s", name)
	case q.Sign() < 0:
		return 0, fmt.Errorf("consumed %s %s is negative", name, q.String())
	case q.CmpInt64(math.MaxInt64) > 0:
		return 0, fmt.Errorf("consumed %s %s is beyond int64", name, q.String())
	}
	return q.Value(), nil // Value rounds a fraction up
}
