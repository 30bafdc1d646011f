package hamicore

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
)

func TestContainerResponse(t *testing.T) {
	t.Parallel()
	devs := allocation.ContainerDevices{{UUID: "GPU-a", Usedmem: 3000, Usedcores: 30}, {UUID: "GPU-b", Usedmem: 4000, Usedcores: 40}, {UUID: "GPU-a", Usedmem: 1, Usedcores: 1}}
	c := Container{PodUID: "uid", Name: "c0", CacheID: "cache"}
	gpus := []annotation.Device{{ID: "GPU-a", Index: 3}, {ID: "GPU-b", Index: 5}}
	off := ""
	r, err := ContainerResponse(devs, c, gpus, EnvOptions{HookPath: "/opt/hami", DeviceIDStrategy: DeviceIDIndex, DeviceListStrategy: DeviceListVolumeMounts,
		LibCudaLogLevel: &off, DisableCoreLimit: true, GDS: true, License: true, LibVGPU: "/opt/hami/vgpu/libvgpu.so.v2.6"})
	if err != nil {
		t.Fatal(err)
	}
	wantEnv := map[string]string{
		"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices", "NVIDIA_GDS": "enabled", "GPU_CORE_UTILIZATION_POLICY": "disable",
		"CUDA_DEVICE_MEMORY_LIMIT_0": "3000m", "CUDA_DEVICE_MEMORY_LIMIT_1": "4000m", "CUDA_DEVICE_MEMORY_LIMIT_2": "1m",
		"CUDA_DEVICE_SM_LIMIT": "30", "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/opt/hami/vgpu/cache.cache",
	}
	if diff := cmp.Diff(wantEnv, r.Envs); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
	wantMounts := []allocation.Mount{
		{ContainerPath: "/var/run/nvidia-container-devices/3", HostPath: "/dev/null"},
		{ContainerPath: "/var/run/nvidia-container-devices/5", HostPath: "/dev/null"},
		{ContainerPath: "/opt/hami/vgpu/libvgpu.so", HostPath: "/opt/hami/vgpu/libvgpu.so.v2.6", ReadOnly: true},
		{ContainerPath: "/opt/hami/vgpu", HostPath: "/opt/hami/vgpu/containers/uid_c0"},
		{ContainerPath: "/tmp/vgpulock", HostPath: "/tmp/vgpulock"},
		{ContainerPath: "/etc/ld.so.preload", HostPath: "/opt/hami/vgpu/ld.so.preload", ReadOnly: true},
		{ContainerPath: "/tmp/license", HostPath: "/opt/hami/vgpu/license", ReadOnly: true},
		{ContainerPath: "/usr/bin/vgpuvalidator", HostPath: "/opt/hami/vgpu/vgpuvalidator", ReadOnly: true},
	}
	if diff := cmp.Diff(wantMounts, r.Mounts); diff != "" {
		t.Errorf("mounts (-want +got):\n%s", diff)
	}
	if r.StateDir != "/opt/hami/vgpu/containers/uid_c0" {
		t.Errorf("StateDir = %q", r.StateDir)
	}
	// Chart defaults: UUIDs without repeats, LIBCUDA_LOG_LEVEL 1.
	r, err = ContainerResponse(devs, c, nil, EnvOptions{LibCudaLogLevel: ptr.To(DefaultLibCudaLogLevel)})
	if err != nil || r.Envs["NVIDIA_VISIBLE_DEVICES"] != "GPU-a,GPU-b" || r.Envs["LIBCUDA_LOG_LEVEL"] != "1" || r.Mounts[0].HostPath != "/usr/local/vgpu/libvgpu.so" {
		t.Errorf("defaults: %+v, %v", r, err)
	}
	if _, err := ContainerResponse(nil, c, gpus, EnvOptions{}); err == nil {
		t.Error("an empty entry gets a response")
	}
	if _, err := ContainerResponse(allocation.ContainerDevices{{UUID: "GPU-z"}}, c, gpus, EnvOptions{DeviceIDStrategy: DeviceIDIndex}); err == nil || !strings.Contains(err.Error(), "GPU-z") {
		t.Errorf("unknown GPU with the index strategy: %v", err)
	}
	c.Env = []corev1.EnvVar{{Name: "CUDA_DISABLE_CONTROL", Value: "no"}}
	if r, _ := ContainerResponse(devs, c, nil, EnvOptions{}); len(r.Mounts) != 4 {
		t.Errorf("CUDA_DISABLE_CONTROL=no drops the preload: %v", r.Mounts)
	}
}
