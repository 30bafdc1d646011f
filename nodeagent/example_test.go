package nodeagent_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/clienttest"
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

// acmeNPUs is a made-up accelerator's source that is also its Allocator: each NPU becomes a
// device node /dev/acme<index> and the container learns its NPUs from ACME_VISIBLE_DEVICES.
type acmeNPUs []annotation.Device

func (a acmeNPUs) Devices(context.Context) ([]annotation.Device, []error, error) { return a, nil, nil }
func (acmeNPUs) Changed() <-chan struct{}                                        { return nil }

func (a acmeNPUs) Allocate(_ context.Context, req nodeagent.ContainerRequest) (allocation.Response, error) {
	var r allocation.Response
	var visible []string
	for _, d := range req.Devices {
		i := slices.IndexFunc(req.NodeDevices, func(n annotation.Device) bool { return n.ID == d.UUID })
		if i < 0 {
			return r, fmt.Errorf("NPU %s is not on this node", d.UUID)
		}
		node := fmt.Sprintf("/dev/acme%d", req.NodeDevices[i].Index)
		r.DeviceNodes = append(r.DeviceNodes, allocation.DeviceNode{ContainerPath: node, HostPath: node})
		visible = append(visible, strconv.FormatUint(uint64(req.NodeDevices[i].Index), 10))
	}
	r.Envs = map[string]string{"ACME_VISIBLE_DEVICES": strings.Join(visible, ",")}
	return r, nil
}

// A vendor's Allocator: the agent finds the pod HAMi's scheduler bound (allocationtest plays
// the scheduler), checks its entry and asks the source, which implements nodeagent.Allocator,
// for the container's device nodes and env; the kubelet (kubelettest) receives them.
func ExampleAllocator() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	acme := annotation.Vendor{
		Name: "ACME", RegisterKey: "hami.io/node-acme-register", ResourceName: "acme.com/npu",
		ToAllocateKey: "hami.io/acme-devices-to-allocate", AllocatedKey: "hami.io/acme-devices-allocated",
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "infer", UID: "uid-1"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}}}
	client := clienttest.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "npu-1"}}, pod)
	kubelet, err := kubelettest.NewServer(ctx) // in tests: kubelettest.Start(t)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer kubelet.Close()

	source := acmeNPUs{
		{ID: "NPU-a", Index: 0, Count: 4, Devmem: 16384, Devcore: 100, Type: "ACME-N1", Health: true},
		{ID: "NPU-b", Index: 1, Count: 4, Devmem: 16384, Devcore: 100, Type: "ACME-N1", Health: true},
	}
	agent, err := nodeagent.New(client, "npu-1", source, nodeagent.Options{
		Vendor:        acme, // Options.Allocator defaults to the source, which implements it
		Kubelet:       kubeletplugin.Options{PluginDir: kubelet.Dir(), SocketName: "acme-npu.sock"},
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
	if _, err := kubelet.WaitFor(waitCtx, func(s kubelettest.State) bool {
		p, ok := s.Resource("acme.com/npu")
		return ok && p.Healthy() == 8
	}); err != nil {
		fmt.Println(err)
		return
	}

	// HAMi's scheduler gives the pod's container NPU-b.
	devs := allocation.PodDevices{{{UUID: "NPU-b", Type: "ACME", Usedmem: 8192, Usedcores: 50}}}
	if _, err := allocationtest.NewScheduler(client, allocationtest.Options{Vendor: acme}).Schedule(ctx, pod, "npu-1", devs); err != nil {
		fmt.Println(err)
		return
	}
	ids, _ := kubelet.PickHealthy(ctx, "acme.com/npu", 1) // the agent's preference: a replica of NPU-b
	resp, err := kubelet.Allocate(ctx, "acme.com/npu", ids)
	if err != nil {
		fmt.Println(err)
		return
	}
	c := resp.GetContainerResponses()[0]
	fmt.Println("kubelet asked for", ids)
	fmt.Println("env ACME_VISIBLE_DEVICES =", c.GetEnvs()["ACME_VISIBLE_DEVICES"])
	for _, d := range c.GetDevices() {
		fmt.Println("device node", d.GetHostPath(), d.GetPermissions())
	}
	served, _ := client.CoreV1().Pods("default").Get(ctx, "infer", metav1.GetOptions{})
	fmt.Println("bind-phase", served.Annotations[allocation.KeyBindPhase])
	cancel()
	fmt.Println("Run:", <-done)
	// Output:
	// kubelet asked for [NPU-b-0]
	// env ACME_VISIBLE_DEVICES = 1
	// device node /dev/acme1 rw
	// bind-phase success
	// Run: <nil>
}

// ExampleProbeHandler serves the agent's probes beside /metrics on one server, as
// examples/deviceplugin does on --metrics-bind-address. Before Run the agent is not ready.
func ExampleProbeHandler() {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}})
	reg := prometheus.NewRegistry()
	agent, err := nodeagent.New(client, "gpu-1", vendorGPUs{}, nodeagent.Options{Registerer: reg})
	if err != nil {
		fmt.Println(err)
		return
	}
	// snippet: README
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{})) // reg: Options.Registerer
	probes := nodeagent.ProbeHandler(agent.Healthy, agent.Ready)
	mux.Handle(nodeagent.PathHealthz, probes) // Agent.Healthy
	mux.Handle(nodeagent.PathReadyz, probes)  // Agent.Ready
	// end snippet
	srv := httptest.NewServer(mux) // a program: &http.Server{Handler: mux, ReadHeaderTimeout: ...}
	defer srv.Close()

	resp, err := http.Get(srv.URL + nodeagent.PathReadyz)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	fmt.Print(resp.StatusCode, " ", string(body))
	// Output:
	// 503 node agent not ready: node gpu-1: node agent not running
}
