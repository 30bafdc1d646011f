package annotation

import (
	"encoding/json"

	"github.com/hamireg/hamireg/internal/hamiwire"
)

// Version is a HAMi release, for the packages of this SDK that follow HAMi's behaviour where
// v2.9.0 and master differ (the wire shape here, the handshake decisions in package handshake,
// the pod side in package allocation); each says what differs.
type Version int

const (
	// VersionMaster is HAMi master (v2.10), the default.
	VersionMaster Version = iota
	// VersionV290 is HAMi v2.9.0.
	VersionV290
)

// String returns "master" or "v2.9.0".
func (v Version) String() string {
	if v == VersionV290 {
		return "v2.9.0"
	}
	return "master"
}

// Shape selects which HAMi version's wire struct the codec follows.
type Shape = Version

const (
	// ShapeMaster is HAMi master (v2.10): no "devicepairscore", optional "migProfiles".
	// It is the default.
	ShapeMaster = VersionMaster
	// ShapeV290 is HAMi v2.9.0: every element carries "devicepairscore":{}, no "migProfiles".
	ShapeV290 = VersionV290
)

// Encode returns the register annotation value HAMi master's node agent writes for devices,
// byte for byte: it is encoding/json over HAMi's own wire struct, as HAMi's encoder is, so the
// key order, the omitted zero values and Go's HTML-safe string escaping are HAMi's by
// construction. Devices are written in the order given; writers should pass them in canonical
// order ([SortDevices]) so that an unchanged device set always encodes to the same value. A nil
// or empty list encodes to "[]".
func Encode(devices []Device) string {
	return EncodeShape(devices, ShapeMaster)
}

// EncodeShape is [Encode] in the given HAMi version's shape: [ShapeV290] appends
// "devicepairscore":{} to every device and never writes "migProfiles".
func EncodeShape(devices []Device, shape Shape) string {
	var data []byte
	var err error
	if shape == ShapeV290 {
		data, err = json.Marshal(toWire(devices, toV290))
	} else {
		data, err = json.Marshal(toWire(devices, toMaster))
	}
	if err != nil {
		// Unreachable: the wire structs hold only strings, integers, booleans and slices of
		// them. HAMi's encoder returns "" in this case too.
		return ""
	}
	return string(data)
}

// Decode parses a register annotation value the way HAMi master's scheduler does (encoding/json
// into its device struct) and returns the devices in the order written.
//
// It accepts exactly what HAMi accepts, because it is the same decoder on the same struct: keys
// match case-insensitively, a duplicated key's last value wins, unknown keys are ignored,
// whitespace is free, numbers must be integers in the range of the field's type (no floats,
// exponents or quoted numbers), and "null" or "[]" give no devices without an error (nil for
// "null", an empty slice for "[]"). Fields HAMi knows but this package does not expose
// (custominfo, devicevendor, migtemplate) are still type-checked, so a value HAMi rejects is
// rejected here too.
//
// Decoding runs in two steps, the list and then each element, so that a failure is located:
// a [*DecodeError] wrapping [ErrMalformed] carries the byte offset, the element and the field of
// anything HAMi's decoder rejects, and [ErrInvalidElement] marks a null element, which HAMi
// accepts and then crashes on. A syntax error ranks before a bad value, a bad value before a
// null element. Decode never panics.
func Decode(value string) ([]Device, error) {
	return DecodeShape(value, ShapeMaster)
}

// DecodeShape is [Decode] for the given HAMi version's struct shape: with [ShapeV290] the
// "devicepairscore" object is type-checked and "migProfiles" ignored, as v2.9.0 does.
func DecodeShape(value string, shape Shape) ([]Device, error) {
	if shape == ShapeV290 {
		return decodeList(value, fromV290)
	}
	return decodeList(value, fromMaster)
}

// decodeList decodes value as a JSON list of W, converting each element with conv.
func decodeList[W any](value string, conv func(*W) Device) ([]Device, error) {
	data := []byte(value)
	var elems []json.RawMessage
	if err := json.Unmarshal(data, &elems); err != nil {
		return nil, jsonError(err, data, -1, nil)
	}
	if elems == nil {
		return nil, nil
	}
	devs := make([]Device, 0, len(elems))
	null := -1
	for i, raw := range elems {
		if string(raw) == "null" {
			if null < 0 {
				null = i
			}
			continue
		}
		var w W
		if err := json.Unmarshal(raw, &w); err != nil {
			return nil, jsonError(err, data, i, raw)
		}
		devs = append(devs, conv(&w))
	}
	if null >= 0 {
		return nil, &DecodeError{Kind: ErrInvalidElement, Offset: elementStart(data, null), Element: null,
			Msg: "null element (HAMi's scheduler crashes on it)"}
	}
	return devs, nil
}

// validatePairScores type-checks the topology score annotation the way HAMi's DecodePairScores
// does: encoding/json into a list of {"uuid": string, "score": {string: int}}.
func validatePairScores(value string) error {
	data := []byte(value)
	var scores []hamiwire.PairScore
	if err := json.Unmarshal(data, &scores); err != nil {
		return jsonError(err, data, -1, nil)
	}
	return nil
}

func toWire[W any](devices []Device, conv func(*Device) W) []W {
	out := make([]W, len(devices))
	for i := range devices {
		out[i] = conv(&devices[i])
	}
	return out
}

// toMaster and toV290 copy the fields HAMi's encoder copies (MarshalNodeDevices).
func toMaster(d *Device) hamiwire.DeviceMaster {
	return hamiwire.DeviceMaster{ID: d.ID, Index: d.Index, Count: d.Count, Devmem: d.Devmem, Devcore: d.Devcore,
		Type: d.Type, Numa: d.Numa, Mode: d.Mode, MIGProfiles: toWireProfiles(d.MIGProfiles), Health: d.Health}
}

func toV290(d *Device) hamiwire.DeviceV290 {
	return hamiwire.DeviceV290{ID: d.ID, Index: d.Index, Count: d.Count, Devmem: d.Devmem, Devcore: d.Devcore,
		Type: d.Type, Numa: d.Numa, Mode: d.Mode, Health: d.Health}
}

func fromMaster(w *hamiwire.DeviceMaster) Device {
	return Device{ID: w.ID, Index: w.Index, Count: w.Count, Devmem: w.Devmem, Devcore: w.Devcore,
		Type: w.Type, Numa: w.Numa, Mode: w.Mode, MIGProfiles: fromWireProfiles(w.MIGProfiles), Health: w.Health}
}

func fromV290(w *hamiwire.DeviceV290) Device {
	return Device{ID: w.ID, Index: w.Index, Count: w.Count, Devmem: w.Devmem, Devcore: w.Devcore,
		Type: w.Type, Numa: w.Numa, Mode: w.Mode, Health: w.Health}
}

// The profile conversions keep nil and empty apart: "placements" is written as null when nil.

func toWireProfiles(ps []MigProfile) []hamiwire.MigProfile {
	return convertSlice(ps, func(p MigProfile) hamiwire.MigProfile {
		return hamiwire.MigProfile{Name: p.Name, MemoryMB: p.MemoryMB, Core: p.Core, SliceCount: p.SliceCount,
			Placements: convertSlice(p.Placements, func(p MigPlacement) hamiwire.MigPlacement { return hamiwire.MigPlacement(p) })}
	})
}

func fromWireProfiles(ps []hamiwire.MigProfile) []MigProfile {
	return convertSlice(ps, func(p hamiwire.MigProfile) MigProfile {
		return MigProfile{Name: p.Name, MemoryMB: p.MemoryMB, Core: p.Core, SliceCount: p.SliceCount,
			Placements: convertSlice(p.Placements, func(p hamiwire.MigPlacement) MigPlacement { return MigPlacement(p) })}
	})
}

// convertSlice maps in through conv, keeping nil apart from empty.
func convertSlice[A, B any](in []A, conv func(A) B) []B {
	if in == nil {
		return nil
	}
	out := make([]B, len(in))
	for i, a := range in {
		out[i] = conv(a)
	}
	return out
}
