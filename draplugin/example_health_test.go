package draplugin_test

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
)

// The unhealthy devices of a pod, as the kubelet writes them into its status: one entry per
// DRA claim ("claim:<pod claim name>", resource IDs the claim's CDI device IDs) and per
// device-plugin resource ("nvidia.com/gpu", resource IDs the replica IDs <GPU UUID>-<i>).
func Example_unhealthyDevices() {
	pod := &corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{
		Name: "cuda",
		AllocatedResourcesStatus: []corev1.ResourceStatus{
			{Name: "claim:gpu", Resources: []corev1.ResourceHealth{{ResourceID: "k8s.hamireg.io/claim=5d1c-gpu-2", Health: corev1.ResourceHealthStatusUnhealthy}}},
			{Name: "nvidia.com/gpu", Resources: []corev1.ResourceHealth{{ResourceID: "GPU-508d7d39-0", Health: corev1.ResourceHealthStatusHealthy}}},
		},
	}}}}
	// snippet: README
	for _, cs := range pod.Status.ContainerStatuses {
		for _, rs := range cs.AllocatedResourcesStatus { // "claim:gpu" (DRA), "nvidia.com/gpu" (device plugin)
			for _, r := range rs.Resources {
				if r.Health == corev1.ResourceHealthStatusUnhealthy {
					fmt.Println(cs.Name, rs.Name, r.ResourceID)
				}
			}
		}
	}
	// end snippet
	// Output:
	// cuda claim:gpu k8s.hamireg.io/claim=5d1c-gpu-2
}

// The health stream turned off, for a kubelet that must not be offered it: health is then the
// slice's <driver>/unhealthy taint alone.
func ExampleOptions_disableHealthService() {
	client := fake.NewClientset()
	// snippet: README
	p, err := draplugin.New(draplugin.Options{
		Profile:              dra.SDKProfile(),
		Client:               client,
		NodeName:             "node-a",
		DisableHealthService: true, // default false: WatchHealthStatus serves the kubelet
	})
	// end snippet
	fmt.Println(p.Driver(), err)
	// Output:
	// gpu.hamireg.io <nil>
}
