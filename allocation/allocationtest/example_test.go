package allocationtest_test

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/nodelock"
)

// A device plugin's test puts a pod where HAMi's scheduler would have put it, then calls the
// plugin's Allocate. In a test function: allocationtest.Schedule(t, clientset, pod, node, devs,
// allocationtest.Options{}).
func ExampleScheduler() {
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "train"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c0"}}}}
	clientset := fake.NewClientset(pod, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}})

	devs := allocation.PodDevices{{{UUID: "GPU-a", Type: "NVIDIA", Usedmem: 3000, Usedcores: 30}}}
	bound, err := allocationtest.NewScheduler(clientset, allocationtest.Options{}).Schedule(ctx, pod, "gpu-1", devs)
	if err != nil {
		fmt.Println(err)
		return
	}
	node, _ := clientset.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
	lock, _, _ := nodelock.FromAnnotations(node.Annotations)
	owner, _ := lock.Owner()
	fmt.Println(bound.Spec.NodeName, bound.Annotations["hami.io/vgpu-devices-to-allocate"], bound.Annotations["hami.io/bind-phase"])
	fmt.Println("lock held by", owner)
	// Output:
	// gpu-1 GPU-a,NVIDIA,3000,30:; allocating
	// lock held by default/train
}

// A scheduler's test plays HAMi's device plugin after its bind: each Allocate serves the next
// container entry, and after the last one the pod has bind-phase success and the node lock is
// gone.
func ExamplePlugin() {
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "train"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c0"}, {Name: "c1"}}}}
	clientset := fake.NewClientset(pod, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}})
	// What the scheduler under test writes; here the stand-in of HAMi's scheduler.
	devs := allocation.PodDevices{
		{{UUID: "GPU-a", Type: "NVIDIA", Usedmem: 3000, Usedcores: 30}},
		{{UUID: "GPU-b", Type: "NVIDIA", Usedmem: 5000, Usedcores: 35}},
	}
	if _, err := allocationtest.NewScheduler(clientset, allocationtest.Options{}).Schedule(ctx, pod, "gpu-1", devs); err != nil {
		fmt.Println(err)
		return
	}

	plugin := allocationtest.NewPlugin(clientset, "gpu-1", allocationtest.Options{})
	for range 2 { // the kubelet calls Allocate once per container
		a, err := plugin.Allocate(ctx, 1)
		if err != nil {
			fmt.Println(err)
			return
		}
		served, _ := clientset.CoreV1().Pods("default").Get(ctx, "train", metav1.GetOptions{})
		fmt.Println(a.Container, a.Devices[0].UUID, "last:", a.Last, served.Annotations["hami.io/vgpu-devices-to-allocate"], served.Annotations["hami.io/bind-phase"])
	}
	node, _ := clientset.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
	_, locked := node.Annotations[nodelock.Key]
	fmt.Println("locked:", locked)
	// Output:
	// c0 GPU-a last: false ;GPU-b,NVIDIA,5000,35:;; allocating
	// c1 GPU-b last: true ;;;; success
	// locked: false
}
