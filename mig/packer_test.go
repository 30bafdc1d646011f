package mig

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func at(start, size uint32) Placement { return Placement{Start: start, Size: size} }

// a100 is the A100-SXM4-40GB as HAMi master publishes it (mig-fit.json).
func a100() []Profile {
	ones := make([]Placement, 7)
	for i := range ones {
		ones[i] = Placement{Start: uint32(i), Size: 1}
	}
	return []Profile{
		{Name: "7g.40gb", MemoryMB: 40192, Core: 100, SliceCount: 7, Placements: []Placement{{Start: 0, Size: 8}}},
		{Name: "3g.20gb", MemoryMB: 19968, Core: 43, SliceCount: 3, Placements: []Placement{{Start: 0, Size: 4}, {Start: 4, Size: 4}}},
		{Name: "1g.5gb", MemoryMB: 4864, Core: 15, SliceCount: 1, Placements: ones},
		{Name: "4g.20gb", MemoryMB: 19968, Core: 57, SliceCount: 4, Placements: []Placement{{Start: 0, Size: 4}}},
		{Name: "2g.10gb", MemoryMB: 9856, Core: 29, SliceCount: 2, Placements: []Placement{{Start: 0, Size: 2}, {Start: 2, Size: 2}, {Start: 4, Size: 2}}},
	}
}

func TestSortProfiles(t *testing.T) {
	t.Parallel()
	in := a100()
	var names []string
	for _, p := range SortProfiles(in) {
		names = append(names, p.Name)
	}
	want := []string{"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
	if in[0].Name != "7g.40gb" {
		t.Errorf("SortProfiles sorted its argument: %v", in[0].Name)
	}
}

func TestOrderedPlacements(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		p    Profile
		want []Placement
	}{
		"1g descends": {Profile{Name: "1g.5gb", Placements: []Placement{at(0, 1), at(1, 1), at(2, 1)}}, []Placement{at(2, 1), at(1, 1), at(0, 1)}},
		"3g descends": {Profile{Name: "3g.20gb", Placements: []Placement{at(0, 4), at(4, 4)}}, []Placement{at(4, 4), at(0, 4)}},
		"2g ascends":  {Profile{Name: "2g.10gb", Placements: []Placement{at(4, 2), at(0, 2), at(2, 2)}}, []Placement{at(0, 2), at(2, 2), at(4, 2)}},
		"1g+me too":   {Profile{Name: "1g.5gb+me", Placements: []Placement{at(0, 1), at(6, 1)}}, []Placement{at(6, 1), at(0, 1)}},
		"10g ascends": {Profile{Name: "10g.x", Placements: []Placement{at(1, 1), at(0, 1)}}, []Placement{at(0, 1), at(1, 1)}},
		"none":        {Profile{Name: "1g.5gb"}, nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tc.want, OrderedPlacements(tc.p)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestSelect(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		occupied    []Placement
		mem, cores  int32
		wantProfile string
		wantAt      Placement
		wantOK      bool
	}{
		"4000 MiB: 1g at the top":         {mem: 4000, wantProfile: "1g.5gb", wantAt: at(6, 1), wantOK: true},
		"5 GiB is no 1g.5gb":              {mem: 5120, wantProfile: "2g.10gb", wantAt: at(0, 2), wantOK: true},
		"8000 MiB: 2g at the bottom":      {mem: 8000, wantProfile: "2g.10gb", wantAt: at(0, 2), wantOK: true},
		"15000 MiB: 3g at the top":        {mem: 15000, wantProfile: "3g.20gb", wantAt: at(4, 4), wantOK: true},
		"20480 MiB: 7g":                   {mem: 20480, wantProfile: "7g.40gb", wantAt: at(0, 8), wantOK: true},
		"above every profile":             {mem: 40500},
		"next free 1g":                    {occupied: []Placement{at(6, 1), at(5, 1)}, mem: 1, wantProfile: "1g.5gb", wantAt: at(4, 1), wantOK: true},
		"3g taken: the other 3g":          {occupied: []Placement{at(4, 4)}, mem: 15000, wantProfile: "3g.20gb", wantAt: at(0, 4), wantOK: true},
		"3g over {0,4}: 4g too, so 7g no": {occupied: []Placement{at(4, 4), at(1, 1)}, mem: 15000},
		"fragmented":                      {occupied: []Placement{at(6, 1), at(3, 1)}, mem: 15000},
		"the top 1g taken: the next one":  {occupied: []Placement{at(6, 1)}, mem: 4000, wantProfile: "1g.5gb", wantAt: at(5, 1), wantOK: true},
		"every slice taken":               {occupied: []Placement{at(0, 4), at(4, 4)}, mem: 0},
		"cores pick a larger profile":     {mem: 4000, cores: 20, wantProfile: "2g.10gb", wantAt: at(0, 2), wantOK: true},
		"cores above the free profiles":   {occupied: []Placement{at(1, 1), at(2, 1), at(3, 1), at(4, 1), at(5, 1), at(6, 1)}, mem: 4000, cores: 20},
		"only 1g left, no cores asked":    {occupied: []Placement{at(1, 1), at(2, 1), at(3, 1), at(4, 1), at(5, 1), at(6, 1)}, mem: 4000, wantProfile: "1g.5gb", wantAt: at(0, 1), wantOK: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p, at, ok := Select(a100(), tc.occupied, tc.mem, tc.cores)
			if ok != tc.wantOK || p.Name != tc.wantProfile || at != tc.wantAt {
				t.Errorf("Select = %s %v %v, want %s %v %v", p.Name, at, ok, tc.wantProfile, tc.wantAt, tc.wantOK)
			}
		})
	}
}

// TestSelectStacks places several devices on one GPU, each chosen with the ones before
// occupied: seven 1g, then nothing.
func TestSelectStacks(t *testing.T) {
	t.Parallel()
	var occupied []Placement
	for i := 6; i >= 0; i-- {
		_, at, ok := Select(a100(), occupied, 1000, 0)
		if !ok || at != (Placement{Start: uint32(i), Size: 1}) {
			t.Fatalf("device %d: %v %v", 6-i, at, ok)
		}
		occupied = append(occupied, at)
	}
	if p, at, ok := Select(a100(), occupied, 0, 0); ok {
		t.Errorf("an eighth device: %s %v", p.Name, at)
	}
}

// FuzzSelect: Select never panics, and what it returns is a placement of the profile it
// returns, with enough memory and cores, that overlaps nothing occupied; when it refuses,
// no profile with enough memory and cores has a free placement.
func FuzzSelect(f *testing.F) {
	f.Add([]byte{0, 1, 2, 1, 6, 1}, []byte{6, 1, 3, 1}, int32(4000), int32(0))
	f.Add([]byte{0, 8}, []byte{0, 0}, int32(0), int32(100))
	f.Add([]byte{255, 255, 0, 255}, []byte{254, 2}, int32(-1), int32(-5))
	f.Fuzz(func(t *testing.T, placements, occupiedRaw []byte, mem, cores int32) {
		pairs := func(b []byte, scale uint32) []Placement {
			var out []Placement
			for i := 0; i+1 < len(b); i += 2 {
				out = append(out, Placement{Start: uint32(b[i]) * scale, Size: uint32(b[i+1]) * scale})
			}
			return out
		}
		scale := uint32(1)
		if len(placements) > 0 && placements[0] == 255 {
			scale = 1 << 24 // reach the top of uint32
		}
		var profiles []Profile
		all := pairs(placements, scale)
		for i := 0; len(all) > 0; i++ {
			n := min(len(all), i%3+1)
			var buf [4]byte
			binary.LittleEndian.PutUint32(buf[:], uint32(i))
			profiles = append(profiles, Profile{Name: []string{"1g.a", "2g.b", "3g.c"}[i%3], MemoryMB: int32(buf[0]) * 1000, Core: int32(i * 7),
				SliceCount: uint32(i % 4), Placements: all[:n]})
			all = all[n:]
		}
		occupied := pairs(occupiedRaw, scale)
		p, at, ok := Select(profiles, occupied, mem, cores)
		if !ok {
			for _, q := range profiles {
				if q.MemoryMB < mem || q.Core < cores {
					continue
				}
				if pl, free := SelectPlacement(q, occupied); free {
					t.Fatalf("refused, but %s has %v free", q.Name, pl)
				}
			}
			return
		}
		if p.MemoryMB < mem || p.Core < cores {
			t.Fatalf("%s (%d MiB, %d cores) for %d MiB, %d cores", p.Name, p.MemoryMB, p.Core, mem, cores)
		}
		found := false
		for _, pl := range p.Placements {
			found = found || pl == at
		}
		if !found || at.Size == 0 {
			t.Fatalf("%v is not a placement of %s %v", at, p.Name, p.Placements)
		}
		for _, o := range occupied {
			if Overlaps(at, o) {
				t.Fatalf("%v overlaps occupied %v", at, o)
			}
		}
	})
}

// A 15000 MiB device on an A100-40GB whose top 3g placement is taken: the first profile by
// memory with enough of it and a free placement.
func ExampleSelect() {
	p, at, ok := Select(a100(), []Placement{{Start: 4, Size: 4}}, 15000, 0)
	fmt.Println(p.Name, at.Start, at.Size, ok)
	// Output: 3g.20gb 0 4 true
}
