package mig

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
)

// wireAllocation is HAMi master's MigAllocation as it travels in [KeyAllocations]: the field
// order is the key order of the encoding, and the runtime fields are omitted when unset.
type wireAllocation struct {
	ContainerIndex    int           `json:"containerIndex"`
	DeviceIndex       int           `json:"deviceIndex"`
	GPUUUID           string        `json:"gpuUUID"`
	Profile           string        `json:"profile"`
	Placement         wirePlacement `json:"placement"`
	MigUUID           string        `json:"migUUID,omitempty"`
	GPUInstanceID     *uint32       `json:"gpuInstanceID,omitempty"`
	ComputeInstanceID *uint32       `json:"computeInstanceID,omitempty"`
}

type wirePlacement struct {
	Start uint32 `json:"start"`
	Size  uint32 `json:"size"`
}

// DecodeAllocations decodes the value of [KeyAllocations] and checks it with HAMi master's
// rules: no negative containerIndex or deviceIndex, a non-empty gpuUUID and profile, a
// placement of size 1 or more, the runtime identity (migUUID, gpuInstanceID,
// computeInstanceID) all or none, and no two elements for one (containerIndex, deviceIndex).
// Every error wraps [ErrMalformed] and names the element's index and the field.
//
// The JSON is read by encoding/json, as HAMi reads it: unknown fields are ignored, field
// names match case-insensitively, a null runtime field counts as absent and an empty migUUID
// as no migUUID. An empty value (no annotation), "null" and "[]" decode to nil and no error:
// a pod without MIG reservations.
func DecodeAllocations(value string) ([]Allocation, error) {
	if value == "" {
		return nil, nil
	}
	var wire []wireAllocation
	if err := json.Unmarshal([]byte(value), &wire); err != nil {
		return nil, decodeError(value, err)
	}
	if len(wire) == 0 {
		return nil, nil
	}
	type key struct{ container, device int }
	seen := make(map[key]int, len(wire))
	out := make([]Allocation, 0, len(wire))
	for i, w := range wire {
		if err := checkWire(i, w); err != nil {
			return nil, err
		}
		k := key{w.ContainerIndex, w.DeviceIndex}
		if j, dup := seen[k]; dup {
			return nil, fmt.Errorf("%w: MIG allocation %d duplicates containerIndex %d deviceIndex %d of allocation %d",
				ErrMalformed, i, w.ContainerIndex, w.DeviceIndex, j)
		}
		seen[k] = i
		a := Allocation{
			ContainerIndex: w.ContainerIndex,
			DeviceIndex:    w.DeviceIndex,
			GPUUUID:        w.GPUUUID,
			Profile:        w.Profile,
			Placement:      Placement{Start: w.Placement.Start, Size: w.Placement.Size},
		}
		if w.MigUUID != "" {
			a.Runtime = &Runtime{MigUUID: w.MigUUID, GPUInstanceID: *w.GPUInstanceID, ComputeInstanceID: *w.ComputeInstanceID}
		}
		out = append(out, a)
	}
	return out, nil
}

// decodeError is the error of a value encoding/json refused: when the value is a JSON array,
// it names the first element that does not decode (encoding/json's message names the field).
func decodeError(value string, err error) error {
	var elems []json.RawMessage
	if json.Unmarshal([]byte(value), &elems) == nil {
		for i, e := range elems {
			var w wireAllocation
			if eerr := json.Unmarshal(e, &w); eerr != nil {
				return fmt.Errorf("decode %s: %w: MIG allocation %d: %w", KeyAllocations, ErrMalformed, i, eerr)
			}
		}
	}
	return fmt.Errorf("decode %s: %w: %w", KeyAllocations, ErrMalformed, err)
}

// checkWire applies HAMi's per-element rules to element i.
func checkWire(i int, w wireAllocation) error {
	switch {
	case w.ContainerIndex < 0:
		return fmt.Errorf("%w: MIG allocation %d has negative containerIndex %d", ErrMalformed, i, w.ContainerIndex)
	case w.DeviceIndex < 0:
		return fmt.Errorf("%w: MIG allocation %d has negative deviceIndex %d", ErrMalformed, i, w.DeviceIndex)
	case w.GPUUUID == "":
		return fmt.Errorf("%w: MIG allocation %d has empty gpuUUID", ErrMalformed, i)
	case w.Profile == "":
		return fmt.Errorf("%w: MIG allocation %d has empty profile", ErrMalformed, i)
	case w.Placement.Size == 0:
		return fmt.Errorf("%w: MIG allocation %d has placement size 0", ErrMalformed, i)
	}
	set := 0
	for _, ok := range []bool{w.MigUUID != "", w.GPUInstanceID != nil, w.ComputeInstanceID != nil} {
		if ok {
			set++
		}
	}
	if set != 0 && set != 3 {
		return fmt.Errorf("%w: MIG allocation %d has partial runtime identity (migUUID, gpuInstanceID, computeInstanceID: all or none)", ErrMalformed, i)
	}
	return nil
}

// EncodeAllocations encodes allocs as HAMi master's EncodeMigAllocations writes
// [KeyAllocations]: a JSON array with the keys containerIndex, deviceIndex, gpuUUID, profile,
// placement {start, size}, then, when Runtime is set, migUUID, gpuInstanceID and
// computeInstanceID (an empty MigUUID is omitted, as HAMi's omitempty does, and the value then
// has a partial runtime identity: a Runtime needs its MigUUID). The output is byte-exact with
// HAMi's for every value [DecodeAllocations] accepts.
//
// An empty list encodes to "": HAMi writes no [KeyAllocations] at all for a pod without MIG
// reservations (the scheduler's patch for a non-MIG device carries no such key), so a caller
// given "" omits the annotation (or, in a merge patch, removes it).
func EncodeAllocations(allocs []Allocation) string {
	if len(allocs) == 0 {
		return ""
	}
	wire := make([]wireAllocation, len(allocs))
	for i, a := range allocs {
		wire[i] = wireAllocation{
			ContainerIndex: a.ContainerIndex,
			DeviceIndex:    a.DeviceIndex,
			GPUUUID:        a.GPUUUID,
			Profile:        a.Profile,
			Placement:      wirePlacement{Start: a.Placement.Start, Size: a.Placement.Size},
		}
		if r := a.Runtime; r != nil {
			gi, ci := r.GPUInstanceID, r.ComputeInstanceID
			wire[i].MigUUID, wire[i].GPUInstanceID, wire[i].ComputeInstanceID = r.MigUUID, &gi, &ci
		}
	}
	data, err := json.Marshal(wire)
	if err != nil {
		// Unreachable: ints, strings and uint32 pointers always marshal.
		return ""
	}
	return string(data)
}

// Realized reports whether the node recorded the runtime identity of a's instance.
func (a Allocation) Realized() bool { return a.Runtime != nil }

// Find returns the reservations of container containerIndex, sorted by DeviceIndex (a new
// slice; the elements are copies, their Runtime pointers shared with allocs).
func Find(allocs []Allocation, containerIndex int) []Allocation {
	var out []Allocation
	for _, a := range allocs {
		if a.ContainerIndex == containerIndex {
			out = append(out, a)
		}
	}
	slices.SortStableFunc(out, func(a, b Allocation) int { return cmp.Compare(a.DeviceIndex, b.DeviceIndex) })
	return out
}

// WithRuntime returns a copy of allocs in which the reservation of (containerIndex,
// deviceIndex) carries r as its runtime identity, the other elements unchanged and in their
// order. It reports false, and returns allocs unchanged, when there is no such reservation.
// The copy shares no Runtime with allocs.
func WithRuntime(allocs []Allocation, containerIndex, deviceIndex int, r Runtime) ([]Allocation, bool) {
	i := slices.IndexFunc(allocs, func(a Allocation) bool {
		return a.ContainerIndex == containerIndex && a.DeviceIndex == deviceIndex
	})
	if i < 0 {
		return allocs, false
	}
	out := make([]Allocation, len(allocs))
	for j, a := range allocs {
		if a.Runtime != nil {
			rt := *a.Runtime
			a.Runtime = &rt
		}
		out[j] = a
	}
	out[i].Runtime = &r
	return out, true
}
