package extender_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/schedcache"
)

// Example serves the extender over a fake cluster with one registered GPU node and one node
// without GPUs, and asks it, as kube-scheduler would, where a pod that wants 3000 MiB of a GPU
// goes.
func Example() {
	gpu := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Annotations: map[string]string{annotation.KeyNVIDIARegister: annotation.Encode([]annotation.Device{
			{ID: "GPU-a", Count: 10, Devmem: 23028, Devcore: 100, Type: "NVIDIA-A10", Mode: "hami-core", Health: true}})}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{annotation.ResourceNVIDIAGPU: resource.MustParse("10")}},
	}
	cpu := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu-1"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "train"}}
	client := fake.NewClientset(gpu, cpu, pod)

	factory := informers.NewSharedInformerFactory(client, 0)
	cache, err := schedcache.New(factory.Core().V1().Nodes(), schedcache.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	ext, err := extender.New(client, cache, extender.Options{Pods: factory.Core().V1().Pods()})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logr.Discard()))
	factory.Start(ctx.Done())
	var wg sync.WaitGroup
	wg.Go(func() { _ = cache.Run(ctx) })
	wg.Go(func() { _ = ext.Run(ctx) })
	srv := httptest.NewServer(ext.Handler())
	defer func() {
		srv.Close()
		cancel()
		wg.Wait()
		factory.Shutdown()
	}()

	<-ext.Ready()
	body := `{"Pod":{"metadata":{"namespace":"default","name":"train"},"spec":{"containers":[{"name":"c",` +
		`"resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpumem":"3000"}}}]}},"NodeNames":["cpu-1","gpu-1"]}`
	resp, err := http.Post(srv.URL+extender.PathFilter, "application/json", strings.NewReader(body))
	if err != nil {
		fmt.Println(err)
		return
	}
	out, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	fmt.Println(resp.StatusCode, string(out))

	placed, _ := client.CoreV1().Pods("default").Get(ctx, "train", metav1.GetOptions{})
	fmt.Println(placed.Annotations["hami.io/vgpu-devices-allocated"])
	// Output:
	// 200 {"Nodes":null,"NodeNames":["gpu-1"],"FailedNodes":null,"FailedAndUnresolvableNodes":null,"Error":""}
	// GPU-a,NVIDIA,3000,0:;
}
