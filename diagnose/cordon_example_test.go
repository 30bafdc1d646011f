package diagnose_test

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/dra"
)

// cordonGPU is the docs' cordon snippet.
func cordonGPU(ctx context.Context, client kubernetes.Interface) error {
	// snippet: README
	res, err := diagnose.Cordon(ctx, client, "gpu-7", []string{"3"}, diagnose.CordonOptions{})
	if err != nil {
		return err // errors.Is(err, diagnose.ErrForbidden): the message names the RBAC rule to add
	}
	for _, g := range res.GPUs {
		fmt.Printf("GPU %d (%s): hami.io/device-cordon %s\n", g.Index, g.UUID, g.Annotation)
		for _, r := range g.Rules {
			fmt.Printf("  DeviceTaintRule on %s/%s/%s: %s\n", r.Driver, r.Pool, r.Device, r.Action)
		}
	}
	// end snippet
	return nil
}

// claimDevices is the docs' snippet that reads a claim-based pod's diagnosis.
func claimDevices(ctx context.Context, client kubernetes.Interface) error {
	// snippet: README
	r, err := diagnose.Pod(ctx, client, "team-a", "train", diagnose.Options{})
	if err != nil {
		return err
	}
	fmt.Println(r.StageText, r.Case) // "S4 running (DRA) P12-DeviceUnhealthy"
	for _, c := range r.Claims {
		for _, d := range c.Devices {
			fmt.Println(c.PodClaim, c.Claim, d.Driver, d.Pool, d.Device, d.Health, d.Taints)
		}
	}
	// end snippet
	return nil
}

// ExampleCordon cordons GPU 3 of node gpu-7, which the SDK's DRA driver publishes: the UUID
// goes into hami.io/device-cordon and a DeviceTaintRule keeps new claims off the device.
func ExampleCordon() {
	node := gpuNode("gpu-7")
	client := fake.NewClientset(node, draSlice("gpu-7", dra.SDKProfile(), 3))
	if err := cordonGPU(context.Background(), client); err != nil {
		fmt.Println(err)
	}
	// Output:
	// GPU 3 (GPU-00000003-1111-2222-3333-444455556666): hami.io/device-cordon added
	//   DeviceTaintRule on gpu.hamireg.io/gpu-7/gpu-3: added
}

// ExamplePod_claims diagnoses a claim-based pod running on a GPU the kubelet reports
// unhealthy.
func ExamplePod_claims() {
	pod := running(claimPod(), corev1.ResourceHealthStatusUnhealthy, dra.SDKDriver+"/gpu-a/gpu-1")
	pod.Namespace = "team-a"
	claim := gpuClaim(dra.SDKDriver, dra.SDKDriver, "gpu-1", true)
	claim.Namespace = "team-a"
	client := fake.NewClientset(pod, claim, taintedSlice(), dra.DeviceClass(dra.SDKProfile()))
	if err := claimDevices(context.Background(), client); err != nil {
		fmt.Println(err)
	}
	// Output:
	// S4 running (DRA) P12-DeviceUnhealthy
	// gpu train-gpu gpu.hamireg.io gpu-a gpu-1 Unhealthy []
}
