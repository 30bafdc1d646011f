package nvmlscan

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestProfileName derives nvidia-smi's profile names from NVML's profile memory and the GPU's
// memory, for the tables of mig-register.json's models.
func TestProfileName(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	tests := map[string]struct {
		enum    int
		slices  uint32
		memMiB  uint64
		totalMB uint64
		want    string
	}{
		"A100-40GB 1g":         {nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 4864, 40960, "1g.5gb"},
		"A100-40GB 1g+me":      {nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, 4864, 40960, "1g.5gb+me"},
		"A100-40GB 1g REV2":    {nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 1, 9856, 40960, "1g.10gb"},
		"A100-40GB 2g":         {nvml.GPU_INSTANCE_PROFILE_2_SLICE, 2, 9856, 40960, "2g.10gb"},
		"A100-40GB 3g":         {nvml.GPU_INSTANCE_PROFILE_3_SLICE, 3, 19968, 40960, "3g.20gb"},
		"A100-40GB 4g":         {nvml.GPU_INSTANCE_PROFILE_4_SLICE, 4, 19968, 40960, "4g.20gb"},
		"A100-40GB 7g":         {nvml.GPU_INSTANCE_PROFILE_7_SLICE, 7, 40192, 40960, "7g.40gb"},
		"A100-80GB 1g":         {nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 9728, 81920, "1g.10gb"},
		"A100-80GB 7g":         {nvml.GPU_INSTANCE_PROFILE_7_SLICE, 7, 80896, 81920, "7g.80gb"},
		"H200 1g":              {nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 16384, 143771, "1g.18gb"},
		"H200 2g":              {nvml.GPU_INSTANCE_PROFILE_2_SLICE, 2, 33024, 143771, "2g.35gb"},
		"H200 3g":              {nvml.GPU_INSTANCE_PROFILE_3_SLICE, 3, 71168, 143771, "3g.71gb"},
		"H200 7g":              {nvml.GPU_INSTANCE_PROFILE_7_SLICE, 7, 143104, 143771, "7g.141gb"},
		"A30 1g":               {nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 5836, 24576, "1g.6gb"},
		"all media extensions": {nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, 1, 23040, 184320, "1g.23gb+me.all"},
		"graphics":             {nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX, 2, 46080, 184320, "2g.45gb+gfx"},
		"no media extensions":  {nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, 1, 23040, 184320, "1g.23gb-me"},
		"unknown total memory": {nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 4864, 0, ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			info := nvml.GpuInstanceProfileInfo{SliceCount: tc.slices, MemorySizeMB: tc.memMiB}
			if got := profileName(tc.enum, info, tc.totalMB*mib); got != tc.want {
				t.Errorf("profileName = %q, want %q", got, tc.want)
			}
		})
	}
}
