package allocation_test

import (
	"fmt"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/mig"
)

// A pod asking for 4000 MiB lands on a MIG GPU as a 1g.5gb at the highest free placement; the
// placements pods hold come from their reservations, and the scheduler writes the pod's own
// reservation next to its device lists.
func ExampleMIGAllocations() {
	ones := []mig.Placement{{Start: 0, Size: 1}, {Start: 1, Size: 1}, {Start: 2, Size: 1}, {Start: 3, Size: 1}, {Start: 4, Size: 1}, {Start: 5, Size: 1}, {Start: 6, Size: 1}}
	gpu := annotation.Device{ID: "GPU-m", Count: 7, Devmem: 40960, Devcore: 100, Type: "NVIDIA A100-SXM4-40GB", Mode: allocation.ModeMIG, Health: true,
		MIGProfiles: []mig.Profile{{Name: "1g.5gb", MemoryMB: 4864, Core: 15, SliceCount: 1, Placements: ones}}}

	// What a running pod holds: its device list and its reservation.
	held, _ := allocation.DecodePodDevices("GPU-m,NVIDIA,4864,15:;", allocation.VersionMaster)
	reservation, _ := mig.DecodeAllocations(`[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-m","profile":"1g.5gb","placement":{"start":6,"size":1}}]`)
	held, _ = allocation.WithMIG(held, reservation)
	devs := allocation.SetMIGUsage(allocation.WithUsage([]annotation.Device{gpu}, held.Usage()), held.MIGUsage())

	req := allocation.PodRequest{Containers: []allocation.Request{{Count: 1, Type: "NVIDIA", Memory: 4000, MemoryPercentage: allocation.PercentageUnset}}}
	pd, _, ok := allocation.Fit(devs, req, nil, nil, allocation.Config{})
	fmt.Println(ok, allocation.EncodePodDevices(pd))
	fmt.Println(mig.EncodeAllocations(allocation.MIGAllocations(pd)))
	// Output:
	// true GPU-m,NVIDIA,4864,15:;
	// [{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-m","profile":"1g.5gb","placement":{"start":5,"size":1}}]
}
