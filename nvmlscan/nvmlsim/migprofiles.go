package nvmlsim

import (
	"fmt"
	"maps"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
)

// migProfile is one GPU-instance profile of a simulated GPU as real NVML answers it.
type migProfile struct {
	// enum is the GPU_INSTANCE_PROFILE_* value GetGpuInstanceProfileInfo takes.
	enum int
	// info is the answer, with Id the nvidia-smi profile id (19 for A100's 1g.5gb).
	info nvml.GpuInstanceProfileInfo
	// name is the profile's nvidia-smi name ("1g.5gb", "1g.5gb+me").
	name string
	// placements are the possible placements.
	placements []nvml.GpuInstancePlacement
}

// nvidiaSMIProfileIDs maps the GPU_INSTANCE_PROFILE_* enum to the profile id real NVML
// answers in GpuInstanceProfileInfo.Id on GA100, GH100 and GB100 (nvidia-smi mig -lgip):
// the enum is what the caller asks for, the id is what GetGpuInstancePossiblePlacements,
// GetGpuInstances and the GPU instances' ProfileId speak.
func nvidiaSMIProfileIDs() map[int]uint32 {
	return map[int]uint32{
		nvml.GPU_INSTANCE_PROFILE_1_SLICE:      19,
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: 20,
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: 15,
		nvml.GPU_INSTANCE_PROFILE_2_SLICE:      14,
		nvml.GPU_INSTANCE_PROFILE_3_SLICE:      9,
		nvml.GPU_INSTANCE_PROFILE_4_SLICE:      5,
		nvml.GPU_INSTANCE_PROFILE_7_SLICE:      0,
	}
}

// eightSlicePlacements are the possible placements of the GA100/GH100/GB100 memory-slice
// layout (eight memory slices, seven compute slices; nvidia-smi mig -lgipp), per enum.
func eightSlicePlacements() map[int][]nvml.GpuInstancePlacement {
	ones := []nvml.GpuInstancePlacement{{Start: 0, Size: 1}, {Start: 1, Size: 1}, {Start: 2, Size: 1},
		{Start: 3, Size: 1}, {Start: 4, Size: 1}, {Start: 5, Size: 1}, {Start: 6, Size: 1}}
	return map[int][]nvml.GpuInstancePlacement{
		nvml.GPU_INSTANCE_PROFILE_1_SLICE:      ones,
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: ones,
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: {{Start: 0, Size: 2}, {Start: 2, Size: 2}, {Start: 4, Size: 2}, {Start: 6, Size: 2}},
		nvml.GPU_INSTANCE_PROFILE_2_SLICE:      {{Start: 0, Size: 2}, {Start: 2, Size: 2}, {Start: 4, Size: 2}},
		nvml.GPU_INSTANCE_PROFILE_3_SLICE:      {{Start: 0, Size: 4}, {Start: 4, Size: 4}},
		nvml.GPU_INSTANCE_PROFILE_4_SLICE:      {{Start: 0, Size: 4}},
		nvml.GPU_INSTANCE_PROFILE_7_SLICE:      {{Start: 0, Size: 8}},
	}
}

// migModel is what the simulation knows of one go-nvml preset beyond the preset itself.
type migModel struct {
	// names are the nvidia-smi profile names per enum.
	names map[int]string
	// memoryMB and sms replace the preset's MemorySizeMB and MultiprocessorCount per enum
	// where set.
	memoryMB, sms map[int]uint32
}

// profileNames lists the names of the seven GA100-style profiles: 1 slice, 1 slice with the
// media extensions, 1 compute slice on 2 memory slices, 2, 3, 4 and 7 slices.
func profileNames(one, two, four, eight string) map[int]string {
	return map[int]string{
		nvml.GPU_INSTANCE_PROFILE_1_SLICE:      "1g." + one,
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: "1g." + one + "+me",
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: "1g." + two,
		nvml.GPU_INSTANCE_PROFILE_2_SLICE:      "2g." + two,
		nvml.GPU_INSTANCE_PROFILE_3_SLICE:      "3g." + four,
		nvml.GPU_INSTANCE_PROFILE_4_SLICE:      "4g." + four,
		nvml.GPU_INSTANCE_PROFILE_7_SLICE:      "7g." + eight,
	}
}

// migModels maps go-nvml preset names to what the simulation adds. Memory and SM counts are
// the preset's except on the H200, whose preset table is replaced by the one HAMi's vectors
// were fed (testdata/hami-master-4707fb0/mig-register.json, model H200: nvidia-smi mig -lgip
// of a real H200, 16384/33024/71168/143104 MiB, 16/26/32/60/64/132 SMs). The A100-40GB preset
// equals the vectors' A100-SXM4-40GB table except for the ids.
func migModels() map[string]migModel {
	a100_40 := migModel{names: profileNames("5gb", "10gb", "20gb", "40gb")}
	a100_80 := migModel{names: profileNames("10gb", "20gb", "40gb", "80gb")}
	return map[string]migModel{
		gpus.A100_SXM4_40GB.Name: a100_40,
		gpus.A100_PCIE_40GB.Name: a100_40,
		gpus.A100_SXM4_80GB.Name: a100_80,
		gpus.A100_PCIE_80GB.Name: a100_80,
		gpus.H100_SXM5_80GB.Name: {names: profileNames("10gb", "20gb", "40gb", "80gb")},
		gpus.H200_SXM5_141GB.Name: {names: profileNames("18gb", "35gb", "71gb", "141gb"),
			memoryMB: map[int]uint32{0: 16384, 7: 16384, 9: 33024, 1: 33024, 2: 71168, 3: 71168, 4: 143104},
			sms:      map[int]uint32{0: 16, 7: 16, 9: 26, 1: 32, 2: 60, 3: 64, 4: 132}},
		gpus.B200_SXM5_180GB.Name: {names: profileNames("23gb", "45gb", "90gb", "180gb")},
	}
}

// migProfiles builds the GPU-instance profiles of a GPU of config cfg: the preset's
// profiles with the nvidia-smi ids, the eight-slice placements and the names above. A preset
// the simulation does not know keeps its placements and gets names from its memory.
func migProfiles(cfg gpus.Config) []migProfile {
	ids := nvidiaSMIProfileIDs()
	model, known := migModels()[cfg.Name]
	layout := eightSlicePlacements()
	var out []migProfile
	for _, enum := range slices.Sorted(maps.Keys(cfg.MIGProfiles.GpuInstanceProfiles)) {
		info := cfg.MIGProfiles.GpuInstanceProfiles[enum]
		id, ok := ids[enum]
		if !ok {
			continue
		}
		info.Id = id
		p := migProfile{enum: enum, info: info, placements: cfg.MIGProfiles.GpuInstancePlacements[enum]}
		if known {
			p.name = model.names[enum]
			p.placements = layout[enum]
			if mb, ok := model.memoryMB[enum]; ok {
				p.info.MemorySizeMB = uint64(mb)
			}
			if sm, ok := model.sms[enum]; ok {
				p.info.MultiprocessorCount = sm
			}
		}
		if p.name == "" {
			p.name = fmt.Sprintf("%dg.%dgb", info.SliceCount, (info.MemorySizeMB+1023)/1024)
			if enum == nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1 {
				p.name += "+me"
			}
		}
		out = append(out, p)
	}
	return out
}
