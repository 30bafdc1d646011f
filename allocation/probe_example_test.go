package allocation_test

import (
	"fmt"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
)

// A scheduler probes every node with one Probe and runs Fit only on the node it chooses.
func ExampleProbe() {
	req := allocation.PodRequest{Containers: []allocation.Request{{Count: 1, Type: annotation.VendorNVIDIA, Memory: 3000,
		MemoryPercentage: allocation.PercentageUnset, Cores: 30}}}
	gpus := []annotation.Device{{ID: "GPU-a", Count: 10, Devmem: 23028, Devcore: 100, Type: "NVIDIA A10", Health: true}}
	probe, ok := allocation.NewProbe(req, nil, allocation.Config{})
	if !ok {
		return // not modelled: call Fit on every node
	}
	var free, full allocation.ProbeNode // kept per node, set again when its usage changes
	free.Set(gpus, nil)
	full.Set(gpus, map[string]allocation.Usage{"GPU-a": {Used: 1, Usedmem: 21000, Usedcores: 50}})
	fmt.Printf("%v %v %.2f\n", probe.Fits(&free, ""), probe.Fits(&full, ""), full.Score())
	// Output:
	// true false 15.12
}
