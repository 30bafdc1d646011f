package dra_test

import (
	"errors"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
)

// fuzzMIGProfiles decodes MIG profiles from data: a name length and a name byte, then
// placements as (start, size) byte pairs until a 0xff.
func fuzzMIGProfiles(data []byte) []annotation.MigProfile {
	var out []annotation.MigProfile
	for len(data) >= 3 && len(out) < 8 {
		n, c := int(data[0]%70), data[1]
		data = data[2:]
		p := annotation.MigProfile{Name: strings.Repeat(string(rune("ab.+1gX_"[c%8])), n) + "g", MemoryMB: int32(c) * 100, Core: int32(c % 101)}
		for len(data) >= 2 && data[0] != 0xff {
			p.Placements = append(p.Placements, annotation.MigPlacement{Start: uint32(data[0] % 40), Size: uint32(data[1] % 10)})
			data = data[2:]
		}
		if len(data) > 0 {
			data = data[1:]
		}
		out = append(out, p)
	}
	return out
}

// FuzzSlices maps random GPUs, some in MIG mode with random profiles: Slices never panics,
// fails only with ErrInvalidDevice, what it returns is valid for the API, and every MIG
// device it publishes reads back (MIGFromResult) to its own attributes.
func FuzzSlices(f *testing.F) {
	f.Add([]byte{0, 0, 0, 20, 0, 0, 10, 0, 0xa0, 0, 0x80, 0, 100, 0x80, 0, 1}, []byte{5, 1, 0, 1, 1, 1, 0xff, 6, 4, 0, 2, 2, 2}, false, uint8(0))
	f.Add(make([]byte, 16*12), []byte{6, 6, 0, 8, 0xff, 6, 5, 0, 4, 4, 4}, true, uint8(3))
	f.Fuzz(func(t *testing.T, data, profiles []byte, hami bool, owned uint8) {
		p := dra.SDKProfile()
		if hami {
			p = dra.HAMiProfile()
		}
		gpus := fuzzGPUs(data)
		for i := range gpus {
			if gpus[i].Mode == "mig" && i%3 != 2 {
				gpus[i].MIGProfiles = fuzzMIGProfiles(profiles)
			}
		}
		opts := dra.Options{Profile: p, Owned: func(d annotation.Device) bool { return owned>>(d.Index%8)&1 == 0 }}
		got, err := dra.Slices(gpus, opts)
		if err != nil {
			if !errors.Is(err, dra.ErrInvalidDevice) || got != nil {
				t.Fatalf("Slices = %d slices, %v; want nil and an ErrInvalidDevice", len(got), err)
			}
			return
		}
		if errs := validateSlices(got); len(errs) > 0 {
			t.Fatalf("invalid for the API:\n%s", strings.Join(errs, "\n"))
		}
		for _, s := range got {
			for _, d := range s.Devices {
				r := resourcev1.DeviceRequestAllocationResult{Driver: p.Driver, Pool: "n", Device: d.Name}
				m, err := dra.MIGFromResult(p, r, gpus)
				if len(d.ConsumesCounters) == 0 {
					if err == nil {
						t.Fatalf("GPU device %s read back as MIG %+v", d.Name, m)
					}
					continue
				}
				if err != nil {
					t.Fatalf("MIG device %s: %v", d.Name, err)
				}
				if m.GPUUUID != *d.Attributes[dra.AttributeParentUUID].StringValue || int64(m.Placement.Start) != *d.Attributes[dra.AttributePlacementStart].IntValue {
					t.Fatalf("MIG device %s read back as %+v", d.Name, m)
				}
				if i := slicesIndex(gpus, m.GPUUUID); i < 0 || !opts.Owned(gpus[i]) {
					t.Fatalf("MIG device %s of a GPU the DRA world does not own", d.Name)
				}
			}
		}
	})
}

func slicesIndex(gpus []annotation.Device, id string) int {
	for i, g := range gpus {
		if g.ID == id && g.Mode == "mig" {
			return i
		}
	}
	return -1
}

// FuzzMIGFromResult reads random results against a node with MIG and shared GPUs: it never
// panics, fails only with ErrInvalidResult, and what it returns is a placement of a MIG GPU of
// the node whose device name is the result's.
func FuzzMIGFromResult(f *testing.F) {
	f.Add(false, "gpu.hamireg.io", "gpu-0-mig-1g-10gb-6")
	f.Add(true, "hami-core-gpu.project-hami.io", "hami-gpu-2-mig-7g-40gb-0")
	f.Add(false, "gpu.hamireg.io", "gpu-1-mig-1g-5gb-0")
	f.Add(false, "gpu.hamireg.io", "gpu--mig-")
	f.Add(false, "gpu.hamireg.io", "gpu-0-mig-1g-5gb-plus-me-3")
	f.Fuzz(func(t *testing.T, hami bool, driver, device string) {
		p := dra.SDKProfile()
		if hami {
			p = dra.HAMiProfile()
		}
		gpus := []annotation.Device{a100MIG(0, "GPU-a"), a100(1, "GPU-b"), a100MIG(2, "GPU-c"), {ID: "GPU-d", Index: 3, Mode: "mig"}}
		gpus[2].MIGProfiles = append(gpus[2].MIGProfiles, annotation.MigProfile{Name: "1g.5gb+me", Placements: []annotation.MigPlacement{{Start: 3, Size: 1}}})
		r := resourcev1.DeviceRequestAllocationResult{Request: "gpu/mig", Driver: driver, Pool: "n", Device: device}
		m, err := dra.MIGFromResult(p, r, gpus)
		if err != nil {
			if !errors.Is(err, dra.ErrInvalidResult) {
				t.Fatalf("MIGFromResult = %v, want an ErrInvalidResult", err)
			}
			return
		}
		if driver != p.Driver || !p.IsMIGDeviceName(device) || p.MIGDeviceName(m.Index, m.Profile.Name, m.Placement) != device ||
			(m.GPUUUID != "GPU-a" && m.GPUUUID != "GPU-c") {
			t.Fatalf("MIGFromResult(%s %s) = %+v", driver, device, m)
		}
	})
}
