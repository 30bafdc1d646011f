package mig

import (
	"cmp"
	"slices"
	"strings"
)

// SortProfiles returns a copy of ps in the order HAMi master's scheduler tries profiles: by
// MemoryMB, then by SliceCount, ties in the published order.
func SortProfiles(ps []Profile) []Profile {
	out := slices.Clone(ps)
	slices.SortStableFunc(out, func(a, b Profile) int {
		return cmp.Or(cmp.Compare(a.MemoryMB, b.MemoryMB), cmp.Compare(a.SliceCount, b.SliceCount))
	})
	return out
}

// OrderedPlacements returns a copy of p's placements in the order HAMi master tries them:
// descending start for the "1g.*" and "3g.*" profiles (they fill a GPU from the top, leaving
// the low placements the larger profiles need), ascending start otherwise; equal starts keep
// the published order.
func OrderedPlacements(p Profile) []Placement {
	out := slices.Clone(p.Placements)
	high := strings.HasPrefix(p.Name, "1g.") || strings.HasPrefix(p.Name, "3g.")
	slices.SortStableFunc(out, func(a, b Placement) int {
		if high {
			return cmp.Compare(b.Start, a.Start)
		}
		return cmp.Compare(a.Start, b.Start)
	})
	return out
}

// SelectPlacement returns the first placement of p, in [OrderedPlacements] order, that
// overlaps none of occupied; false when every placement overlaps one (or p has none, or only
// placements of size 0).
func SelectPlacement(p Profile, occupied []Placement) (Placement, bool) {
	for _, pl := range OrderedPlacements(p) {
		if pl.Size == 0 {
			continue // a placement of no slice is not an instance
		}
		if !slices.ContainsFunc(occupied, func(o Placement) bool { return Overlaps(pl, o) }) {
			return pl, true
		}
	}
	return Placement{}, false
}

// Select chooses the profile and placement of one MIG device: the first profile in
// [SortProfiles] order with at least memMiB of memory and at least cores of Core that has a
// placement free of occupied ([SelectPlacement]). HAMi master checks the memory only; the
// cores are the SDK's rule for MIG GPUs (a request's gpucores picks a profile with that many
// cores; pass 0 for HAMi's choice). false when no profile fits.
func Select(profiles []Profile, occupied []Placement, memMiB, cores int32) (Profile, Placement, bool) {
	for _, p := range SortProfiles(profiles) {
		if p.MemoryMB < memMiB || p.Core < cores {
			continue
		}
		if pl, ok := SelectPlacement(p, occupied); ok {
			return p, pl, true
		}
	}
	return Profile{}, Placement{}, false
}
