package annotation

import (
	"encoding/json"

	"github.com/hamireg/hamireg/internal/hamiwire"
)

// HAMi's wire structs (internal/hamiwire) for the differential and conformance tests:
// encoding/json on these is "the way HAMi does it".

type (
	hamiMigPlacement = hamiwire.MigPlacement
	hamiMigProfile   = hamiwire.MigProfile
	hamiDeviceMaster = hamiwire.DeviceMaster
	hamiDeviceV290   = hamiwire.DeviceV290
)

func fromHAMiProfiles(ps []hamiMigProfile) []MigProfile {
	if ps == nil {
		return nil
	}
	out := make([]MigProfile, len(ps))
	for i, p := range ps {
		out[i] = MigProfile{Name: p.Name, MemoryMB: p.MemoryMB, Core: p.Core, SliceCount: p.SliceCount}
		if p.Placements != nil {
			out[i].Placements = make([]MigPlacement, len(p.Placements))
			for j, pl := range p.Placements {
				out[i].Placements[j] = MigPlacement(pl)
			}
		}
	}
	return out
}

func toHAMiProfiles(ps []MigProfile) []hamiMigProfile {
	if ps == nil {
		return nil
	}
	out := make([]hamiMigProfile, len(ps))
	for i, p := range ps {
		out[i] = hamiMigProfile{Name: p.Name, MemoryMB: p.MemoryMB, Core: p.Core, SliceCount: p.SliceCount}
		if p.Placements != nil {
			out[i].Placements = make([]hamiMigPlacement, len(p.Placements))
			for j, pl := range p.Placements {
				out[i].Placements[j] = hamiMigPlacement(pl)
			}
		}
	}
	return out
}

func fromHAMiMaster(h *hamiDeviceMaster) Device {
	return Device{ID: h.ID, Index: h.Index, Count: h.Count, Devmem: h.Devmem, Devcore: h.Devcore,
		Type: h.Type, Numa: h.Numa, Mode: h.Mode, MIGProfiles: fromHAMiProfiles(h.MIGProfiles), Health: h.Health}
}

func fromHAMiV290(h *hamiDeviceV290) Device {
	return Device{ID: h.ID, Index: h.Index, Count: h.Count, Devmem: h.Devmem, Devcore: h.Devcore,
		Type: h.Type, Numa: h.Numa, Mode: h.Mode, Health: h.Health}
}

// hamiMarshal encodes devices the way HAMi's MarshalNodeDevices does: copy the written fields
// into fresh structs and json.Marshal the slice of pointers.
func hamiMarshal(devs []Device, shape Shape) string {
	var data []byte
	var err error
	if shape == ShapeV290 {
		list := []*hamiDeviceV290{}
		for _, d := range devs {
			list = append(list, &hamiDeviceV290{ID: d.ID, Count: d.Count, Devmem: d.Devmem, Devcore: d.Devcore,
				Type: d.Type, Numa: d.Numa, Health: d.Health, Index: d.Index, Mode: d.Mode})
		}
		data, err = json.Marshal(list)
	} else {
		list := []*hamiDeviceMaster{}
		for _, d := range devs {
			list = append(list, &hamiDeviceMaster{ID: d.ID, Count: d.Count, Devmem: d.Devmem, Devcore: d.Devcore,
				Type: d.Type, Numa: d.Numa, Health: d.Health, Index: d.Index, Mode: d.Mode,
				MIGProfiles: toHAMiProfiles(d.MIGProfiles)})
		}
		data, err = json.Marshal(list)
	}
	if err != nil {
		return ""
	}
	return string(data)
}

// hamiUnmarshal decodes value the way HAMi's UnMarshalNodeDevices does and converts the result.
// hasNil reports a nil element (HAMi's scheduler panics on it).
func hamiUnmarshal(value string, shape Shape) (devs []Device, hasNil bool, err error) {
	if shape == ShapeV290 {
		return unmarshalAs(value, fromHAMiV290)
	}
	return unmarshalAs(value, fromHAMiMaster)
}

// unmarshalAs decodes value into HAMi's []*T with encoding/json and converts each element; a
// nil element becomes a zero Device and sets hasNil.
func unmarshalAs[T any](value string, convert func(*T) Device) (devs []Device, hasNil bool, err error) {
	var list []*T
	if err := json.Unmarshal([]byte(value), &list); err != nil {
		return nil, false, err
	}
	if list == nil {
		return nil, false, nil
	}
	devs = []Device{}
	for _, d := range list {
		if d == nil {
			hasNil = true
			devs = append(devs, Device{})
			continue
		}
		devs = append(devs, convert(d))
	}
	return devs, hasNil, nil
}
