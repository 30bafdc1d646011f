package allocation_test

import (
	"fmt"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
)

// ExampleSetPairScores places a 2-GPU container with the topology-aware policy on a node of
// four GPUs whose pairs 0-1 and 2-3 are NVLinked: the GPUs come with the node's score
// annotation attached, and the fit takes the first best pair of the walk.
func ExampleSetPairScores() {
	gpus := make([]annotation.Device, 4)
	for i := range gpus {
		gpus[i] = annotation.Device{ID: fmt.Sprintf("GPU-%d", i), Index: uint(i), Count: 10, Devmem: 40960, Devcore: 100, Type: "NVIDIA A100", Health: true}
	}
	score := func(peer string) map[string]int {
		m := map[string]int{}
		for _, g := range gpus {
			m[g.ID] = 20 // PCIe, same NUMA node
		}
		m[peer] = 420 // + 4 NVLinks
		return m
	}
	value := annotation.EncodePairScores([]annotation.PairScore{
		{UUID: "GPU-0", Scores: score("GPU-1")}, {UUID: "GPU-1", Scores: score("GPU-0")},
		{UUID: "GPU-2", Scores: score("GPU-3")}, {UUID: "GPU-3", Scores: score("GPU-2")},
	})
	scores, err := annotation.DecodePairScores(value) // the node's hami.io/node-nvidia-score
	if err != nil {
		fmt.Println(err) // the node stays schedulable, without scores
	}
	// GPU 3's memory is taken, so 0-1 is the only NVLinked pair left.
	held := map[string]allocation.Usage{"GPU-3": {Used: 1, Usedmem: 40000, Usedcores: 10}}
	devs := allocation.SetPairScores(allocation.WithUsage(gpus, held), annotation.ScoresByDevice(gpus, scores))

	cfg := allocation.Config{GPUSchedulerPolicy: allocation.PolicyTopologyAware}
	two := allocation.PodRequest{Containers: []allocation.Request{{Count: 2, Type: "NVIDIA", Memory: 1000, Cores: 10}}}
	pd, _, ok := allocation.Fit(devs, two, nil, nil, cfg)
	fmt.Println(allocation.EncodePodDevices(pd), ok)
	one := allocation.PodRequest{Containers: []allocation.Request{{Count: 1, Type: "NVIDIA", Memory: 1000, Cores: 10}}}
	pd, _, _ = allocation.Fit(devs, one, nil, nil, cfg)
	fmt.Println(allocation.EncodePodDevices(pd)) // the worst connected card: GPU 3's partner
	// Output:
	// GPU-1,NVIDIA,1000,10:GPU-0,NVIDIA,1000,10:; true
	// GPU-2,NVIDIA,1000,10:;
}
