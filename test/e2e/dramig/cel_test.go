package dramig_test

import (
	"strings"
	"testing"

	dracel "k8s.io/dynamic-resource-allocation/cel"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
)

// a100 is a healthy A100 shared through HAMi-core; a100MIG one in MIG mode with the
// allowlist's profiles (the NVML answers of HAMi's vectors).
func a100(index uint, id string) annotation.Device {
	return annotation.Device{ID: id, Index: index, Count: 10, Devmem: 40960, Devcore: 100, Type: "NVIDIA-A100-SXM4-40GB", Mode: "hami-core", Health: true}
}

func a100MIG(index uint, id string) annotation.Device {
	ones := []annotation.MigPlacement{{Start: 0, Size: 1}, {Start: 1, Size: 1}, {Start: 2, Size: 1}, {Start: 3, Size: 1}, {Start: 4, Size: 1}, {Start: 5, Size: 1}, {Start: 6, Size: 1}}
	return annotation.Device{ID: id, Index: index, Count: 7, Devmem: 40960, Devcore: 100, Type: "NVIDIA-A100-SXM4-40GB", Mode: "mig", Health: true,
		MIGProfiles: []annotation.MigProfile{
			{Name: "1g.5gb", MemoryMB: 4864, Core: 15, SliceCount: 1, Placements: ones},
			{Name: "1g.10gb", MemoryMB: 9856, Core: 15, SliceCount: 1, Placements: []annotation.MigPlacement{{Start: 0, Size: 2}, {Start: 2, Size: 2}, {Start: 4, Size: 2}, {Start: 6, Size: 2}}},
			{Name: "7g.40gb", MemoryMB: 40192, Core: 100, SliceCount: 7, Placements: []annotation.MigPlacement{{Start: 0, Size: 8}}},
		}}
}

// The classes' CEL, compiled and run as kube-scheduler does: the GPU class takes GPU devices
// and no MIG device, the MIG class the reverse, and the profile selector one profile.
func TestDeviceClassesCEL(t *testing.T) {
	t.Parallel()
	for _, p := range []dra.Profile{dra.SDKProfile(), dra.HAMiProfile()} {
		got, err := dra.Slices([]annotation.Device{a100(1, "GPU-b"), a100MIG(0, "GPU-a")}, dra.Options{Profile: p})
		if err != nil {
			t.Fatal(err)
		}
		compiler := dracel.GetCompiler(dracel.Features{EnableConsumableCapacity: true})
		compile := func(expr string) dracel.CompilationResult {
			r := compiler.CompileCELExpression(expr, dracel.Options{})
			if r.Error != nil {
				t.Fatalf("%s: compile %s: %v", p.Name, expr, r.Error)
			}
			return r
		}
		gpuClass := compile(dra.DeviceClass(p).Spec.Selectors[0].CEL.Expression)
		migClass := compile(dra.MIGDeviceClass(p).Spec.Selectors[0].CEL.Expression)
		oneG := compile(dra.ProfileSelector(p, "1g.10gb"))
		matches := 0
		for _, d := range got[1].Devices {
			in := dracel.Device{Driver: p.Driver, AllowMultipleAllocations: d.AllowMultipleAllocations, Attributes: d.Attributes, Capacity: d.Capacity}
			isMIG := len(d.ConsumesCounters) > 0
			for _, c := range []struct {
				name string
				r    dracel.CompilationResult
				want bool
			}{{"GPU class", gpuClass, !isMIG}, {"MIG class", migClass, isMIG}} {
				ok, _, err := c.r.DeviceMatches(t.Context(), in)
				if err != nil || ok != c.want {
					t.Errorf("%s: %s on %s = %v, %v; want %v", p.Name, c.name, d.Name, ok, err, c.want)
				}
			}
			if isMIG {
				ok, _, err := oneG.DeviceMatches(t.Context(), in)
				if err != nil {
					t.Errorf("%s: profile selector on %s: %v", p.Name, d.Name, err)
				}
				if ok {
					matches++
					if !strings.Contains(d.Name, "-mig-1g-10gb-") {
						t.Errorf("%s: profile selector 1g.10gb matches %s", p.Name, d.Name)
					}
				}
			}
		}
		if matches != 4 {
			t.Errorf("%s: profile selector 1g.10gb matches %d devices, want the 4 placements", p.Name, matches)
		}
		if c := dra.MIGDeviceClass(p); c.Name != "mig."+p.Driver || c.Kind != "DeviceClass" {
			t.Errorf("%s: MIG class %s %s", p.Name, c.Name, c.Kind)
		}
	}
}
