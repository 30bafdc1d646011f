package dra_test

import (
	"fmt"

	resourcev1 "k8s.io/api/resource/v1"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
)

// Example_usage compiles the package documentation's snippet.
func Example_usage() {
	scanned := []annotation.Device{{ID: "GPU-a", Count: 10, Devmem: 23028, Devcore: 100, Mode: "hami-core", Health: true}}
	owned := func(annotation.Device) bool { return true }
	publish := func(devs []resourcev1.Device) { fmt.Println("publish", len(devs), "device(s)") }
	prepare := func(i uint, memory, cores int64) { fmt.Println("prepare GPU", i, memory, cores) }
	claim := &resourcev1.ResourceClaim{Status: resourcev1.ResourceClaimStatus{Allocation: &resourcev1.AllocationResult{
		Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{Driver: dra.SDKDriver, Device: "gpu-0"}}},
	}}}
	run := func() error {
		// snippet: doc
		p := dra.SDKProfile()
		devs, err := dra.Devices(scanned, dra.Options{Profile: p, Owned: owned})
		if err != nil {
			return err
		}
		publish(devs) // as the node's ResourceSlice

		for _, r := range claim.Status.Allocation.Devices.Results {
			c, err := dra.ConsumedFromResult(p, r, scanned)
			if err != nil {
				return err
			}
			prepare(c.Index, c.MemoryMiB, c.Cores)
		}
		// end snippet
		return nil
	}
	if err := run(); err != nil {
		fmt.Println(err)
	}
	// Output:
	// publish 1 device(s)
	// prepare GPU 0 23028 100
}
