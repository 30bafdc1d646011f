package envtest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
	"github.com/hamireg/hamireg/nodeagent"
)

// twoGPUs is the device source of the node agent under test: two GPUs split 5 ways, which
// never change. A vendor's source reads its management library instead.
type twoGPUs struct{}

func (twoGPUs) Devices(context.Context) ([]annotation.Device, []error, error) {
	return []annotation.Device{
		{ID: "GPU-a", Index: 0, Count: 5, Devmem: 24576, Devcore: 100, Type: "NVIDIA-L4", Mode: "hami-core", Health: true},
		{ID: "GPU-b", Index: 1, Count: 5, Devmem: 24576, Devcore: 100, Type: "NVIDIA-L4", Mode: "hami-core", Health: true},
	}, nil, nil
}

func (twoGPUs) Changed() <-chan struct{} { return nil }

// bindPod creates the pod demo/train, whose container "cuda" asks for one nvidia.com/gpu, and
// binds it to gpu-1 as HAMi's scheduler binds it (allocationtest): GPU-a, 3000 MiB, 30 % of
// its cores, in hami.io/vgpu-devices-to-allocate, the node lock, bind-phase allocating.
func bindPod(ctx context.Context, cp *envtest.ControlPlane) (*corev1.Pod, error) {
	if err := cp.EnsureNamespace(ctx, "demo"); err != nil {
		return nil, err
	}
	pod, err := cp.AdminClient().CoreV1().Pods("demo").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "train"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "cuda", Image: "cuda",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}},
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	devices := allocation.PodDevices{{{UUID: "GPU-a", Type: "NVIDIA", Usedmem: 3000, Usedcores: 30}}}
	return allocationtest.NewScheduler(cp.AdminClient(), allocationtest.Options{}).Schedule(ctx, pod, "gpu-1", devices)
}

// Example is a node agent's test against a real API server (kube-apiserver and etcd from
// [envtest.Start]) with the fake kubelet of package kubelettest: a node agent registers two
// GPUs, a pod is bound as HAMi's scheduler binds it (allocationtest), and the test picks the
// replica IDs and calls the agent's Allocate over the plugin's gRPC connection as the kubelet
// does. The API server is real, so the agent's node lock, pod patches and RBAC are exercised
// as in a cluster. For the kubelet's own device manager instead of the fake, see package
// kubeletpeer's Example.
//
// It needs etcd and kube-apiserver (from setup-envtest's folder, for one), so it has no
// Output comment and only compiles here; with the build tag e2e, TestExample runs it and
// checks that it prints
//
//	devices: [GPU-a-0]
//	NVIDIA_VISIBLE_DEVICES=GPU-a
//	CUDA_DEVICE_MEMORY_LIMIT_0=3000m
//	CUDA_DEVICE_SM_LIMIT=30
//	bind-phase: success
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ctx = klog.NewContext(ctx, logr.Discard())

	cp, err := envtest.Start(ctx, envtest.Options{Logf: func(string, ...any) {}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = cp.Stop() }()
	kubelet, err := kubelettest.NewServer(ctx) // in a test function: kubelettest.Start(t)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer kubelet.Close()

	client := cp.AdminClient()
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}}, metav1.CreateOptions{}); err != nil {
		fmt.Println(err)
		return
	}
	agent, err := nodeagent.New(client, "gpu-1", twoGPUs{}, nodeagent.Options{
		Kubelet: kubeletplugin.Options{PluginDir: kubelet.Dir()},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	agentCtx, stopAgent := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.Run(agentCtx) }()
	defer func() {
		stopAgent()
		if err := <-done; err != nil {
			fmt.Println("Run:", err)
		}
	}()

	if _, err := kubelet.WaitFor(ctx, func(s kubelettest.State) bool {
		p, ok := s.Resource("nvidia.com/gpu")
		return ok && p.Healthy() == 10
	}); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := bindPod(ctx, cp); err != nil {
		fmt.Println(err)
		return
	}

	ids, err := kubelet.PickHealthy(ctx, "nvidia.com/gpu", 1) // asks the agent's GetPreferredAllocation
	if err != nil {
		fmt.Println(err)
		return
	}
	resp, err := kubelet.Allocate(ctx, "nvidia.com/gpu", ids)
	if err != nil {
		fmt.Println(err)
		return
	}
	envs := resp.GetContainerResponses()[0].GetEnvs()
	fmt.Println("devices:", ids)
	for _, k := range []string{"NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_SM_LIMIT"} {
		fmt.Printf("%s=%s\n", k, envs[k])
	}
	after, err := client.CoreV1().Pods("demo").Get(ctx, "train", metav1.GetOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("bind-phase:", after.Annotations[allocation.KeyBindPhase])
}
