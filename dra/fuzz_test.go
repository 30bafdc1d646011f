package dra_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
)

// fuzzGPUs decodes devices from data, 16 bytes each: index, mode, health and ID choice, type
// length, then count, devmem, devcore and numa as 3 bytes each (signed).
func fuzzGPUs(data []byte) []annotation.Device {
	var out []annotation.Device
	for len(data) >= 16 {
		b := data[:16]
		data = data[16:]
		i24 := func(off int) int32 {
			v := int32(binary.BigEndian.Uint32(append([]byte{0}, b[off:off+3]...)))
			return v - 1<<23
		}
		d := annotation.Device{
			Index:   uint(b[0] % 80),
			Mode:    []string{"hami-core", "mps", "mig", ""}[b[1]%4],
			Health:  b[2]&1 == 0,
			Type:    strings.Repeat("T", int(b[3]%70)),
			Count:   i24(4) % 200,
			Devmem:  i24(7),
			Devcore: i24(10) % 400,
			Numa:    int(i24(13) % 8),
		}
		switch b[2] >> 1 % 8 {
		case 0:
			d.ID = ""
		case 1:
			d.ID = "GPU-same"
		default:
			d.ID = fmt.Sprintf("GPU-%d-%d", d.Index, len(out))
		}
		out = append(out, d)
	}
	return out
}

// FuzzDevices maps random devices with both profiles: Devices never panics, fails only with
// ErrInvalidDevice, and what it returns is valid for the API, sorted and without MIG GPUs.
func FuzzDevices(f *testing.F) {
	f.Add([]byte{0, 0, 0, 20, 0, 0, 10, 0, 0xa0, 0, 0x80, 0, 100, 0x80, 0, 1}, false, uint8(0))
	f.Add([]byte{3, 1, 1, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 4, 5, 0x80, 0, 1, 0x80, 0, 2, 0x80, 0, 1, 0x80, 0, 0}, true, uint8(1))
	f.Add(make([]byte, 16*70), true, uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, hami bool, owned uint8) {
		p := dra.SDKProfile()
		if hami {
			p = dra.HAMiProfile()
		}
		devs := fuzzGPUs(data)
		extras := map[string]dra.Extra{}
		for _, d := range devs {
			if d.Index%3 == 0 {
				extras[d.ID] = dra.Extra{PCIBusID: fmt.Sprintf("0000:%02x:00.0", d.Index)}
			}
		}
		got, err := dra.Devices(devs, dra.Options{Profile: p, Extras: extras, Owned: func(d annotation.Device) bool { return d.Index%4 != uint(owned%4) }})
		if err != nil {
			if !errors.Is(err, dra.ErrInvalidDevice) || got != nil {
				t.Fatalf("Devices = %d devices, %v; want nil and an ErrInvalidDevice", len(got), err)
			}
			return
		}
		published := 0
		for _, d := range devs {
			if d.Mode != dra.ModeMIG {
				published++
			}
		}
		if len(got) != published {
			t.Fatalf("%d devices for %d GPUs not in MIG mode", len(got), published)
		}
		if errs := validateDevices(got); len(errs) > 0 {
			t.Fatalf("invalid for the API:\n%s", strings.Join(errs, "\n"))
		}
		for i := 1; i < len(got); i++ {
			a, _ := p.IndexOf(got[i-1].Name)
			b, ok := p.IndexOf(got[i].Name)
			if !ok || a >= b {
				t.Fatalf("devices %s, %s not sorted by index", got[i-1].Name, got[i].Name)
			}
		}
	})
}

// FuzzConsumedFromResult reads random results: it never panics, fails only with
// ErrInvalidResult, and what it returns names a GPU of the node with amounts of 0 or more.
func FuzzConsumedFromResult(f *testing.F) {
	f.Add(false, "gpu.hamireg.io", "gpu-0", "10Gi", "30", true, true)
	f.Add(true, "hami-core-gpu.project-hami.io", "hami-gpu-1", "3145728000", "100", true, true)
	f.Add(false, "gpu.hamireg.io", "gpu-1", "", "", false, false)
	f.Add(false, "gpu.hamireg.io", "gpu-01", "-1", "1e300", true, true)
	f.Add(false, "gpu.hamireg.io", "gpu-2", "0.000001", "9223372036854775807", true, false)
	f.Fuzz(func(t *testing.T, hami bool, driver, device, memory, cores string, withMemory, withCores bool) {
		p := dra.SDKProfile()
		if hami {
			p = dra.HAMiProfile()
		}
		gpus := []annotation.Device{a100(0, "GPU-a"), {ID: "GPU-b", Index: 1, Devmem: -5, Devcore: 50}, {ID: "GPU-m", Index: 2, Mode: "mig"}}
		r := resourcev1.DeviceRequestAllocationResult{Request: "gpu", Driver: driver, Pool: "n", Device: device}
		for _, c := range []struct {
			on    bool
			name  resourcev1.QualifiedName
			value string
		}{{withMemory, dra.CapacityMemory, memory}, {withCores, dra.CapacityCores, cores}} {
			if !c.on {
				continue
			}
			v, err := resource.ParseQuantity(c.value)
			if err != nil {
				continue
			}
			if r.ConsumedCapacity == nil {
				r.ConsumedCapacity = map[resourcev1.QualifiedName]resource.Quantity{}
			}
			r.ConsumedCapacity[c.name] = v
		}
		got, err := dra.ConsumedFromResult(p, r, gpus)
		if err != nil {
			if !errors.Is(err, dra.ErrInvalidResult) || got != (dra.Consumed{}) {
				t.Fatalf("ConsumedFromResult = %+v, %v; want zero and an ErrInvalidResult", got, err)
			}
			return
		}
		if got.Index > 1 || p.DeviceName(got.Index) != device || driver != p.Driver || got.MemoryMiB < 0 || got.Cores < 0 {
			t.Fatalf("ConsumedFromResult(%s %s) = %+v", driver, device, got)
		}
		if len(r.ConsumedCapacity) > 0 {
			// The smallest whole MiB that holds the consumed bytes (a fraction of a byte
			// counts as one).
			mem := r.ConsumedCapacity[dra.CapacityMemory]
			v := mem.Value()
			want := v / (1 << 20)
			if v%(1<<20) != 0 {
				want++
			}
			if got.MemoryMiB != want {
				t.Fatalf("memory %d bytes read as %d MiB, want %d", v, got.MemoryMiB, want)
			}
		}
	})
}
