package dra_test

import (
	"fmt"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
)

// A claim for "a 1g.10gb MIG device, else 10 GiB of a shared GPU" (a prioritized list,
// KEP-4816), and the YAML kubectl would take for it.
func ExampleMIGDeviceClass_firstAvailable() {
	p := dra.SDKProfile()
	// snippet: README
	claim := &resourcev1.ResourceClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: "mig-or-share"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpu",
			FirstAvailable: []resourcev1.DeviceSubRequest{{
				Name:            "mig", // a 1g.10gb MIG device, while one is free ...
				DeviceClassName: dra.MIGDeviceClass(p).Name,
				AllocationMode:  resourcev1.DeviceAllocationModeExactCount, Count: 1,
				Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
					Expression: dra.ProfileSelector(p, "1g.10gb"),
				}}},
			}, {
				Name:            "share", // ... else 10 GiB of a GPU shared through HAMi-core
				DeviceClassName: dra.DeviceClass(p).Name,
				AllocationMode:  resourcev1.DeviceAllocationModeExactCount, Count: 1,
				Capacity: &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{
					dra.CapacityMemory: resource.MustParse("10Gi"),
				}},
			}},
		}}}},
	}
	// end snippet
	out, err := yaml.Marshal(claim)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(string(out))
	// Output:
	// apiVersion: resource.k8s.io/v1
	// kind: ResourceClaim
	// metadata:
	//   name: mig-or-share
	// spec:
	//   devices:
	//     requests:
	//     - firstAvailable:
	//       - allocationMode: ExactCount
	//         count: 1
	//         deviceClassName: mig.gpu.hamireg.io
	//         name: mig
	//         selectors:
	//         - cel:
	//             expression: device.attributes["gpu.hamireg.io"].profile == "1g.10gb"
	//       - allocationMode: ExactCount
	//         capacity:
	//           requests:
	//             memory: 10Gi
	//         count: 1
	//         deviceClassName: gpu.hamireg.io
	//         name: share
	//       name: gpu
	// status: {}
}

// Reading the claim's result at Prepare: the request "gpu/mig" or "gpu/share" says which
// sub-request kube-scheduler chose; a MIG device reads back to its GPU and placement.
func ExampleMIGFromResult() {
	gpus := []annotation.Device{{ID: "GPU-a", Index: 0, Count: 7, Devmem: 40960, Devcore: 100, Mode: "mig", Health: true,
		MIGProfiles: []annotation.MigProfile{{Name: "1g.10gb", MemoryMB: 9856, Core: 15, SliceCount: 1,
			Placements: []annotation.MigPlacement{{Start: 0, Size: 2}, {Start: 2, Size: 2}, {Start: 4, Size: 2}, {Start: 6, Size: 2}}}}}}
	p := dra.SDKProfile()
	// snippet: README
	r := resourcev1.DeviceRequestAllocationResult{Request: "gpu/mig", Driver: p.Driver, Pool: "node-1", Device: "gpu-0-mig-1g-10gb-6"}
	if p.IsMIGDeviceName(r.Device) {
		m, err := dra.MIGFromResult(p, r, gpus)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s: %s at %d+%d on GPU %s\n", r.Request, m.Profile.Name, m.Placement.Start, m.Placement.Size, m.GPUUUID)
	}
	// end snippet
	// Output:
	// gpu/mig: 1g.10gb at 6+2 on GPU GPU-a
}
