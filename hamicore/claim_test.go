package hamicore_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/hamicore"
)

const claimUID = "5f0c5e1a-7c2d-4b7e-9f0e-1d2c3b4a5968"

// claimMounts are HAMi-core's mounts of claim claimUID under hook.
func claimMounts(hook string) []allocation.Mount {
	return []allocation.Mount{
		{ContainerPath: hook + "/vgpu/libvgpu.so", HostPath: hook + "/vgpu/libvgpu.so", ReadOnly: true},
		{ContainerPath: hook + "/vgpu", HostPath: hook + "/vgpu/claims/" + claimUID},
		{ContainerPath: "/tmp/vgpulock", HostPath: "/tmp/vgpulock"},
		{ContainerPath: "/etc/ld.so.preload", HostPath: hook + "/vgpu/ld.so.preload", ReadOnly: true},
	}
}

func TestClaimResponse(t *testing.T) {
	t.Parallel()
	a := hamicore.ClaimDevice{UUID: "GPU-a", Index: 3, MemoryMiB: 10240, Cores: 30}
	b := hamicore.ClaimDevice{UUID: "GPU-b", Index: 1, MemoryMiB: 4000, Cores: 0}
	off := ""
	tests := map[string]struct {
		devs       []hamicore.ClaimDevice
		opts       hamicore.EnvOptions
		wantEnv    map[string]string
		wantMounts []allocation.Mount
	}{
		"one GPU, 10Gi and 30 cores": {
			devs: []hamicore.ClaimDevice{a},
			wantEnv: map[string]string{
				"NVIDIA_VISIBLE_DEVICES":          "GPU-a",
				"CUDA_DEVICE_MEMORY_LIMIT_0":      "10240m",
				"CUDA_DEVICE_SM_LIMIT_0":          "30",
				"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/" + claimUID + ".cache",
				"LIBCUDA_LOG_LEVEL":               "1",
			},
			wantMounts: claimMounts("/usr/local"),
		},
		"two GPUs in result order": {
			devs: []hamicore.ClaimDevice{a, b},
			wantEnv: map[string]string{
				"NVIDIA_VISIBLE_DEVICES":          "GPU-a,GPU-b",
				"CUDA_DEVICE_MEMORY_LIMIT_0":      "10240m",
				"CUDA_DEVICE_SM_LIMIT_0":          "30",
				"CUDA_DEVICE_MEMORY_LIMIT_1":      "4000m",
				"CUDA_DEVICE_SM_LIMIT_1":          "0",
				"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/" + claimUID + ".cache",
				"LIBCUDA_LOG_LEVEL":               "1",
			},
			wantMounts: claimMounts("/usr/local"),
		},
		"one GPU twice": {
			devs: []hamicore.ClaimDevice{a, b, {UUID: "GPU-a", Index: 3, MemoryMiB: 1024, Cores: 20}, {UUID: "GPU-b", Index: 1, MemoryMiB: 96, Cores: 50}},
			wantEnv: map[string]string{
				"NVIDIA_VISIBLE_DEVICES":          "GPU-a,GPU-b",
				"CUDA_DEVICE_MEMORY_LIMIT_0":      "11264m",
				"CUDA_DEVICE_SM_LIMIT_0":          "50",
				"CUDA_DEVICE_MEMORY_LIMIT_1":      "4096m",
				"CUDA_DEVICE_SM_LIMIT_1":          "0", // one of the two asked no limit
				"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/" + claimUID + ".cache",
				"LIBCUDA_LOG_LEVEL":               "1",
			},
			wantMounts: claimMounts("/usr/local"),
		},
		"index strategy, options": {
			devs: []hamicore.ClaimDevice{a, b},
			opts: hamicore.EnvOptions{HookPath: "/opt/hami", DeviceIDStrategy: hamicore.DeviceIDIndex, DeviceMemoryScaling: 1.5,
				LibCudaLogLevel: &off, DisableCoreLimit: true, GDRCopy: true, GDS: true, MOFED: true},
			wantEnv: map[string]string{
				"NVIDIA_VISIBLE_DEVICES":          "3,1",
				"CUDA_DEVICE_MEMORY_LIMIT_0":      "10240m",
				"CUDA_DEVICE_SM_LIMIT_0":          "30",
				"CUDA_DEVICE_MEMORY_LIMIT_1":      "4000m",
				"CUDA_DEVICE_SM_LIMIT_1":          "0",
				"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/opt/hami/vgpu/" + claimUID + ".cache",
				"CUDA_OVERSUBSCRIBE":              "true",
				"GPU_CORE_UTILIZATION_POLICY":     "disable",
				"NVIDIA_GDRCOPY":                  "enabled",
				"NVIDIA_GDS":                      "enabled",
				"NVIDIA_MOFED":                    "enabled",
			},
			wantMounts: claimMounts("/opt/hami"),
		},
		"volume mounts, license, libvgpu": {
			devs: []hamicore.ClaimDevice{a, b},
			opts: hamicore.EnvOptions{DeviceListStrategy: hamicore.DeviceListVolumeMounts, License: true, LibVGPU: "/usr/local/vgpu/libvgpu.so.v2.7",
				DeviceMemoryScaling: 1},
			wantEnv: map[string]string{
				"NVIDIA_VISIBLE_DEVICES":          "/var/run/nvidia-container-devices",
				"CUDA_DEVICE_MEMORY_LIMIT_0":      "10240m",
				"CUDA_DEVICE_SM_LIMIT_0":          "30",
				"CUDA_DEVICE_MEMORY_LIMIT_1":      "4000m",
				"CUDA_DEVICE_SM_LIMIT_1":          "0",
				"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/" + claimUID + ".cache",
				"LIBCUDA_LOG_LEVEL":               "1",
			},
			wantMounts: append([]allocation.Mount{
				{ContainerPath: "/var/run/nvidia-container-devices/GPU-a", HostPath: "/dev/null"},
				{ContainerPath: "/var/run/nvidia-container-devices/GPU-b", HostPath: "/dev/null"},
				{ContainerPath: "/usr/local/vgpu/libvgpu.so", HostPath: "/usr/local/vgpu/libvgpu.so.v2.7", ReadOnly: true},
			}, append(claimMounts("/usr/local")[1:],
				allocation.Mount{ContainerPath: "/tmp/license", HostPath: "/usr/local/vgpu/license", ReadOnly: true},
				allocation.Mount{ContainerPath: "/usr/bin/vgpuvalidator", HostPath: "/usr/local/vgpu/vgpuvalidator", ReadOnly: true},
			)...),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r, err := hamicore.ClaimResponse(claimUID, tc.devs, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantEnv, r.Envs); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantMounts, r.Mounts); diff != "" {
				t.Errorf("mounts (-want +got):\n%s", diff)
			}
			hook := tc.opts.HookPath
			if hook == "" {
				hook = hamicore.DefaultHookPath
			}
			if want := hook + "/vgpu/claims/" + claimUID; r.StateDir != want {
				t.Errorf("StateDir = %q, want %q", r.StateDir, want)
			}
			if r.DeviceNodes != nil || r.CDIDevices != nil || r.Annotations != nil {
				t.Errorf("fields HAMi-core does not use: %+v", r)
			}
		})
	}
}

func TestClaimResponseErrors(t *testing.T) {
	t.Parallel()
	ok := []hamicore.ClaimDevice{{UUID: "GPU-a", MemoryMiB: 1, Cores: 1}}
	tests := map[string]struct {
		uid   string
		devs  []hamicore.ClaimDevice
		wantE string
	}{
		"no devices":        {claimUID, nil, "no devices"},
		"empty UID":         {"", ok, "empty claim UID"},
		"parent":            {"..", ok, "not a safe path element"},
		"dot":               {".", ok, "not a safe path element"},
		"traversal":         {"../x", ok, "not a safe path element"},
		"slash":             {"a/b", ok, "not a safe path element"},
		"absolute":          {"/etc", ok, "not a safe path element"},
		"backslash":         {`a\b`, ok, "not a safe path element"},
		"space":             {"a b", ok, "not a safe path element"},
		"NUL":               {"a\x00", ok, "not a safe path element"},
		"negative memory":   {claimUID, []hamicore.ClaimDevice{{UUID: "GPU-a", MemoryMiB: -1}}, "negative limits"},
		"negative cores":    {claimUID, []hamicore.ClaimDevice{{UUID: "GPU-a", Cores: -30}}, "negative limits"},
		"empty UUID":        {claimUID, []hamicore.ClaimDevice{{Index: 2}}, `GPU 2 has UUID ""`},
		"comma in UUID":     {claimUID, []hamicore.ClaimDevice{{UUID: "GPU-a,GPU-b"}}, "want a GPU UUID"},
		"index disagrees":   {claimUID, []hamicore.ClaimDevice{{UUID: "GPU-a"}, {UUID: "GPU-a", Index: 1}}, "indexes 0 and 1"},
		"second device bad": {claimUID, []hamicore.ClaimDevice{ok[0], {UUID: "GPU-b", MemoryMiB: -5}}, "GPU-b"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r, err := hamicore.ClaimResponse(tc.uid, tc.devs, hamicore.EnvOptions{})
			if err == nil || !strings.Contains(err.Error(), tc.wantE) {
				t.Fatalf("ClaimResponse(%q) = %+v, %v; want an error containing %q", tc.uid, r, err, tc.wantE)
			}
			if r.Envs != nil || r.Mounts != nil || r.StateDir != "" {
				t.Errorf("an error with a response: %+v", r)
			}
		})
	}
	// Safe UIDs that are not UUIDs.
	for _, uid := range []string{"...", "a.b_c-D", "x"} {
		if _, err := hamicore.ClaimResponse(uid, ok, hamicore.EnvOptions{}); err != nil {
			t.Errorf("ClaimResponse(%q): %v", uid, err)
		}
	}
}
