package nvmlsim_test

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hamireg/hamireg/nvmlscan/nvmlsim"
)

// Example_mig realises a 2g.10gb MIG device at placement 2 on a simulated DGX A100 in MIG mode,
// as a device plugin's Allocate does, and shows the simulation refusing an overlapping one.
func Example_mig() {
	run := func() error {
		// snippet: doc
		node, err := nvmlsim.New("dgxa100")
		if err != nil {
			return err
		}
		node.EnableMIG()
		gpu := node.Device(0)
		info, _ := gpu.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_2_SLICE) // info.Id 14
		gi, ret := gpu.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 2, Size: 2})
		if ret != nvml.SUCCESS {
			return ret
		}
		// A 1g.5gb at slice 3 would overlap: ERROR_INSUFFICIENT_RESOURCES.
		ciInfo, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
			return ret
		}
		migDevice, _ := gpu.GetMigDeviceHandleByIndex(0)
		uuid, _ := migDevice.GetUUID() // "MIG-…"
		// end snippet
		one, _ := gpu.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
		_, ret = gpu.CreateGpuInstanceWithPlacement(&one, &nvml.GpuInstancePlacement{Start: 3, Size: 1})
		fmt.Println(info.Id, strings.HasPrefix(uuid, "MIG-"), ret)
		for _, inst := range node.MIGInstances(0) {
			fmt.Println(inst.Profile, inst.ProfileID, inst.Placement, inst.GPUInstanceID, inst.ComputeInstanceID, inst.MigUUID == uuid)
		}
		fmt.Println(node.MIGOverlaps())
		return nil
	}
	if err := run(); err != nil {
		fmt.Println(err)
	}
	// Output:
	// 14 true ERROR_INSUFFICIENT_RESOURCES
	// 2g.10gb 14 {2 2} 1 0 true
	// <nil>
}
