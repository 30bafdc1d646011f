package vectors

import (
	"encoding/hex"
	"fmt"
)

// FileBytes is a file as the monitor vectors give it: Size bytes, zero except Segments.
type FileBytes struct {
	Size     int `json:"size"`
	Segments []struct {
		Offset int    `json:"offset"`
		Hex    string `json:"hex"`
	} `json:"segments"`
}

// Bytes returns the file's bytes.
func (f FileBytes) Bytes() ([]byte, error) {
	b := make([]byte, f.Size)
	for _, s := range f.Segments {
		v, err := hex.DecodeString(s.Hex)
		if err != nil {
			return nil, fmt.Errorf("segment at %d: %w", s.Offset, err)
		}
		if s.Offset < 0 || s.Offset+len(v) > len(b) {
			return nil, fmt.Errorf("segment at %d of %d bytes outside a %d-byte file", s.Offset, len(v), len(b))
		}
		copy(b[s.Offset:], v)
	}
	return b, nil
}

// RegionFields is a shared region described by fields, as the monitor vectors give it
// beside its exact bytes (input.entries[].region).
type RegionFields struct {
	Layout            string   `json:"layout"` // v0, v1.1, v1.2, v1.1-seqlock-first
	Num               uint64   `json:"num"`
	UUIDs             []string `json:"uuids"`
	Limits            []uint64 `json:"limits"`
	SMLimits          []uint64 `json:"sm_limits"`
	ProcNum           int32    `json:"procnum"`
	Procs             []Proc   `json:"procs"`
	UtilizationSwitch int32    `json:"utilization_switch"`
	RecentKernel      int32    `json:"recent_kernel"`
	Priority          int32    `json:"priority"`
	LastKernelTime    uint64   `json:"last_kernel_time"`
	FileSize          int64    `json:"file_size"`
}

// Proc is one process slot of a [RegionFields].
type Proc struct {
	Slot    int          `json:"slot"`
	PID     int32        `json:"pid"`
	HostPID int32        `json:"hostpid"`
	Status  int32        `json:"status"`
	Seq     uint64       `json:"seqlock"`
	Devices []ProcDevice `json:"devices"`
}

// ProcDevice is a process's accounting on one device.
type ProcDevice struct {
	Dev     int    `json:"dev"`
	Context uint64 `json:"context"`
	Module  uint64 `json:"module"`
	Data    uint64 `json:"data"`
	Offset  uint64 `json:"offset"`
	Total   uint64 `json:"total"`
	Monitor uint64 `json:"monitor"`
	SMUtil  uint64 `json:"sm_util"`
}

// FolderEntry is one entry of a container folder in the monitor vectors.
type FolderEntry struct {
	Name   string        `json:"name"`
	Empty  bool          `json:"empty"`
	Bytes  *FileBytes    `json:"bytes"`
	Region *RegionFields `json:"region"`
}

// Content returns the entry's file content: nil for an empty file.
func (e FolderEntry) Content() ([]byte, error) {
	if e.Bytes == nil {
		return nil, nil
	}
	return e.Bytes.Bytes()
}
