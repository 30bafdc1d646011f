package nodeagent_test

import (
	"context"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/nvmlscan"
)

// vendorGPUs is a vendor's own device source: a fixed inventory with no health watch. A real
// one reads the vendor's management library in Devices and closes a channel from Changed when
// a device's health changes.
type vendorGPUs []annotation.Device

func (v vendorGPUs) Devices(context.Context) ([]annotation.Device, []error, error) {
	return v, nil, nil
}
func (vendorGPUs) Changed() <-chan struct{} { return nil }

// Example runs an agent for two GPUs split 5 ways against a fake API server and a fake kubelet:
// the register annotation is written first, then the kubelet counts 2 × 5 devices.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}})
	kubelet, err := kubelettest.NewServer(ctx) // in tests: kubelettest.Start(t)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer kubelet.Close()

	source := vendorGPUs{
		{ID: "GPU-a", Index: 0, Count: 5, Devmem: 24576, Devcore: 100, Type: "NVIDIA-L4", Mode: "hami-core", Health: true},
		{ID: "GPU-b", Index: 1, Count: 5, Devmem: 24576, Devcore: 100, Type: "NVIDIA-L4", Mode: "hami-core", Health: true},
	}
	agent, err := nodeagent.New(client, "gpu-1", source, nodeagent.Options{
		Kubelet:       kubeletplugin.Options{PluginDir: kubelet.Dir()},
		EventRecorder: &record.FakeRecorder{},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()

	waitCtx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	state, err := kubelet.WaitFor(waitCtx, func(s kubelettest.State) bool {
		p, ok := s.Resource("nvidia.com/gpu")
		return ok && p.Healthy() == 10
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	node, _ := client.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
	fmt.Println(node.Annotations[annotation.KeyNVIDIARegister])
	p, _ := state.Resource("nvidia.com/gpu")
	fmt.Println("allocatable nvidia.com/gpu:", p.Healthy())
	cancel()
	fmt.Println("Run:", <-done)
	// Output:
	// [{"id":"GPU-a","count":5,"devmem":24576,"devcore":100,"type":"NVIDIA-L4","mode":"hami-core","health":true},{"id":"GPU-b","index":1,"count":5,"devmem":24576,"devcore":100,"type":"NVIDIA-L4","mode":"hami-core","health":true}]
	// allocatable nvidia.com/gpu: 10
	// Run: <nil>
}

// The package documentation's usage snippet, compiled: an NVIDIA node program.
func ExampleNew() {
	run := func(ctx context.Context, clientset kubernetes.Interface, nodeName string) error {
		// snippet: doc
		scanner, err := nvmlscan.New(nvml.New(), nvmlscan.Options{SplitCount: 10})
		if err != nil {
			return err
		}
		defer scanner.Close() //nolint:errcheck // as in the package documentation
		agent, err := nodeagent.New(clientset, nodeName, scanner, nodeagent.Options{})
		if err != nil {
			return err
		}
		return agent.Run(ctx)
		// end snippet
	}
	_ = run
}
