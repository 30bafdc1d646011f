// Package hamiwire restates HAMi's wire structs (pkg/device DeviceInfo and its parts, v2.9.0
// and master) and finds HAMi's conformance vectors. encoding/json on these structs is what HAMi
// does, so the register codec (package annotation) encodes and decodes through them and is
// byte-identical with HAMi by construction; tests across the SDK compare the scanner and the
// scheduler cache with them. [VectorDirs] is for tests only.
package hamiwire

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

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

// VectorDirs returns HAMi's conformance vector folders (hami-<version>/) under
// $HAMIREG_VECTORS, else under shared/testdata in the nearest folder above the test's working
// directory that has one (the shared folder beside the repository, from a package at any
// depth). The value is true for v2.9.0 folders.
func VectorDirs() (map[string]bool, error) {
	root := cmp.Or(os.Getenv("HAMIREG_VECTORS"), findShared())
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("read conformance vectors: %w (set HAMIREG_VECTORS to the folder holding hami-<version>/)", err)
	}
	dirs := map[string]bool{}
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "hami-") {
			dirs[filepath.Join(root, e.Name())] = strings.HasPrefix(e.Name(), "hami-v2.9.")
		}
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("no hami-* vector folders in %s", root)
	}
	return dirs, nil
}

// ReadVectors decodes the vector file dir/name into v. It reports false, without an error, when
// the file does not exist (a vector folder may hold only some files).
func ReadVectors(dir, name string, v any) (bool, error) {
	data, err := os.ReadFile(filepath.Join(dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return false, fmt.Errorf("%s/%s: %w", dir, name, err)
	}
	return true, nil
}

// findShared returns the nearest shared/testdata above the working directory, or the relative
// path where one is expected beside the repository when there is none (the error then names it).
func findShared() string {
	fallback := filepath.Join("..", "..", "shared", "testdata")
	dir, err := os.Getwd()
	if err != nil {
		return fallback
	}
	for {
		candidate := filepath.Join(dir, "shared", "testdata")
		if info, err := os.Stat(candidate); err == nil && info.IsDir() {
			return candidate
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return fallback
		}
		dir = parent
	}
}
