package usage_test

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/usage"
)

// Example_decide compiles the package documentation's snippet.
func Example_decide() {
	decide := func(tracker *usage.Tracker, pod *corev1.Pod, node string, devices []annotation.Device, req allocation.PodRequest, cfg allocation.Config, pd allocation.PodDevices) func() {
		// snippet: doc
		v := tracker.Lock()
		q := v.Quota(pod.Namespace, usage.Key(pod.Namespace, pod.Name)) // without the pod itself
		used, _ := v.Node(node)
		devs := allocation.SetMIGUsage(allocation.WithUsage(devices, used), v.MIG(node)) // MIG placements held
		_, _, fits := allocation.FitWith(devs, req, pod.Annotations, nil, cfg, allocation.FitOptions{Quota: &q})
		var undo func()
		if fits {
			undo = v.Assume(pod, node, pd)
		}
		v.Unlock()
		// end snippet
		return undo
	}
	_ = decide
	// Output:
}

// Example shows a namespace's quota usage through assume and undo.
func Example() {
	t := usage.New(usage.Options{})
	t.SetQuota(&corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "gpu"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"limits.nvidia.com/gpumem": resource.MustParse("4000")}}})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "p1"}}
	pd := allocation.PodDevices{{{UUID: "GPU-0", Type: "NVIDIA", Usedmem: 3000, Usedcores: 30}}}
	undo := t.Assume(pod, "node1", pd)
	q := t.Quota("team-a", "")
	fmt.Println("used", q.Used.Memory, "of", q.Limits.Memory.Value, "MiB; pods on GPU-0:", t.PodsOnGPU("node1", "GPU-0"))
	fmt.Println("another 1001 MiB exceeds", q.Exceeded(allocation.QuotaAmount{Memory: 1001}, allocation.Config{}))
	undo() // the patch failed
	fmt.Println("after undo", t.Quota("team-a", "").Used.Memory, t.Node("node1"))
	// Output:
	// used 3000 of 4000 MiB; pods on GPU-0: [team-a/p1]
	// another 1001 MiB exceeds [limits.nvidia.com/gpumem]
	// after undo 0 map[]
}
