package nvmlscan_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/hamireg/hamireg/internal/vectors"
	"github.com/hamireg/hamireg/mig"
)

// The NVML that HAMi's MIG vectors were fed (input.nvml of mig-register.json and
// mig-allocate.json), built on go-nvml's moq structs and following input.nvml.rules:
// GetMaxMigDeviceCount 7 with MIG on, else 0; GetMigDeviceHandleByIndex(i) the i-th MIG
// device ordered by GPU instance id then compute instance id, ERROR_NOT_FOUND past the end;
// CreateGpuInstanceWithPlacement ERROR_NOT_SUPPORTED with MIG off, ERROR_INVALID_ARGUMENT for
// a placement not possible, ERROR_INSUFFICIENT_RESOURCES on overlap; GPU instance ids from 1,
// compute instance ids from 0 per GPU instance; SetMigMode(1) makes current = pending = 1; a
// model without MIG answers every MIG call ERROR_NOT_SUPPORTED.

// vecNVML is input.nvml.
type vecNVML struct {
	Devices []vecDevice         `json:"devices"`
	Models  map[string]vecModel `json:"models"`
}

type vecDevice struct {
	Index          int           `json:"index"`
	MigModeCurrent int           `json:"mig_mode_current"`
	MigModePending int           `json:"mig_mode_pending"`
	Model          string        `json:"model"`
	PCIBusID       string        `json:"pci_bus_id"`
	UUID           string        `json:"uuid"`
	Existing       []vecInstance `json:"existing_gpu_instances"`
}

type vecInstance struct {
	ComputeInstanceID uint32        `json:"compute_instance_id"`
	GPUInstanceID     uint32        `json:"gpu_instance_id"`
	MigUUID           string        `json:"mig_uuid"`
	Placement         mig.Placement `json:"placement"`
	Profile           int           `json:"profile"`
}

type vecModel struct {
	Name             string `json:"name"`
	MemoryTotalBytes uint64 `json:"memory_total_bytes"`
	// Profiles is a list of vecProfile, or a string for a model without MIG.
	Profiles json.RawMessage `json:"gpu_instance_profiles"`
}

type vecProfile struct {
	Info struct {
		ID                  uint32 `json:"id"`
		IsP2PSupported      uint32 `json:"is_p2p_supported"`
		SliceCount          uint32 `json:"slice_count"`
		InstanceCount       uint32 `json:"instance_count"`
		MultiprocessorCount uint32 `json:"multiprocessor_count"`
		CopyEngineCount     uint32 `json:"copy_engine_count"`
		DecoderCount        uint32 `json:"decoder_count"`
		EncoderCount        uint32 `json:"encoder_count"`
		JpegCount           uint32 `json:"jpeg_count"`
		OfaCount            uint32 `json:"ofa_count"`
		MemorySizeMB        uint64 `json:"memory_size_mb"`
	} `json:"info"`
	MigName    string          `json:"mig_name"`
	Placements []mig.Placement `json:"placements"`
	Profile    int             `json:"profile"`
}

// profiles decodes the model's profile table; nil for a model without MIG.
func (m vecModel) profiles(tb testing.TB) map[int]vecProfile {
	tb.Helper()
	var list []vecProfile
	if len(m.Profiles) == 0 || m.Profiles[0] != '[' {
		return nil
	}
	if err := json.Unmarshal(m.Profiles, &list); err != nil {
		tb.Fatalf("model %s: %v", m.Name, err)
	}
	out := make(map[int]vecProfile, len(list))
	for _, p := range list {
		out[p.Profile] = p
	}
	return out
}

func (p vecProfile) info() nvml.GpuInstanceProfileInfo {
	i := p.Info
	return nvml.GpuInstanceProfileInfo{Id: i.ID, IsP2pSupported: i.IsP2PSupported, SliceCount: i.SliceCount,
		InstanceCount: i.InstanceCount, MultiprocessorCount: i.MultiprocessorCount, CopyEngineCount: i.CopyEngineCount,
		DecoderCount: i.DecoderCount, EncoderCount: i.EncoderCount, JpegCount: i.JpegCount, OfaCount: i.OfaCount,
		MemorySizeMB: i.MemorySizeMB}
}

// fakeNVML is the library; its counters say what was called.
type fakeNVML struct {
	*mock.Interface
	gpus []*fakeGPU

	mu                           sync.Mutex
	inits, shutdowns, migQueries int
}

// fakeGPU is one GPU and its MIG state.
type fakeGPU struct {
	lib      *fakeNVML
	dev      *mock.Device
	spec     vecDevice
	model    vecModel
	profiles map[int]vecProfile // nil: no MIG
	current  int
	pending  int
	nextGI   uint32
	gis      []*fakeGI
}

type fakeGI struct {
	gpu       *fakeGPU
	handle    *mock.GpuInstance
	id        uint32
	enum      int
	profileID uint32
	slices    uint32
	placement mig.Placement
	nextCI    uint32
	cis       []*fakeCI
}

type fakeCI struct {
	gi      *fakeGI
	handle  *mock.ComputeInstance
	id      uint32
	migUUID string
	mdev    *mock.Device
}

// loadModels returns the models of the first vector of the master mig-register.json, for
// tests that need an A100 without a vector of their own.
func loadModels(t *testing.T) map[string]vecModel {
	t.Helper()
	for _, f := range vectors.Folders(t) {
		if f.V290 {
			continue
		}
		var file struct {
			Vectors []struct {
				Input struct {
					NVML vecNVML `json:"nvml"`
				} `json:"input"`
			} `json:"vectors"`
		}
		if f.Read(t, "mig-register.json", &file) {
			out := make(map[string]vecModel)
			for _, v := range file.Vectors {
				for k, m := range v.Input.NVML.Models {
					out[k] = m
				}
			}
			return out
		}
	}
	t.Fatal("no master mig-register.json")
	return nil
}

// newFakeNVML builds the NVML of in.
func newFakeNVML(t *testing.T, in vecNVML) *fakeNVML {
	t.Helper()
	f := &fakeNVML{}
	for _, d := range in.Devices {
		model, ok := in.Models[d.Model]
		if !ok {
			t.Fatalf("device %d: no model %q", d.Index, d.Model)
		}
		g := &fakeGPU{lib: f, spec: d, model: model, profiles: model.profiles(t),
			current: d.MigModeCurrent, pending: d.MigModePending, nextGI: 1}
		g.wire()
		for _, e := range d.Existing {
			p, ok := g.profiles[e.Profile]
			if !ok {
				t.Fatalf("device %d: existing instance of unknown profile %d", d.Index, e.Profile)
			}
			gi := g.addGI(e.GPUInstanceID, p, e.Placement)
			gi.addCI(e.ComputeInstanceID, e.MigUUID)
			g.nextGI = max(g.nextGI, e.GPUInstanceID+1)
		}
		f.gpus = append(f.gpus, g)
	}
	f.Interface = &mock.Interface{
		InitFunc: func() nvml.Return {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.inits++
			return nvml.SUCCESS
		},
		ShutdownFunc: func() nvml.Return {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.shutdowns++
			return nvml.SUCCESS
		},
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(f.gpus), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(f.gpus) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return f.gpus[i].dev, nvml.SUCCESS
		},
		DeviceGetHandleByUUIDFunc: func(uuid string) (nvml.Device, nvml.Return) {
			for _, g := range f.gpus {
				if g.spec.UUID == uuid {
					return g.dev, nvml.SUCCESS
				}
			}
			return nil, nvml.ERROR_NOT_FOUND
		},
	}
	return f
}

// counts returns the Init, Shutdown and GetMigMode calls so far.
func (f *fakeNVML) counts() (inits, shutdowns, migQueries int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inits, f.shutdowns, f.migQueries
}

// live lists the MIG devices of GPU i as (profile id, placement, GI id, CI id, MIG UUID).
func (f *fakeNVML) live(i int) []mig.Instance {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := f.gpus[i]
	var out []mig.Instance
	for _, gi := range g.gis {
		for _, ci := range gi.cis {
			out = append(out, mig.Instance{GPUUUID: g.spec.UUID, ProfileID: gi.profileID, Placement: gi.placement,
				Runtime: mig.Runtime{MigUUID: ci.migUUID, GPUInstanceID: gi.id, ComputeInstanceID: ci.id}})
		}
	}
	return out
}

func (g *fakeGPU) profile(enum int) (vecProfile, nvml.Return) {
	if enum < 0 || enum >= nvml.GPU_INSTANCE_PROFILE_COUNT {
		return vecProfile{}, nvml.ERROR_INVALID_ARGUMENT
	}
	p, ok := g.profiles[enum]
	if !ok {
		return vecProfile{}, nvml.ERROR_NOT_SUPPORTED
	}
	return p, nvml.SUCCESS
}

func (g *fakeGPU) profileByID(id uint32) (vecProfile, bool) {
	for _, p := range g.profiles {
		if p.Info.ID == id {
			return p, true
		}
	}
	return vecProfile{}, false
}

// migDevices are the GPU's MIG devices in NVML's order: GI id, then CI id.
func (g *fakeGPU) migDevices() []*fakeCI {
	var out []*fakeCI
	for _, gi := range g.gis {
		out = append(out, gi.cis...)
	}
	slices.SortFunc(out, func(a, b *fakeCI) int {
		if a.gi.id != b.gi.id {
			return int(a.gi.id) - int(b.gi.id)
		}
		return int(a.id) - int(b.id)
	})
	return out
}

func (g *fakeGPU) wire() {
	f := g.lib
	g.dev = &mock.Device{
		GetUUIDFunc:  func() (string, nvml.Return) { return g.spec.UUID, nvml.SUCCESS },
		GetIndexFunc: func() (int, nvml.Return) { return g.spec.Index, nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: g.model.MemoryTotalBytes}, nvml.SUCCESS
		},
		GetNameFunc: func() (string, nvml.Return) { return g.model.Name, nvml.SUCCESS },
		GetPciInfoFunc: func() (nvml.PciInfo, nvml.Return) {
			var pci nvml.PciInfo
			for i, c := range []byte(g.spec.PCIBusID) {
				pci.BusId[i] = int8(c)
			}
			return pci, nvml.SUCCESS
		},
		GetGpuInstanceProfileInfoFunc: func(enum int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
			p, ret := g.profile(enum)
			return p.info(), ret
		},
		GetGpuInstancePossiblePlacementsFunc: func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
			p, ok := g.profileByID(info.Id)
			if !ok {
				return nil, nvml.ERROR_NOT_SUPPORTED
			}
			out := make([]nvml.GpuInstancePlacement, len(p.Placements))
			for i, pl := range p.Placements {
				out[i] = nvml.GpuInstancePlacement{Start: pl.Start, Size: pl.Size}
			}
			return out, nvml.SUCCESS
		},
		GetMigModeFunc: func() (int, int, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.migQueries++
			if g.profiles == nil {
				return 0, 0, nvml.ERROR_NOT_SUPPORTED
			}
			return g.current, g.pending, nvml.SUCCESS
		},
		SetMigModeFunc: func(mode int) (nvml.Return, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if g.profiles == nil {
				return nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NOT_SUPPORTED
			}
			g.current, g.pending = mode, mode
			return nvml.SUCCESS, nvml.SUCCESS
		},
		GetMaxMigDeviceCountFunc: func() (int, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if g.profiles == nil {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			if g.current != nvml.DEVICE_MIG_ENABLE {
				return 0, nvml.SUCCESS
			}
			return 7, nvml.SUCCESS
		},
		GetMigDeviceHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			devs := g.migDevices()
			if i < 0 || i >= len(devs) {
				return nil, nvml.ERROR_NOT_FOUND
			}
			return devs[i].mdev, nvml.SUCCESS
		},
		GetGpuInstanceByIdFunc: func(id int) (nvml.GpuInstance, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			for _, gi := range g.gis {
				if int(gi.id) == id {
					return gi.handle, nvml.SUCCESS
				}
			}
			return nil, nvml.ERROR_NOT_FOUND
		},
		CreateGpuInstanceWithPlacementFunc: func(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if g.profiles == nil {
				return nil, nvml.ERROR_NOT_SUPPORTED
			}
			if g.current != nvml.DEVICE_MIG_ENABLE {
				return nil, nvml.ERROR_NOT_SUPPORTED
			}
			p, ok := g.profileByID(info.Id)
			want := mig.Placement{Start: pl.Start, Size: pl.Size}
			if !ok || !slices.Contains(p.Placements, want) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			for _, gi := range g.gis {
				if mig.Overlaps(gi.placement, want) {
					return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
				}
			}
			gi := g.addGI(g.nextGI, p, want)
			g.nextGI++
			return gi.handle, nvml.SUCCESS
		},
	}
}

// addGI adds a GPU instance; the caller holds f.mu or owns g alone.
func (g *fakeGPU) addGI(id uint32, p vecProfile, pl mig.Placement) *fakeGI {
	gi := &fakeGI{gpu: g, id: id, enum: p.Profile, profileID: p.Info.ID, slices: p.Info.SliceCount, placement: pl}
	f := g.lib
	gi.handle = &mock.GpuInstance{
		GetInfoFunc: func() (nvml.GpuInstanceInfo, nvml.Return) {
			return nvml.GpuInstanceInfo{Device: g.dev, Id: gi.id, ProfileId: gi.profileID,
				Placement: nvml.GpuInstancePlacement{Start: gi.placement.Start, Size: gi.placement.Size}}, nvml.SUCCESS
		},
		GetComputeInstanceProfileInfoFunc: func(enum, engine int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
			slices := map[int]uint32{0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}[enum]
			if slices == 0 || slices > gi.slices || engine != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
				return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
			}
			return nvml.ComputeInstanceProfileInfo{Id: uint32(enum), SliceCount: slices, InstanceCount: gi.slices / slices}, nvml.SUCCESS
		},
		CreateComputeInstanceFunc: func(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if !slices.Contains(g.gis, gi) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			if len(gi.cis) > 0 || info.SliceCount > gi.slices { // only full-size compute instances are modelled
				return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
			}
			ci := gi.addCI(gi.nextCI, fmt.Sprintf("MIG-5a5a%04x-%04x-0000-1111-abcdef%06d", g.spec.Index, gi.id, g.spec.Index*100+int(gi.id)))
			return ci.handle, nvml.SUCCESS
		},
		GetComputeInstanceByIdFunc: func(id int) (nvml.ComputeInstance, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			for _, ci := range gi.cis {
				if int(ci.id) == id {
					return ci.handle, nvml.SUCCESS
				}
			}
			return nil, nvml.ERROR_NOT_FOUND
		},
		DestroyFunc: func() nvml.Return {
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(gi.cis) > 0 {
				return nvml.ERROR_IN_USE
			}
			i := slices.Index(g.gis, gi)
			if i < 0 {
				return nvml.ERROR_INVALID_ARGUMENT
			}
			g.gis = slices.Delete(g.gis, i, i+1)
			return nvml.SUCCESS
		},
	}
	g.gis = append(g.gis, gi)
	return gi
}

// addCI adds a compute instance filling gi; the caller holds f.mu or owns gi alone.
func (gi *fakeGI) addCI(id uint32, migUUID string) *fakeCI {
	f := gi.gpu.lib
	ci := &fakeCI{gi: gi, id: id, migUUID: migUUID}
	gi.nextCI = max(gi.nextCI, id+1)
	ci.handle = &mock.ComputeInstance{
		GetInfoFunc: func() (nvml.ComputeInstanceInfo, nvml.Return) {
			return nvml.ComputeInstanceInfo{Device: gi.gpu.dev, GpuInstance: gi.handle, Id: ci.id}, nvml.SUCCESS
		},
		DestroyFunc: func() nvml.Return {
			f.mu.Lock()
			defer f.mu.Unlock()
			i := slices.Index(gi.cis, ci)
			if i < 0 {
				return nvml.ERROR_INVALID_ARGUMENT
			}
			gi.cis = slices.Delete(gi.cis, i, i+1)
			return nvml.SUCCESS
		},
	}
	ci.mdev = &mock.Device{
		GetUUIDFunc:              func() (string, nvml.Return) { return ci.migUUID, nvml.SUCCESS },
		GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return int(gi.id), nvml.SUCCESS },
		GetComputeInstanceIdFunc: func() (int, nvml.Return) { return int(ci.id), nvml.SUCCESS },
	}
	gi.cis = append(gi.cis, ci)
	return ci
}
