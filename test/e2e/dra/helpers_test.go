package dra_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/monitor"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/nodeagent/nodedra"
	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlscantest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// nodeOptions shape a DRA node.
type nodeOptions struct {
	// profile is the DRA profile; zero: dra.SDKProfile().
	profile dra.Profile
	// gpus are the DRA-owned GPUs (nodedra.Options.GPUs); empty: all.
	gpus []string
	// deviceManager runs the kubelet's full device manager (a child process) instead of its
	// registration server alone, for pods that ask for nvidia.com/gpu.
	deviceManager bool
	// period is the agent's rescan period; zero: 30 s.
	period time.Duration
	// monitor runs the node monitor in the agent (nodeagent.Options.Monitor, a 200 ms
	// round) on <hook>/vgpu, with the DRA driver making each claim's folder there
	// (PrepareStateDir) and the agent's metrics on draNode.metrics.
	monitor bool
}

// draNode is a Node with the kubelet's DRA manager (and device-plugin registration server
// or device manager) in-process and the node agent on a simulated DGX A100 serving both
// worlds.
type draNode struct {
	name    string // the Node, its namespace and its kubernetes.io/hostname label
	profile dra.Profile
	opts    nodeOptions
	dra     *kubeletpeer.DRAManager
	dm      *kubeletpeer.DeviceManager // with deviceManager
	sim     *nvmlscantest.Node
	root    string
	hook    string               // HAMi-core's hook path, with monitor
	metrics *prometheus.Registry // the agent's registry, with monitor
	cdiDir  string
	kubelet string // the device plugins' folder (kubelet.sock)

	mu    sync.Mutex
	agent *nodeagent.Agent
	world *nodedra.World
	stop  func()
}

// startDRANode creates the Node (ready, untainted) and its namespace, starts the kubelet
// peers and the agent, and waits until the driver has registered with the DRA manager.
func startDRANode(t *testing.T, o nodeOptions) *draNode {
	t.Helper()
	if errScheduler != nil {
		t.Fatal(errScheduler)
	}
	if o.profile.Driver == "" {
		o.profile = dra.SDKProfile()
	}
	n := &draNode{name: harness.UniqueName("dra"), profile: o.profile, opts: o, root: harness.ShortTempDir(t)}
	n.cdiDir = filepath.Join(n.root, "cdi")
	cp.CreateNode(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{
		corev1.LabelHostname: n.name, harness.TestLabel: n.name,
	}}})
	ctx := harness.Context(t)
	if err := cp.EnsureNamespace(ctx, n.name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.AdminClient().CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), n.name, metav1.DeleteOptions{})
	})
	cp.CreateDeviceClass(t, o.profile)
	n.dra = cp.StartDRAManagerForTest(t, kubeletpeer.DRAManagerOptions{NodeName: n.name, RegistryDir: filepath.Join(n.root, "reg")})
	if o.deviceManager {
		n.dm = harness.StartDeviceManagerForTest(t, kubeletpeer.DeviceManagerOptions{Dir: filepath.Join(n.root, "dp")})
		n.kubelet = n.dm.Dir()
	} else {
		srv, err := kubeletpeer.StartRegistrationServer(ctx, filepath.Join(n.root, "dp"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Stop() })
		n.kubelet = srv.Dir()
	}
	n.sim = nvmlscantest.NewNode(t, dgxa100.New())
	if o.monitor {
		// No <root>/containers: with the DRA world's claims the monitor scans claims/ alone.
		n.hook = t.TempDir()
	}
	n.startAgent(t)
	t.Cleanup(n.stopAgent)
	harness.WaitForDriver(t, n.dra, o.profile.Driver)
	n.makeReady(t)
	return n
}

// startAgent starts the node agent (again) with the node's options on a new scanner of the
// simulated node.
func (n *draNode) startAgent(t *testing.T) {
	t.Helper()
	scanner, err := nvmlscan.New(n.sim.Server, nvmlscan.Options{Sysfs: n.sim.Sysfs})
	if err != nil {
		t.Fatal(err)
	}
	popts := draplugin.Options{
		Profile:        n.profile,
		RegistrarDir:   n.dra.RegistryDir(),
		PluginDir:      filepath.Join(n.root, "plugin"),
		CDIDir:         n.cdiDir,
		SliceSyncDelay: -1,
	}
	aopts := nodeagent.Options{
		Period:  n.opts.period,
		Kubelet: kubeletplugin.Options{PluginDir: n.kubelet},
	}
	if n.opts.monitor {
		popts.Env.HookPath, popts.PrepareStateDir = n.hook, true
		n.metrics = prometheus.NewRegistry()
		aopts.Registerer = n.metrics
		aopts.Monitor = &monitor.Options{Root: filepath.Join(n.hook, "vgpu"), Period: 200 * time.Millisecond}
	}
	world, err := nodedra.New(cp.AdminClient(), n.name, nodedra.Options{Plugin: popts, GPUs: n.opts.gpus})
	if err != nil {
		_ = scanner.Close()
		t.Fatal(err)
	}
	aopts.DRA = world
	agent, err := nodeagent.New(cp.AdminClient(), n.name, scanner, aopts)
	if err != nil {
		_ = scanner.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(harness.Context(t))
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	n.mu.Lock()
	n.agent, n.world = agent, world
	n.stop = func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("node agent of %s: %v", n.name, err)
		}
		_ = scanner.Close()
	}
	n.mu.Unlock()
}

// stopAgent stops the running agent; idempotent.
func (n *draNode) stopAgent() {
	n.mu.Lock()
	stop := n.stop
	n.stop = nil
	n.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// currentWorld is the running agent's DRA world.
func (n *draNode) currentWorld() *nodedra.World {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.world
}

func (n *draNode) currentAgent() *nodeagent.Agent {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.agent
}

// makeReady gives the Node what a kubelet would: room for pods, the Ready condition, no
// not-ready taint, and with the device manager its nvidia.com/gpu count.
func (n *draNode) makeReady(t *testing.T) {
	t.Helper()
	ctx := harness.Context(t)
	nodes := cp.AdminClient().CoreV1().Nodes()
	if n.dm != nil {
		harness.WaitForResources(t, n.dm, harness.GPUResource, int64(8-n.draGPUs())*harness.DefaultSplit, int64(8-n.draGPUs())*harness.DefaultSplit)
		if err := n.dm.UpdateNodeStatus(ctx, cp.AdminClient().CoreV1(), n.name); err != nil {
			t.Fatal(err)
		}
	}
	patch := fmt.Appendf(nil, `{"status":{"capacity":{"pods":"110","cpu":"64","memory":"512Gi"},"allocatable":{"pods":"110","cpu":"64","memory":"512Gi"},`+
		`"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":%[1]q,"lastTransitionTime":%[1]q}]}}`, time.Now().UTC().Format(time.RFC3339))
	if _, err := nodes.Patch(ctx, n.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.Patch(ctx, n.name, types.MergePatchType, []byte(`{"spec":{"taints":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// draGPUs is how many of the 8 GPUs the DRA world owns.
func (n *draNode) draGPUs() int {
	if len(n.opts.gpus) == 0 {
		return 8
	}
	return len(n.opts.gpus)
}

// registered decodes the Node's register annotation.
func (n *draNode) registered(t *testing.T) []annotation.Device {
	t.Helper()
	node := cp.GetNode(t, n.name)
	devs, err := annotation.Decode(node.Annotations[annotation.KeyNVIDIARegister])
	if err != nil {
		t.Fatalf("decode %s of node %s: %v", annotation.KeyNVIDIARegister, n.name, err)
	}
	return devs
}

// waitForSlice waits until the node's one slice has the 8 devices (all GPUs of the
// dgxa100: none is in MIG mode) and returns its devices.
func (n *draNode) waitForSlice(t *testing.T, w *harness.SliceWatch, what string, cond func([]resourcev1.Device) bool) []resourcev1.Device {
	t.Helper()
	s := w.WaitFor(t, what, func(s []*resourcev1.ResourceSlice) bool {
		return len(s) == 1 && len(s[0].Spec.Devices) == harness.SimulatedGPUs && cond(s[0].Spec.Devices)
	})
	return s[0].Spec.Devices
}

// hasTaint reports whether d carries the NoSchedule taint key.
func hasTaint(d resourcev1.Device, key string) bool {
	return slices.ContainsFunc(d.Taints, func(t resourcev1.DeviceTaint) bool {
		return t.Key == key && t.Effect == resourcev1.DeviceTaintEffectNoSchedule
	})
}

// prepare plays the kubelet admitting pod: Prepare and GetResources of container cuda.
func (n *draNode) prepare(t *testing.T, pod *corev1.Pod) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(harness.Context(t), harness.DRAWait)
	defer cancel()
	if err := n.dra.Prepare(ctx, pod); err != nil {
		t.Fatalf("prepare pod %s: %v", pod.Name, err)
	}
	ids, err := n.dra.GetResources(pod, "cuda")
	if err != nil {
		t.Fatal(err)
	}
	return ids
}
