package region_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hamireg/hamireg/hamicore/region"
	"github.com/hamireg/hamireg/internal/vectors"
)

type regionVector struct {
	Name  string `json:"name"`
	Input struct {
		Entries []vectors.FolderEntry `json:"entries"`
	} `json:"input"`
	WantError   string `json:"want_error"`
	WantNil     bool   `json:"want_nil"`
	WantLayout  string `json:"want_layout"`
	WantDevNum  *int   `json:"want_device_num"`
	WantPanic   any    `json:"want_panic"`
	WantDevices []struct {
		Index       int             `json:"index"`
		ValidUUID   json.RawMessage `json:"valid_uuid"`
		UUID40      string          `json:"uuid40"`
		MemoryLimit json.RawMessage `json:"memory_limit"`
		Context     json.RawMessage `json:"context"`
		Module      json.RawMessage `json:"module"`
		Buffer      json.RawMessage `json:"buffer"`
		Offset      json.RawMessage `json:"offset"`
		Total       json.RawMessage `json:"total"`
		SMUtil      json.RawMessage `json:"sm_util"`
	} `json:"want_devices"`
	WantPriority     *int32  `json:"want_priority"`
	WantRecentKernel *int32  `json:"want_recent_kernel"`
	WantSwitch       *int32  `json:"want_utilization_switch"`
	WantLastKernel   *uint64 `json:"want_last_kernel_time"`
}

// cacheEntry is the entry the SDK's monitor reads in a folder: the first, in name order, whose
// name ends with ".cache" (HAMi v2.10.0's rule; libvgpu.so and other files are ignored).
func cacheEntry(entries []vectors.FolderEntry) (vectors.FolderEntry, bool) {
	sorted := slices.Clone(entries)
	slices.SortFunc(sorted, func(a, b vectors.FolderEntry) int { return strings.Compare(a.Name, b.Name) })
	for _, e := range sorted {
		if strings.HasSuffix(e.Name, ".cache") {
			return e, true
		}
	}
	return vectors.FolderEntry{}, false
}

func layoutOf(name string) region.Layout {
	switch name {
	case "v0":
		return region.LayoutV0
	case "v1.1", "v1.2":
		return region.LayoutV1
	case "v1.1-seqlock-first":
		return region.LayoutV1SeqlockFirst
	}
	return region.LayoutUnknown
}

// fromFields builds the Region the vector's field description stands for, as Encode takes it.
func fromFields(t *testing.T, f *vectors.RegionFields) *region.Region {
	t.Helper()
	r := &region.Region{Layout: layoutOf(f.Layout), DeviceCount: f.Num, ProcNum: f.ProcNum, Size: f.FileSize,
		UtilizationSwitch: f.UtilizationSwitch, RecentKernel: f.RecentKernel, Priority: f.Priority}
	switch f.Layout {
	case "v1.1", "v1.1-seqlock-first":
		r.Major, r.Minor = 1, 1
	case "v1.2":
		r.Major, r.Minor = 1, 2
	}
	if r.Layout != region.LayoutV0 {
		r.LastKernelTime = f.LastKernelTime
	}
	n := max(len(f.UUIDs), len(f.Limits))
	if len(f.SMLimits) > n {
		n = len(f.SMLimits)
	}
	r.Devices = make([]region.Device, min(n, region.MaxDevices))
	for i := range r.Devices {
		d := &r.Devices[i]
		if i < len(f.UUIDs) {
			if err := d.SetUUID(f.UUIDs[i]); err != nil {
				t.Fatal(err)
			}
		}
		if i < len(f.Limits) {
			d.MemoryLimit = f.Limits[i]
		}
		if i < len(f.SMLimits) {
			d.SMLimit = f.SMLimits[i]
		}
	}
	for _, p := range f.Procs {
		s := region.Slot{Index: p.Slot, PID: p.PID, HostPID: p.HostPID, Status: p.Status, Seq: p.Seq}
		for _, d := range p.Devices {
			s.Used[d.Dev] = region.Memory{Context: d.Context, Module: d.Module, Data: d.Data, Offset: d.Offset, Total: d.Total}
			s.MonitorUsed[d.Dev] = d.Monitor
			s.Util[d.Dev].SM = d.SMUtil
		}
		r.Slots = append(r.Slots, s)
	}
	return r
}

// TestConformanceRegions reads every region of monitor-regions.json. The SDK's rule, asserted
// on every vector of both versions: a region is read by its layout's table (spec §9.2), the
// device count is clamped to 16, sums cover live slots (status != 0) below proc_num clamped
// to [0, 1024], and what HAMi fails on is a classified error. Where HAMi v2.10.0 reads the
// same layout, the SDK's values equal HAMi's; the seqlock-first layout (HAMi misreads it) is
// asserted against the region the file was written from.
func TestConformanceRegions(t *testing.T) {
	for _, folder := range vectors.Folders(t) {
		var file struct {
			Vectors []regionVector `json:"vectors"`
		}
		if !folder.Read(t, "monitor-regions.json", &file) {
			continue
		}
		checked := 0
		for _, v := range file.Vectors {
			t.Run(folder.Name()+"/"+v.Name, func(t *testing.T) {
				e, ok := cacheEntry(v.Input.Entries)
				if !ok {
					return // a folder without a cache: the monitor's folder rules (package monitor)
				}
				checked++
				raw, err := e.Content()
				if err != nil {
					t.Fatal(err)
				}
				if e.Region != nil {
					want, err := region.Encode(fromFields(t, e.Region))
					if err != nil {
						t.Fatalf("Encode: %v", err)
					}
					if !bytes.Equal(want, raw) {
						t.Fatalf("Encode of the vector's fields differs from its bytes at %d", firstDiff(want, raw))
					}
				}
				got, err := region.Read(bytes.NewReader(raw), int64(len(raw)))
				if e.Region == nil || layoutOf(e.Region.Layout) == region.LayoutUnknown || v.WantError != "" && !folder.V290 {
					checkError(t, v, err)
					return
				}
				if err != nil {
					t.Fatalf("Read: %v", err)
				}
				checkRule(t, e.Region, got)
				if !folder.V290 && got.Layout != region.LayoutV1SeqlockFirst {
					checkHAMi(t, v, got)
				}
			})
		}
		t.Logf("checked %d vectors from %s", checked, folder.Dir)
	}
}

// checkError asserts the classified error for a file HAMi refuses: the same class as HAMi's
// message.
func checkError(t *testing.T, v regionVector, err error) {
	t.Helper()
	var want error
	switch {
	case strings.Contains(v.WantError, "too small"):
		want = region.ErrTooSmall
	case strings.Contains(v.WantError, "magic"):
		want = region.ErrNotInitialized
	case strings.Contains(v.WantError, "unknown cache file size"):
		want = region.ErrUnknownLayout
	default:
		want = region.ErrInvalid
	}
	if !errors.Is(err, want) || !errors.Is(err, region.ErrInvalid) {
		t.Fatalf("Read error %v, want %v (HAMi: %q)", err, want, v.WantError)
	}
}

// checkRule asserts the SDK's rule against the fields the file was written from.
func checkRule(t *testing.T, f *vectors.RegionFields, got *region.Region) {
	t.Helper()
	if got.Layout != layoutOf(f.Layout) {
		t.Errorf("layout %v, want %v", got.Layout, layoutOf(f.Layout))
	}
	if want := min(f.Num, region.MaxDevices); uint64(len(got.Devices)) != want {
		t.Errorf("%d devices, want min(num %d, 16)", len(got.Devices), f.Num)
	}
	if got.Priority != f.Priority || got.RecentKernel != f.RecentKernel || got.UtilizationSwitch != f.UtilizationSwitch {
		t.Errorf("priority/recent_kernel/switch %d/%d/%d, want %d/%d/%d", got.Priority, got.RecentKernel, got.UtilizationSwitch,
			f.Priority, f.RecentKernel, f.UtilizationSwitch)
	}
	if want := f.LastKernelTime; got.Layout != region.LayoutV0 && got.LastKernelTime != want {
		t.Errorf("last_kernel_time %d, want %d", got.LastKernelTime, want)
	}
	limit := int(max(0, min(f.ProcNum, region.MaxSlots)))
	for i := range got.Devices {
		var want region.Memory
		var sm uint64
		for _, p := range f.Procs {
			if p.Slot >= limit || p.Status == 0 {
				continue
			}
			for _, d := range p.Devices {
				if d.Dev == i {
					want.Context += d.Context
					want.Module += d.Module
					want.Data += d.Data
					want.Offset += d.Offset
					want.Total += d.Total
					sm += d.SMUtil
				}
			}
		}
		mem, gotSM := got.Usage(i)
		if mem != want || gotSM != sm {
			t.Errorf("device %d: usage %+v sm %d, want %+v sm %d (live slots below proc_num)", i, mem, gotSM, want, sm)
		}
		wantUUID := ""
		if i < len(f.UUIDs) {
			wantUUID = f.UUIDs[i]
		}
		if got.Devices[i].UUID() != wantUUID {
			t.Errorf("device %d: UUID %q, want %q", i, got.Devices[i].UUID(), wantUUID)
		}
	}
}

// checkHAMi asserts HAMi v2.10.0's accessor values.
func checkHAMi(t *testing.T, v regionVector, got *region.Region) {
	t.Helper()
	if v.WantDevNum != nil && *v.WantDevNum != len(got.Devices) {
		t.Errorf("DeviceNum %d, HAMi %d", len(got.Devices), *v.WantDevNum)
	}
	if v.WantPriority != nil && *v.WantPriority != got.Priority || v.WantRecentKernel != nil && *v.WantRecentKernel != got.RecentKernel ||
		v.WantSwitch != nil && *v.WantSwitch != got.UtilizationSwitch || v.WantLastKernel != nil && *v.WantLastKernel != got.LastKernelTime {
		t.Errorf("header %d/%d/%d/%d differs from HAMi's", got.Priority, got.RecentKernel, got.UtilizationSwitch, got.LastKernelTime)
	}
	for _, w := range v.WantDevices {
		if w.Index >= len(got.Devices) {
			t.Errorf("HAMi reads device %d, the SDK has %d", w.Index, len(got.Devices))
			continue
		}
		d := &got.Devices[w.Index]
		mem, sm := got.Usage(w.Index)
		uuid40 := string(d.RawUUID[:40])
		valid := string(w.ValidUUID) == "true"
		if limit, ok := number(w.MemoryLimit); d.ValidUUID() != valid || !ok || d.MemoryLimit != limit || valid && uuid40 != w.UUID40 {
			t.Errorf("device %d: valid %v uuid40 %q limit %d, HAMi %v %q %d", w.Index, d.ValidUUID(), uuid40, d.MemoryLimit, w.ValidUUID, w.UUID40, w.MemoryLimit)
		}
		for _, c := range []struct {
			got  uint64
			want json.RawMessage
		}{{mem.Context, w.Context}, {mem.Module, w.Module}, {mem.Data, w.Buffer}, {mem.Offset, w.Offset}, {mem.Total, w.Total}, {sm, w.SMUtil}} {
			if n, ok := number(c.want); !ok || n != c.got {
				t.Errorf("device %d: sums %+v sm %d, HAMi %+v", w.Index, mem, sm, w)
				break
			}
		}
	}
}

// number reads a JSON unsigned integer exactly; ok is false for anything else (a recorded panic).
func number(raw json.RawMessage) (uint64, bool) {
	n, err := strconv.ParseUint(string(raw), 10, 64)
	return n, err == nil
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
