package region_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/hamireg/hamireg/hamicore/region"
)

// FuzzRead feeds arbitrary bytes to Read, placed at the start and the tail of files of every
// known size (the fuzzer's bytes alone are never large enough to be a region): Read never
// panics, returns either a classified error or a region whose counts are clamped.
func FuzzRead(f *testing.F) {
	for _, l := range []region.Layout{region.LayoutV0, region.LayoutV1, region.LayoutV1SeqlockFirst} {
		r := &region.Region{Layout: l, DeviceCount: 2, Devices: make([]region.Device, 2), ProcNum: 1,
			Slots: []region.Slot{{Index: 0, Status: 1}}}
		b, err := region.Encode(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[:2048], b[len(b)-64:], uint8(l), false)
	}
	f.Add([]byte{0x4e, 0xf7, 0x2f, 0x01, 1, 0, 0, 0, 2, 0, 0, 0}, []byte{0xff, 0xff, 0xff, 0xff}, uint8(1), true)
	f.Fuzz(func(t *testing.T, head, tail []byte, kind uint8, short bool) {
		sizes := []int{1197896, 1197897, 2008952, 2008953, 2008984, 2008985, len(head)}
		size := sizes[int(kind)%len(sizes)]
		b := make([]byte, size)
		copy(b, head)
		if len(tail) <= size {
			copy(b[size-len(tail):], tail)
		}
		if len(b) >= 4 && kind%2 == 0 {
			binary.LittleEndian.PutUint32(b, region.Magic)
		}
		claimed := int64(size)
		if short && size > 100 {
			b = b[:size/2] // truncated under the reader
		}
		reg, err := region.Read(bytes.NewReader(b), claimed)
		if err != nil {
			if !errors.Is(err, region.ErrInvalid) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if len(reg.Devices) > region.MaxDevices || len(reg.Slots)+reg.TornSlots > region.MaxSlots {
			t.Fatalf("%d devices, %d slots", len(reg.Devices), len(reg.Slots))
		}
		for i := range region.MaxDevices + 2 {
			reg.Usage(i - 1)
		}
		for i := range reg.Devices {
			_ = reg.Devices[i].UUID()
		}
	})
}
