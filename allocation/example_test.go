package allocation_test

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
)

// A scheduler places a pod asking for one GPU with 3000 MiB and 30 % of its cores on the node
// whose GPUs fit, and the device plugin then serves its container (package hamicore turns the
// entry into HAMi-core's container edits).
func Example() {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "train", Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse("3000"), "nvidia.com/gpucores": resource.MustParse("30")},
	}}}}}
	gpus := []annotation.Device{
		{ID: "GPU-a", Count: 10, Devmem: 23028, Devcore: 100, Type: "NVIDIA A10", Health: true},
		{ID: "GPU-b", Index: 1, Count: 10, Devmem: 23028, Devcore: 100, Type: "NVIDIA A10", Health: true},
	}
	// What the pods already on each node hold, from their hami.io/vgpu-devices-allocated.
	held := allocation.PodDevices{{{UUID: "GPU-a", Type: "NVIDIA", Usedmem: 21000, Usedcores: 50}}}
	nodes := []allocation.Node{
		{Name: "gpu-1", Devices: allocation.WithUsage(gpus, held.Usage())},
		{Name: "gpu-2", Devices: allocation.WithUsage(gpus[:1], held.Usage())},
	}

	req := allocation.Requests(pod, allocation.Config{})
	d := allocation.Schedule(nodes, req, pod.Annotations, allocation.Config{})
	value := allocation.EncodePodDevices(d.Devices)
	fmt.Println(d.Node, value)
	fmt.Println("gpu-2:", d.Failed["gpu-2"])

	// The device plugin, when the kubelet allocates the container.
	pd, _ := allocation.DecodePodDevices(value, allocation.VersionMaster)
	i, _ := pd.Next()
	ctr, _ := allocation.ContainerAt(pod, i)
	for _, dev := range pd[i] {
		fmt.Println(ctr.Name, dev.UUID, dev.Usedmem, dev.Usedcores)
	}
	fmt.Printf("written back: %q\n", allocation.EncodePodDevices(pd.Consume(i)))
	// Output:
	// gpu-1 GPU-b,NVIDIA,3000,30:;
	// gpu-2: 1/1 CardInsufficientMemory
	// train GPU-b 3000 30
	// written back: ";"
}

func ExampleParseScoringWeights() {
	w, err := allocation.ParseScoringWeights("slot=1,core=1,memory=3")
	fmt.Println(w, err)
	_, err = allocation.ParseScoringWeights("slot=1,core=1,mem=3")
	fmt.Println(errors.Is(err, allocation.ErrInvalidScoringWeights), err)
	// Output:
	// {1 1 3} <nil>
	// true invalid hami.io/device-scoring-weights annotation "slot=1,core=1,mem=3": unknown weight "mem"
}
