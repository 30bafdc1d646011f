package dra_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/mig"
)

// a100Profiles are the MIG profiles of an A100-SXM4-40GB as nvmlscan publishes them with the
// REV profile 1g.10gb allowlisted (the NVML answers of HAMi's vectors).
func a100Profiles() []annotation.MigProfile {
	ones := []annotation.MigPlacement{{Start: 0, Size: 1}, {Start: 1, Size: 1}, {Start: 2, Size: 1}, {Start: 3, Size: 1}, {Start: 4, Size: 1}, {Start: 5, Size: 1}, {Start: 6, Size: 1}}
	return []annotation.MigProfile{
		{Name: "1g.5gb", MemoryMB: 4864, Core: 15, SliceCount: 1, Placements: ones},
		{Name: "1g.10gb", MemoryMB: 9856, Core: 15, SliceCount: 1, Placements: []annotation.MigPlacement{{Start: 0, Size: 2}, {Start: 2, Size: 2}, {Start: 4, Size: 2}, {Start: 6, Size: 2}}},
		{Name: "2g.10gb", MemoryMB: 9856, Core: 29, SliceCount: 2, Placements: []annotation.MigPlacement{{Start: 0, Size: 2}, {Start: 2, Size: 2}, {Start: 4, Size: 2}}},
		{Name: "3g.20gb", MemoryMB: 19968, Core: 43, SliceCount: 3, Placements: []annotation.MigPlacement{{Start: 0, Size: 4}, {Start: 4, Size: 4}}},
		{Name: "7g.40gb", MemoryMB: 40192, Core: 100, SliceCount: 7, Placements: []annotation.MigPlacement{{Start: 0, Size: 8}}},
	}
}

// placementsPerA100 is the number of placements of a100Profiles.
const placementsPerA100 = 7 + 4 + 3 + 2 + 1

// a100MIG is a healthy A100 in MIG mode as nvmlscan registers it.
func a100MIG(index uint, id string) annotation.Device {
	return annotation.Device{ID: id, Index: index, Count: 7, Devmem: 40960, Devcore: 100, Type: "NVIDIA-A100-SXM4-40GB",
		Numa: 1, Mode: "mig", Health: true, MIGProfiles: a100Profiles()}
}

// validateSlices checks slices of one pool against the API's rules for devices (see
// validateDevices), counter sets and counter consumption (pkg/apis/resource/validation:
// devices or counters per slice, at most 8 sets of at most 32 DNS-label counters, at most 2
// consumptions per device naming a set of the pool and counters it has, no request policy
// on a device not shared), and device names unique in the pool.
func validateSlices(ss []dra.Slice) []string {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	sets := map[string]resourcev1.CounterSet{}
	for i, s := range ss {
		if s.Devices != nil && s.SharedCounters != nil {
			bad("slice %d has devices and counters", i)
		}
		if len(s.SharedCounters) > resourcev1.ResourceSliceMaxCounterSets {
			bad("slice %d: %d counter sets", i, len(s.SharedCounters))
		}
		for _, cs := range s.SharedCounters {
			if e := validation.IsDNS1123Label(cs.Name); len(e) > 0 {
				bad("counter set %q: %v", cs.Name, e)
			}
			if _, dup := sets[cs.Name]; dup {
				bad("counter set %q twice in the pool", cs.Name)
			}
			sets[cs.Name] = cs
			if len(cs.Counters) == 0 || len(cs.Counters) > resourcev1.ResourceSliceMaxCountersPerCounterSet {
				bad("counter set %q: %d counters", cs.Name, len(cs.Counters))
			}
			for k, c := range cs.Counters {
				if e := validation.IsDNS1123Label(k); len(e) > 0 {
					bad("counter %q of %s: %v", k, cs.Name, e)
				}
				if c.Value.Sign() < 0 {
					bad("counter %q of %s negative", k, cs.Name)
				}
			}
		}
	}
	names := map[string]bool{}
	for _, s := range ss {
		stripped := make([]resourcev1.Device, len(s.Devices))
		for i, d := range s.Devices {
			if names[d.Name] {
				bad("device %s twice in the pool", d.Name)
			}
			names[d.Name] = true
			shared := d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations
			if len(d.ConsumesCounters) > 0 && shared {
				bad("%s consumes counters and is shared (this package never does both)", d.Name)
			}
			if len(d.ConsumesCounters) > resourcev1.ResourceSliceMaxDeviceCounterConsumptionsPerDevice {
				bad("%s: %d counter consumptions", d.Name, len(d.ConsumesCounters))
			}
			for _, cc := range d.ConsumesCounters {
				set, ok := sets[cc.CounterSet]
				if !ok {
					bad("%s consumes from counter set %q, not in the pool", d.Name, cc.CounterSet)
				}
				if len(cc.Counters) == 0 || len(cc.Counters) > resourcev1.ResourceSliceMaxCountersPerDeviceCounterConsumption {
					bad("%s: %d counters consumed", d.Name, len(cc.Counters))
				}
				for k, v := range cc.Counters {
					c, ok := set.Counters[k]
					if !ok {
						bad("%s consumes counter %q that set %q lacks", d.Name, k, cc.CounterSet)
					} else if v.Value.Cmp(c.Value) > 0 {
						bad("%s consumes more of %q than there is", d.Name, k)
					}
				}
			}
			stripped[i] = d
			stripped[i].ConsumesCounters = nil
		}
		errs = append(errs, validateDevices(stripped)...)
	}
	return errs
}

func TestSlicesMIG(t *testing.T) {
	t.Parallel()
	gpus := []annotation.Device{a100(1, "GPU-shared"), a100MIG(0, "GPU-mig"), a100MIG(2, "GPU-hami")}
	p := dra.SDKProfile()
	got, err := dra.Slices(gpus, dra.Options{
		Profile: p,
		Owned:   func(d annotation.Device) bool { return d.ID != "GPU-hami" },
		Extras:  map[string]dra.Extra{"GPU-mig": {PCIBusID: "0000:07:00.0"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if errs := validateSlices(got); len(errs) > 0 {
		t.Fatalf("invalid for the API:\n%s", strings.Join(errs, "\n"))
	}
	if len(got) != 2 || len(got[0].SharedCounters) != 1 || len(got[1].Devices) != 1+placementsPerA100 {
		t.Fatalf("slices: %d; want a counter slice with one set and a device slice with the shared GPU and %d placements", len(got), placementsPerA100)
	}
	set := got[0].SharedCounters[0]
	if set.Name != "gpu-0-memory-slices" || len(set.Counters) != 8 {
		t.Errorf("counter set %s with %d counters, want gpu-0-memory-slices with 8", set.Name, len(set.Counters))
	}
	devs := got[1].Devices
	if devs[0].Name != "gpu-1" || len(devs[0].ConsumesCounters) != 0 {
		t.Errorf("first device %s, want the shared GPU gpu-1 first", devs[0].Name)
	}
	var names []string
	for _, d := range devs[1:] {
		names = append(names, d.Name)
	}
	want := []string{
		"gpu-0-mig-1g-5gb-6", "gpu-0-mig-1g-5gb-5", "gpu-0-mig-1g-5gb-4", "gpu-0-mig-1g-5gb-3", "gpu-0-mig-1g-5gb-2", "gpu-0-mig-1g-5gb-1", "gpu-0-mig-1g-5gb-0",
		"gpu-0-mig-1g-10gb-6", "gpu-0-mig-1g-10gb-4", "gpu-0-mig-1g-10gb-2", "gpu-0-mig-1g-10gb-0",
		"gpu-0-mig-2g-10gb-0", "gpu-0-mig-2g-10gb-2", "gpu-0-mig-2g-10gb-4",
		"gpu-0-mig-3g-20gb-4", "gpu-0-mig-3g-20gb-0",
		"gpu-0-mig-7g-40gb-0",
	}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("MIG devices in HAMi's packing order (-want +got):\n%s", diff)
	}
	d := devs[slices.IndexFunc(devs, func(d resourcev1.Device) bool { return d.Name == "gpu-0-mig-1g-10gb-2" })]
	attr := func(k resourcev1.QualifiedName) any {
		a := d.Attributes[k]
		switch {
		case a.StringValue != nil:
			return *a.StringValue
		case a.IntValue != nil:
			return *a.IntValue
		}
		return nil
	}
	wantAttrs := map[resourcev1.QualifiedName]any{
		"profile": "1g.10gb", "parentUUID": "GPU-mig", "placementStart": int64(2), "placementSize": int64(2),
		"type": "NVIDIA-A100-SXM4-40GB", "productName": "A100-SXM4-40GB", "mode": "mig", "index": int64(0), "numa": int64(1),
		dra.AttributePCIBusID: "0000:07:00.0",
	}
	gotAttrs := map[resourcev1.QualifiedName]any{}
	for k := range d.Attributes {
		gotAttrs[k] = attr(k)
	}
	if diff := cmp.Diff(wantAttrs, gotAttrs); diff != "" {
		t.Errorf("attributes of %s (-want +got):\n%s", d.Name, diff)
	}
	if d.AllowMultipleAllocations != nil {
		t.Errorf("%s allowMultipleAllocations = %v, want unset (a MIG device is not shared)", d.Name, *d.AllowMultipleAllocations)
	}
	if m := d.Capacity[dra.CapacityMemory]; m.Value.Value() != 9856<<20 || m.RequestPolicy != nil {
		t.Errorf("%s memory %s (policy %v), want 9856Mi without policy", d.Name, m.Value.String(), m.RequestPolicy)
	}
	if len(d.ConsumesCounters) != 1 || d.ConsumesCounters[0].CounterSet != set.Name ||
		!slices.Equal(slices.Sorted(maps.Keys(d.ConsumesCounters[0].Counters)), []string{"memory-slice-2", "memory-slice-3"}) {
		t.Errorf("%s consumes %+v, want memory slices 2 and 3 of %s", d.Name, d.ConsumesCounters, set.Name)
	}
	for _, d := range devs {
		if strings.HasPrefix(d.Name, "gpu-2") {
			t.Errorf("%s published: the MIG GPU the device plugin owns is left out", d.Name)
		}
	}
}

// Two placements overlap exactly when they share a counter: what the allocator refuses is
// what NVML refuses.
func TestSlicesCountersMatchOverlap(t *testing.T) {
	t.Parallel()
	got, err := dra.Slices([]annotation.Device{a100MIG(0, "GPU-a")}, dra.Options{Profile: dra.SDKProfile()})
	if err != nil {
		t.Fatal(err)
	}
	devs := got[1].Devices
	for _, a := range devs {
		for _, b := range devs {
			ma, _ := dra.MIGFromResult(dra.SDKProfile(), resourcev1.DeviceRequestAllocationResult{Driver: dra.SDKDriver, Device: a.Name}, []annotation.Device{a100MIG(0, "GPU-a")})
			mb, _ := dra.MIGFromResult(dra.SDKProfile(), resourcev1.DeviceRequestAllocationResult{Driver: dra.SDKDriver, Device: b.Name}, []annotation.Device{a100MIG(0, "GPU-a")})
			share := false
			for k := range a.ConsumesCounters[0].Counters {
				_, in := b.ConsumesCounters[0].Counters[k]
				share = share || in
			}
			if share != mig.Overlaps(ma.Placement, mb.Placement) {
				t.Errorf("%s and %s: share a counter %v, placements %+v %+v overlap %v", a.Name, b.Name, share, ma.Placement, mb.Placement, !share)
			}
		}
	}
}

func TestSlicesLimits(t *testing.T) {
	t.Parallel()
	var gpus []annotation.Device
	for i := range uint(10) {
		gpus = append(gpus, a100MIG(i, fmt.Sprintf("GPU-%d", i)))
	}
	gpus = append(gpus, a100(10, "GPU-10"))
	for _, p := range []dra.Profile{dra.SDKProfile(), dra.HAMiProfile()} {
		got, err := dra.Slices(gpus, dra.Options{Profile: p})
		if err != nil {
			t.Fatal(err)
		}
		if errs := validateSlices(got); len(errs) > 0 {
			t.Fatalf("%s: invalid for the API:\n%s", p.Name, strings.Join(errs, "\n"))
		}
		var sets, devs []int
		for _, s := range got {
			if s.SharedCounters != nil {
				sets = append(sets, len(s.SharedCounters))
			} else {
				devs = append(devs, len(s.Devices))
			}
		}
		total := 1 + 10*placementsPerA100
		if !slices.Equal(sets, []int{8, 2}) || !slices.Equal(devs, []int{64, 64, total - 128}) {
			t.Errorf("%s: counter sets per slice %v, devices per slice %v; want [8 2] and [64 64 %d]", p.Name, sets, devs, total-128)
		}
		if got[0].SharedCounters == nil {
			t.Errorf("%s: the counter slices must come first", p.Name)
		}
	}
}

func TestSlicesWithoutMIGIsDevices(t *testing.T) {
	t.Parallel()
	gpus := []annotation.Device{a100(0, "GPU-a"), a100(1, "GPU-b"), {ID: "GPU-m", Index: 2, Mode: "mig", Health: true}}
	opts := dra.Options{Profile: dra.SDKProfile()}
	devs, err := dra.Devices(gpus, opts)
	if err != nil {
		t.Fatal(err)
	}
	got, err := dra.Slices(gpus, opts)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]dra.Slice{{Devices: devs}}, got, quantityCmp); diff != "" {
		t.Errorf("Slices without a publishable MIG GPU (-Devices +Slices):\n%s", diff)
	}
}

func TestSlicesErrors(t *testing.T) {
	t.Parallel()
	tooWide := a100MIG(0, "GPU-a")
	tooWide.MIGProfiles = append(tooWide.MIGProfiles, annotation.MigProfile{Name: "9g.big", Placements: []annotation.MigPlacement{{Start: 30, Size: 3}}})
	empty := a100MIG(0, "GPU-a")
	empty.MIGProfiles[0].Placements[2].Size = 0
	clash := a100MIG(0, "GPU-a")
	clash.MIGProfiles = append(clash.MIGProfiles, annotation.MigProfile{Name: "1g_5gb", Placements: []annotation.MigPlacement{{Start: 0, Size: 1}}})
	noID := a100MIG(0, "")
	long := a100MIG(0, "GPU-a")
	long.MIGProfiles[0].Name = strings.Repeat("x", 60)
	tests := map[string]struct {
		gpus []annotation.Device
		want string
	}{
		"placements beyond 32 slices": {[]annotation.Device{tooWide}, "memory slice 32"},
		"placement of size 0":         {[]annotation.Device{empty}, "size 0"},
		"names collide":               {[]annotation.Device{clash}, "get the device name"},
		"no ID":                       {[]annotation.Device{noID}, "empty ID"},
		"index of a shared GPU":       {[]annotation.Device{a100(0, "GPU-b"), a100MIG(0, "GPU-a")}, "index 0"},
		"MIG GPU twice":               {[]annotation.Device{a100MIG(0, "GPU-a"), a100MIG(1, "GPU-a")}, "listed twice"},
		"MIG index twice":             {[]annotation.Device{a100MIG(0, "GPU-a"), a100MIG(0, "GPU-b")}, "both have index 0"},
		"name not a DNS label":        {[]annotation.Device{long}, "not a DNS label"},
	}
	for name, tc := range tests {
		_, err := dra.Slices(tc.gpus, dra.Options{Profile: dra.SDKProfile()})
		if !errors.Is(err, dra.ErrInvalidDevice) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want ErrInvalidDevice saying %q", name, err, tc.want)
		}
	}
}

func TestSlicesUnhealthyMIG(t *testing.T) {
	t.Parallel()
	g := a100MIG(0, "GPU-a")
	g.Health = false
	got, err := dra.Slices([]annotation.Device{g}, dra.Options{Profile: dra.HAMiProfile()})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range got[1].Devices {
		if !hasTaintKey(d, dra.HAMiProfile().UnhealthyTaint()) {
			t.Errorf("%s of an unhealthy GPU has taints %+v", d.Name, d.Taints)
		}
		if *d.Attributes["type"].StringValue != dra.MIGType {
			t.Errorf("%s type = %s, want %s in the HAMi profile", d.Name, *d.Attributes["type"].StringValue, dra.MIGType)
		}
	}
}

func hasTaintKey(d resourcev1.Device, key string) bool {
	return slices.ContainsFunc(d.Taints, func(t resourcev1.DeviceTaint) bool { return t.Key == key })
}

func TestMIGFromResult(t *testing.T) {
	t.Parallel()
	gpus := []annotation.Device{a100(1, "GPU-b"), a100MIG(0, "GPU-a"), a100MIG(2, "GPU-c")}
	for _, p := range []dra.Profile{dra.SDKProfile(), dra.HAMiProfile()} {
		got, err := dra.Slices(gpus, dra.Options{Profile: p})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, s := range got {
			for _, d := range s.Devices {
				r := resourcev1.DeviceRequestAllocationResult{Request: "mig", Driver: p.Driver, Pool: "node", Device: d.Name}
				if len(d.ConsumesCounters) == 0 {
					if p.IsMIGDeviceName(d.Name) {
						t.Errorf("%s: GPU device %s looks like a MIG device", p.Name, d.Name)
					}
					if _, err := dra.MIGFromResult(p, r, gpus); !errors.Is(err, dra.ErrInvalidResult) {
						t.Errorf("%s: MIGFromResult(%s) = %v, want ErrInvalidResult", p.Name, d.Name, err)
					}
					continue
				}
				n++
				if !p.IsMIGDeviceName(d.Name) {
					t.Errorf("%s: %s is not a MIG device name", p.Name, d.Name)
				}
				m, err := dra.MIGFromResult(p, r, gpus)
				if err != nil {
					t.Fatalf("%s: %v", p.Name, err)
				}
				if m.GPUUUID != *d.Attributes["parentUUID"].StringValue || m.Profile.Name != *d.Attributes["profile"].StringValue ||
					int64(m.Placement.Start) != *d.Attributes["placementStart"].IntValue || int64(m.Placement.Size) != *d.Attributes["placementSize"].IntValue ||
					p.MIGDeviceName(m.Index, m.Profile.Name, m.Placement) != d.Name {
					t.Errorf("%s: %s read back as %+v", p.Name, d.Name, m)
				}
				// The claim's consumedCapacity plays no part; ConsumedFromResult refuses it.
				if _, err := dra.ConsumedFromResult(p, r, gpus); !errors.Is(err, dra.ErrInvalidResult) {
					t.Errorf("%s: ConsumedFromResult(%s) = %v, want ErrInvalidResult", p.Name, d.Name, err)
				}
			}
		}
		if n != 2*placementsPerA100 {
			t.Errorf("%s: %d MIG devices, want %d", p.Name, n, 2*placementsPerA100)
		}
	}
	p := dra.SDKProfile()
	for name, r := range map[string]resourcev1.DeviceRequestAllocationResult{
		"other driver":        {Driver: "other", Device: "gpu-0-mig-1g-5gb-6"},
		"not a MIG name":      {Driver: p.Driver, Device: "gpu-0"},
		"GPU not in MIG mode": {Driver: p.Driver, Device: "gpu-1-mig-1g-5gb-6"},
		"unknown GPU":         {Driver: p.Driver, Device: "gpu-9-mig-1g-5gb-6"},
		"unknown placement":   {Driver: p.Driver, Device: "gpu-0-mig-1g-5gb-7"},
		"unknown profile":     {Driver: p.Driver, Device: "gpu-0-mig-4g-20gb-0"},
		"leading zero":        {Driver: p.Driver, Device: "gpu-00-mig-1g-5gb-6"},
	} {
		if m, err := dra.MIGFromResult(p, r, gpus); !errors.Is(err, dra.ErrInvalidResult) {
			t.Errorf("%s: MIGFromResult = %+v, %v; want ErrInvalidResult", name, m, err)
		}
	}
}
