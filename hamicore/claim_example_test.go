package hamicore_test

import (
	"fmt"
	"maps"
	"slices"

	"github.com/hamireg/hamireg/hamicore"
)

// The container edits of a DRA claim that kube-scheduler allocated {memory: 10Gi, cores: 30}
// on one GPU (the plugin reads them from the result's consumedCapacity).
func ExampleClaimResponse() {
	r, err := hamicore.ClaimResponse("5f0c5e1a", []hamicore.ClaimDevice{
		{UUID: "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4", Index: 0, MemoryMiB: 10240, Cores: 30},
	}, hamicore.EnvOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, k := range slices.Sorted(maps.Keys(r.Envs)) {
		fmt.Printf("%s=%s\n", k, r.Envs[k])
	}
	for _, m := range r.Mounts {
		fmt.Printf("%s -> %s (read-only %v)\n", m.HostPath, m.ContainerPath, m.ReadOnly)
	}
	// Output:
	// CUDA_DEVICE_MEMORY_LIMIT_0=10240m
	// CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/5f0c5e1a.cache
	// CUDA_DEVICE_SM_LIMIT_0=30
	// LIBCUDA_LOG_LEVEL=1
	// NVIDIA_VISIBLE_DEVICES=GPU-ebe7c3f7-303d-558d-435e-99a160631fe4
	// /usr/local/vgpu/libvgpu.so -> /usr/local/vgpu/libvgpu.so (read-only true)
	// /usr/local/vgpu/claims/5f0c5e1a -> /usr/local/vgpu (read-only false)
	// /tmp/vgpulock -> /tmp/vgpulock (read-only false)
	// /usr/local/vgpu/ld.so.preload -> /etc/ld.so.preload (read-only true)
}
