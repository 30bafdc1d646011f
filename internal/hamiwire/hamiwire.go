// Package hamiwire restates HAMi's wire structs (pkg/device DeviceInfo and its parts, v2.9.0
// and master). encoding/json on these structs is what HAMi does, so the register codec
// (package annotation) encodes and decodes through them and is byte-identical with HAMi by
// construction; tests across the SDK compare the scanner and the scheduler cache with them.
package hamiwire

// MigPlacement is HAMi master's MigPlacement.
type MigPlacement struct {
	Start uint32 `json:"start"`
	Size  uint32 `json:"size"`
}

// MigProfile is HAMi master's MigProfile.
type MigProfile struct {
	Name          string         `json:"name"`
	MemoryMB      int32          `json:"memoryMB"`
	Core          int32          `json:"core"`
	SliceCount    uint32         `json:"sliceCount"`
	Placements    []MigPlacement `json:"placements"`
	InstanceCount uint32         `json:"-"`
}

// MigTemplate is HAMi's MigTemplate; it has no JSON tags, so its keys are the Go field names.
type MigTemplate struct {
	Name   string
	Core   int32
	Memory int32
	Count  int32
}

// PairScore is HAMi's DevicePairScore.
type PairScore struct {
	ID     string         `json:"uuid,omitempty"`
	Scores map[string]int `json:"score,omitempty"`
}

// DeviceMaster is HAMi master's DeviceInfo.
type DeviceMaster struct {
	ID              string          `json:"id,omitempty"`
	Index           uint            `json:"index,omitempty"`
	Count           int32           `json:"count,omitempty"`
	Devmem          int32           `json:"devmem,omitempty"`
	Devcore         int32           `json:"devcore,omitempty"`
	Type            string          `json:"type,omitempty"`
	Numa            int             `json:"numa,omitempty"`
	Mode            string          `json:"mode,omitempty"`
	MIGProfiles     []MigProfile    `json:"migProfiles,omitempty"`
	MIGTemplate     [][]MigTemplate `json:"migtemplate,omitempty"`
	Health          bool            `json:"health,omitempty"`
	DeviceVendor    string          `json:"devicevendor,omitempty"`
	CustomInfo      map[string]any  `json:"custominfo,omitempty"`
	DevicePairScore PairScore       `json:"-"`
}

// DeviceV290 is HAMi v2.9.0's DeviceInfo: no MIG profiles, and a struct-valued
// DevicePairScore that omitempty never omits.
type DeviceV290 struct {
	ID              string          `json:"id,omitempty"`
	Index           uint            `json:"index,omitempty"`
	Count           int32           `json:"count,omitempty"`
	Devmem          int32           `json:"devmem,omitempty"`
	Devcore         int32           `json:"devcore,omitempty"`
	Type            string          `json:"type,omitempty"`
	Numa            int             `json:"numa,omitempty"`
	Mode            string          `json:"mode,omitempty"`
	MIGTemplate     [][]MigTemplate `json:"migtemplate,omitempty"`
	Health          bool            `json:"health,omitempty"`
	DeviceVendor    string          `json:"devicevendor,omitempty"`
	CustomInfo      map[string]any  `json:"custominfo,omitempty"`
	DevicePairScore PairScore       `json:"devicepairscore,omitempty"`
}
