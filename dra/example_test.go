package dra_test

import (
	"fmt"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
)

// Two A100s, the second one owned by the device plugin (HAMi's extender), and one in MIG
// mode, which DRA leaves out.
func ExampleDevices() {
	scanned := []annotation.Device{
		{ID: "GPU-b", Index: 1, Count: 10, Devmem: 40960, Devcore: 100, Type: "NVIDIA-A100-SXM4-40GB", Mode: "hami-core", Health: true},
		{ID: "GPU-a", Index: 0, Count: 10, Devmem: 40960, Devcore: 100, Type: "NVIDIA-A100-SXM4-40GB", Mode: "hami-core", Health: true},
		{ID: "GPU-m", Index: 2, Count: 1, Devmem: 40960, Devcore: 100, Type: "NVIDIA-A100-SXM4-40GB", Mode: "mig", Health: true},
	}
	devs, err := dra.Devices(scanned, dra.Options{
		Profile: dra.SDKProfile(),
		Owned:   func(d annotation.Device) bool { return d.ID != "GPU-b" },
		Extras:  map[string]dra.Extra{"GPU-a": {PCIBusID: "0000:07:00.0"}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, d := range devs {
		memory, cores, shares := d.Capacity[dra.CapacityMemory], d.Capacity[dra.CapacityCores], d.Capacity[dra.CapacityShares]
		fmt.Printf("%s %s %s: memory %s (default %s), cores %s (default %s), shares %s\n", d.Name,
			*d.Attributes["uuid"].StringValue, *d.Attributes["productName"].StringValue,
			memory.Value.String(), memory.RequestPolicy.Default.String(),
			cores.Value.String(), cores.RequestPolicy.Default.String(), shares.Value.String())
		for _, t := range d.Taints {
			fmt.Printf("  taint %s:%s\n", t.Key, t.Effect)
		}
	}
	fmt.Println(*devs[0].Attributes[dra.AttributePCIBusID].StringValue)
	// Output:
	// gpu-0 GPU-a A100-SXM4-40GB: memory 40Gi (default 40Gi), cores 100 (default 0), shares 10
	// gpu-1 GPU-b A100-SXM4-40GB: memory 40Gi (default 40Gi), cores 100 (default 0), shares 10
	//   taint gpu.hamireg.io/owned-by-hami:NoSchedule
	// 0000:07:00.0
}

func ExampleDeviceClass() {
	for _, p := range []dra.Profile{dra.SDKProfile(), dra.HAMiProfile()} {
		c := dra.DeviceClass(p)
		fmt.Printf("%s: %s\n", c.Name, c.Spec.Selectors[0].CEL.Expression)
	}
	// Output:
	// gpu.hamireg.io: device.driver == "gpu.hamireg.io" && !has(device.attributes["gpu.hamireg.io"].profile)
	// hami-core-gpu.project-hami.io: device.driver == "hami-core-gpu.project-hami.io" && device.attributes["hami-core-gpu.project-hami.io"].type == "hami-gpu"
}

// The allocation result of a claim {memory: 10Gi, cores: 30} as kube-scheduler writes it, and
// one of a device that was not shared (no consumedCapacity: the whole GPU).
func ExampleConsumedFromResult() {
	gpus := []annotation.Device{
		{ID: "GPU-a", Index: 0, Count: 10, Devmem: 40960, Devcore: 100, Mode: "hami-core", Health: true},
		{ID: "GPU-b", Index: 1, Count: 10, Devmem: 23028, Devcore: 100, Mode: "hami-core", Health: true},
	}
	p := dra.SDKProfile()
	for _, r := range []resourcev1.DeviceRequestAllocationResult{
		{Request: "gpu", Driver: p.Driver, Pool: "node-1", Device: "gpu-0", ConsumedCapacity: map[resourcev1.QualifiedName]resource.Quantity{
			dra.CapacityMemory: resource.MustParse("10Gi"), dra.CapacityCores: resource.MustParse("30"), dra.CapacityShares: resource.MustParse("1"),
		}},
		{Request: "gpu", Driver: p.Driver, Pool: "node-1", Device: "gpu-1"},
		{Request: "gpu", Driver: p.Driver, Pool: "node-1", Device: "gpu-7"},
	} {
		c, err := dra.ConsumedFromResult(p, r, gpus)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Printf("GPU %d: %d MiB, %d cores\n", c.Index, c.MemoryMiB, c.Cores)
	}
	// Output:
	// GPU 0: 10240 MiB, 30 cores
	// GPU 1: 23028 MiB, 100 cores
	// read allocation result node-1/gpu-7 of request "gpu": GPU 7 is not a published GPU of this node: invalid allocation result
}
