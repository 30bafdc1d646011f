package dra_test

import (
	"fmt"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hamireg/hamireg/dra"
)

// A claim for two GPUs of 10 GiB each on one NUMA node: the constraint matches the standard
// attribute both profiles publish.
func ExampleAttributeNUMANode() {
	// snippet: README
	numa := resourcev1.FullyQualifiedName(dra.AttributeNUMANode) // resource.kubernetes.io/numaNode
	spec := resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
		Requests: []resourcev1.DeviceRequest{{Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{
			DeviceClassName: dra.SDKDriver,
			AllocationMode:  resourcev1.DeviceAllocationModeExactCount,
			Count:           2,
			Capacity: &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{
				dra.CapacityMemory: resource.MustParse("10Gi"),
			}},
		}}},
		Constraints: []resourcev1.DeviceConstraint{{Requests: []string{"gpus"}, MatchAttribute: &numa}},
	}}
	// end snippet
	fmt.Println(*spec.Devices.Constraints[0].MatchAttribute)
	// Output: resource.kubernetes.io/numaNode
}
