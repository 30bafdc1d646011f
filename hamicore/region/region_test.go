package region_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/hamireg/hamireg/hamicore/region"
)

func sample(t *testing.T, layout region.Layout, procs int32) *region.Region {
	t.Helper()
	d := region.Device{MemoryLimit: 1 << 30}
	if err := d.SetUUID("GPU-0"); err != nil {
		t.Fatal(err)
	}
	r := &region.Region{Layout: layout, DeviceCount: 1, Devices: []region.Device{d}, ProcNum: procs, Priority: 1}
	for i := range procs {
		s := region.Slot{Index: int(i), PID: 10 + i, Status: 1}
		s.Used[0].Total = 100
		r.Slots = append(r.Slots, s)
	}
	return r
}

// flipReader returns the bytes of one slot changed on every other read, as a writer that
// holds the sequence lock odd would.
type flipReader struct {
	b     []byte
	at    int64
	reads int
	odd   bool
}

func (f *flipReader) ReadAt(p []byte, off int64) (int, error) {
	f.reads++
	n := copy(p, f.b[off:])
	if f.odd && off <= f.at && f.at < off+int64(len(p)) {
		binary.LittleEndian.PutUint64(p[f.at-off:], 3) // a write in progress
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func TestReadSkipsTornSlot(t *testing.T) {
	b, err := region.Encode(sample(t, region.LayoutV1, 2))
	if err != nil {
		t.Fatal(err)
	}
	// Slot 1's sequence word (1.2: slot offset 1936) stays odd: the slot is left out.
	r := &flipReader{b: b, at: 1856 + 1960 + 1936, odd: true}
	reg, err := region.Read(r, int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if reg.TornSlots != 1 || len(reg.Slots) != 1 || reg.Slots[0].Index != 0 {
		t.Fatalf("torn %d, slots %+v: want slot 1 left out", reg.TornSlots, len(reg.Slots))
	}
	if mem, _ := reg.Usage(0); mem.Total != 100 {
		t.Fatalf("usage %d, want slot 0's 100", mem.Total)
	}
}

func TestReadTruncatedUnderTheReader(t *testing.T) {
	b, err := region.Encode(sample(t, region.LayoutV1, 1))
	if err != nil {
		t.Fatal(err)
	}
	// The size was taken before the file shrank: every read beyond the new end is short.
	_, err = region.Read(bytes.NewReader(b[:4096]), int64(len(b)))
	if !errors.Is(err, region.ErrTruncated) || !errors.Is(err, region.ErrInvalid) {
		t.Fatalf("err %v, want ErrTruncated", err)
	}
}

func TestDetectTable(t *testing.T) {
	head := func(major, minor uint32) []byte {
		b := make([]byte, 12)
		binary.LittleEndian.PutUint32(b, region.Magic)
		binary.LittleEndian.PutUint32(b[4:], major)
		binary.LittleEndian.PutUint32(b[8:], minor)
		return b
	}
	for _, c := range []struct {
		size         int64
		major, minor uint32
		want         region.Layout
		err          error
	}{
		{1197897, 0, 0, region.LayoutV0, nil},
		{1197896, 7, 7, region.LayoutV0, nil},
		{2008953, 1, 2, region.LayoutV1, nil},
		{2008952, 1, 1, region.LayoutV1, nil},
		{2008985, 1, 1, region.LayoutV1SeqlockFirst, nil},
		{2008985, 1, 2, region.LayoutUnknown, region.ErrUnknownLayout},
		{2008953, 1, 3, region.LayoutUnknown, region.ErrUnknownLayout},
		{2008953, 2, 0, region.LayoutUnknown, region.ErrUnknownLayout},
		{1500000, 1, 2, region.LayoutUnknown, region.ErrUnknownLayout},
		{4096, 1, 2, region.LayoutUnknown, region.ErrUnknownLayout},
		{804681, 0, 0, region.LayoutUnknown, region.ErrUnknownLayout},
		{11, 1, 2, region.LayoutUnknown, region.ErrTooSmall},
	} {
		got, _, _, err := region.Detect(c.size, head(c.major, c.minor))
		if got != c.want || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
			t.Errorf("Detect(%d, %d.%d) = %v, %v; want %v, %v", c.size, c.major, c.minor, got, err, c.want, c.err)
		}
	}
	if _, _, _, err := region.Detect(2008953, make([]byte, 12)); !errors.Is(err, region.ErrNotInitialized) {
		t.Errorf("zero magic: %v", err)
	}
}

func TestWriteFileKeepsInodeAndWriteField(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.cache")
	r := sample(t, region.LayoutV0, 1)
	if err := region.WriteFile(path, r); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	r.Slots[0].Used[0].Total = 200
	if err := region.WriteFile(path, r); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(path)
	if !os.SameFile(before, after) || after.Size() != 1197897 {
		t.Fatalf("rewrite changed the file (same %v, size %d)", os.SameFile(before, after), after.Size())
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	if err := region.WriteField(f, region.LayoutV0, region.FieldRecentKernel, -1); err != nil {
		t.Fatal(err)
	}
	if err := region.WriteField(f, region.LayoutUnknown, region.FieldRecentKernel, -1); !errors.Is(err, region.ErrUnknownLayout) {
		t.Fatalf("unknown layout: %v", err)
	}
	got, err := region.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if mem, _ := got.Usage(0); got.RecentKernel != -1 || mem.Total != 200 {
		t.Fatalf("recent_kernel %d total %d, want -1 and 200", got.RecentKernel, mem.Total)
	}
}

func TestEncodeRefuses(t *testing.T) {
	for name, r := range map[string]*region.Region{
		"layout":  {},
		"size":    {Layout: region.LayoutV1, Size: 5000},
		"devices": {Layout: region.LayoutV1, Devices: make([]region.Device, 17)},
		"slot":    {Layout: region.LayoutV0, Slots: []region.Slot{{Index: 1024}}},
	} {
		if _, err := region.Encode(r); !errors.Is(err, region.ErrNotEncodable) {
			t.Errorf("%s: %v, want ErrNotEncodable", name, err)
		}
	}
	var d region.Device
	if err := d.SetUUID(string(make([]byte, 96))); !errors.Is(err, region.ErrNotEncodable) {
		t.Errorf("long UUID: %v", err)
	}
}
