package extender_test

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/schedcache"
)

// A DRA node of the extended-resource mapping: the DeviceClass maps nvidia.com/gpu and the
// node's allocatable has none. A whole-GPU pod is left to kube-scheduler's DRA path there; a
// pod asking a share of a GPU is refused with the fix.
func ExampleOptions_deviceClasses() {
	class, err := dra.DeviceClassWith(dra.SDKProfile(), dra.DeviceClassOptions{ExtendedResourceName: "nvidia.com/gpu"})
	if err != nil {
		fmt.Println(err)
		return
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dra-1"},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("0")}}}
	client := fake.NewClientset(node, class)
	factory := informers.NewSharedInformerFactory(client, 0)
	nodeCache, err := schedcache.New(factory.Core().V1().Nodes(), schedcache.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	// snippet: README
	ext, err := extender.New(client, nodeCache, extender.Options{
		Pods:          factory.Core().V1().Pods(),
		DeviceClasses: factory.Resource().V1().DeviceClasses(), // the mapping's DRA nodes
	})
	// end snippet
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logr.Discard()))
	factory.Start(ctx.Done())
	var wg sync.WaitGroup
	wg.Go(func() { _ = nodeCache.Run(ctx) })
	wg.Go(func() { _ = ext.Run(ctx) })
	defer func() {
		cancel()
		wg.Wait()
		factory.Shutdown()
	}()
	<-ext.Ready()

	for _, limits := range []corev1.ResourceList{
		{"nvidia.com/gpu": resource.MustParse("1")},
		{"nvidia.com/gpu": resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse("3000")},
	} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: limits}}}}}
		res := ext.Filter(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{"dra-1"}})
		if res.NodeNames != nil {
			fmt.Println("passed:", *res.NodeNames)
		}
		for n, reason := range res.FailedAndUnresolvableNodes {
			first, _, _ := strings.Cut(reason, ";")
			fmt.Println("failed:", n, first)
		}
	}
	// Output:
	// passed: [dra-1]
	// failed: dra-1 node serves the GPU count through DRA: DeviceClass gpu.hamireg.io maps nvidia.com/gpu and the node's allocatable has none, so its claim takes whole GPUs and cannot carry nvidia.com/gpumem
}
