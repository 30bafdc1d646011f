package extender_test

import (
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/schedcache"
)

// ExampleOptions_registerer serves HAMi's scheduler metrics as HAMi's --metrics-bind-address
// does (a registry of its own, promhttp.HandlerFor with zero options), places a pod and
// scrapes: the GPU's gauge and the container's gauge show the pod at once.
func ExampleOptions_registerer() {
	gpu := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Annotations: map[string]string{annotation.KeyNVIDIARegister: annotation.Encode([]annotation.Device{
			{ID: "GPU-a", Count: 10, Devmem: 23028, Devcore: 100, Type: "NVIDIA-A10", Mode: "hami-core", Health: true}})}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{annotation.ResourceNVIDIAGPU: resource.MustParse("10")}},
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "train"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "c", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1"),
			"nvidia.com/gpumem": resource.MustParse("3000")}}}}}}
	client := fake.NewClientset(gpu, pod)
	factory := informers.NewSharedInformerFactory(client, 0)
	cache, err := schedcache.New(factory.Core().V1().Nodes(), schedcache.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	reg := prometheus.NewRegistry()
	ext, err := extender.New(client, cache, extender.Options{Pods: factory.Core().V1().Pods(), Registerer: reg})
	if err != nil {
		fmt.Println(err)
		return
	}
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})) // HAMi's /metrics on :9395

	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logr.Discard()))
	factory.Start(ctx.Done())
	var wg sync.WaitGroup
	wg.Go(func() { _ = cache.Run(ctx) })
	wg.Go(func() { _ = ext.Run(ctx) })
	defer func() {
		metrics.Close()
		cancel()
		wg.Wait()
		factory.Shutdown()
	}()
	<-ext.Ready()
	ext.Filter(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{"gpu-1"}})

	resp, err := metrics.Client().Get(metrics.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	for line := range strings.SplitSeq(string(body), "\n") {
		if strings.HasPrefix(line, "hami_gpu_memory_allocated_bytes{") || strings.HasPrefix(line, "hami_vgpu_memory_allocated_bytes{") {
			fmt.Println(line)
		}
	}
	// Output:
	// hami_gpu_memory_allocated_bytes{device_cores="100",device_index="0",device_type="NVIDIA-A10",device_uuid="GPU-a",node="gpu-1",zone="vGPU"} 3.145728e+09
	// hami_vgpu_memory_allocated_bytes{container_index="0",device_uuid="GPU-a",namespace="default",node="gpu-1",pod="train",zone="vGPU"} 3.145728e+09
}
