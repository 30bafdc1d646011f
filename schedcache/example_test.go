package schedcache_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/schedcache"
)

func exampleNode(name, register string, gpus int64) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{annotation.KeyNVIDIARegister: register}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			annotation.ResourceNVIDIAGPU: *resource.NewQuantity(gpus, resource.DecimalSI)}},
	}
}

// Example runs the cache and its Handshaker over a fake cluster with one good and one broken
// GPU node, then reads it the way a scheduler extender would: the registered nodes from a
// snapshot, and why another node is not one of them from the same snapshot.
func Example() {
	good := annotation.Encode([]annotation.Device{
		{ID: "GPU-a", Index: 0, Count: 10, Devmem: 81559, Devcore: 100, Type: "NVIDIA-H100", Mode: "hami-core", Health: true},
		{ID: "GPU-b", Index: 1, Count: 10, Devmem: 81559, Devcore: 100, Type: "NVIDIA-H100", Mode: "hami-core", Health: true},
	})
	client := fake.NewClientset(exampleNode("gpu-1", good, 20), exampleNode("gpu-2", "[null]", 20))
	factory := informers.NewSharedInformerFactory(client, 0)
	c, err := schedcache.New(factory.Core().V1().Nodes(), schedcache.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	// The handshake writes are leader-only work: run h under leader election (schedcache.Elector,
	// schedcache.LeaseFollower or client-go's OnStartedLeading), or directly on a single replica.
	h, err := schedcache.NewHandshaker(client, c, schedcache.HandshakerOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logr.Discard()))
	factory.Start(ctx.Done())
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Run(ctx) })
	wg.Go(func() { _ = h.Run(ctx) })
	defer func() {
		cancel()
		wg.Wait()
		factory.Shutdown()
	}()
	if err := c.WaitForSync(ctx); err != nil {
		fmt.Println(err)
		return
	}

	snap := c.Snapshot()
	for n := range snap.All() {
		fmt.Println(n.Name, "registered with", len(n.Devices(annotation.NVIDIA())), "GPUs")
	}
	broken, _ := snap.Node("gpu-2")
	r, _ := broken.Registration(annotation.NVIDIA())
	fmt.Println("gpu-2:", broken.Registered(), r.State, errors.Is(r.Err, annotation.ErrInvalidElement))
	// Output:
	// gpu-1 registered with 2 GPUs
	// gpu-2: false invalid-element true
}
