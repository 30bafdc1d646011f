package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/envtest/proc"
	"github.com/hamireg/hamireg/nodelock"
)

const (
	// GPUResource is the resource the simulated GPU node's plugin advertises.
	GPUResource = "nvidia.com/gpu"
	// SimulatedGPUs is the GPU count of the simulated DGX A100 (deviceplugin --simulate dgxa100).
	SimulatedGPUs = 8
	// DefaultSplit is the plugin's default split count: devices per GPU.
	DefaultSplit = 10
	// DefaultAgentRole is the ClusterRole a GPU node's plugin runs with when
	// GPUNodeOptions.Role is empty: exactly nodeagent.ClusterRoleRules().
	DefaultAgentRole = "e2e-nodeagent"
)

// GPUNodeOptions configures [ControlPlane.StartGPUNode].
type GPUNodeOptions struct {
	// Bin is the examples/deviceplugin binary (BuildProgram it in TestMain). Required.
	Bin string
	// Args are extra flags of the plugin (after --simulate dgxa100, --kubeconfig,
	// --kubelet-root-dir, --prepare-state-dir=false, --metrics-bind-address=127.0.0.1:0, -v 2;
	// a later flag wins).
	Args []string
	// Namespace is the namespace of the plugin's ServiceAccount and of CreatePod's pods; it is
	// created (and deleted when the test ends) when missing. Default a new UniqueName("gpu").
	Namespace string
	// Role is the ClusterRole of the plugin's ServiceAccount. Default DefaultAgentRole.
	Role string
}

// GPUNode is a Node with the kubelet's device manager (kubeletpeer) and examples/deviceplugin
// --simulate dgxa100 running against it, registered on both channels (the kubelet's 80
// devices and the register annotation's 8 GPUs).
type GPUNode struct {
	// Name is the Node's name, Namespace the namespace of its ServiceAccount and test pods.
	Name, Namespace string
	// DM is the kubelet's device manager of the node.
	DM *kubeletpeer.DeviceManager
	// Plugin is the running (or last) device plugin process.
	Plugin *DevicePlugin
	// GPUs are the registered GPUs, in the annotation's (canonical) order; ByIndex maps NVML
	// index to UUID.
	GPUs    []annotation.Device
	ByIndex map[uint]string

	cp         *ControlPlane
	opts       GPUNodeOptions
	root       string
	kubeconfig string
	changes    atomic.Int64
}

// StartGPUNode creates a Node (deleted when tb ends) and the namespace, starts the kubelet's
// device manager and the plugin, and waits until both channels carry the 8 GPUs. The test
// binary's TestMain must call kubeletpeer.RunIfChild first.
func (cp *ControlPlane) StartGPUNode(tb testing.TB, opts GPUNodeOptions) *GPUNode {
	tb.Helper()
	if opts.Bin == "" {
		tb.Fatal("GPUNodeOptions.Bin is empty: build examples/deviceplugin with harness.BuildProgram in TestMain")
	}
	if opts.Namespace == "" {
		opts.Namespace = UniqueName("gpu")
	}
	if opts.Role == "" {
		opts.Role = DefaultAgentRole
	}
	g := &GPUNode{Name: UniqueName("gpu"), Namespace: opts.Namespace, cp: cp, opts: opts}
	cp.CreateNode(tb, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: g.Name}})
	g.countChanges(tb)
	if _, err := cp.AdminClient().CoreV1().Namespaces().Get(tb.Context(), g.Namespace, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		if err := cp.EnsureNamespace(tb.Context(), g.Namespace); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() {
			_ = cp.AdminClient().CoreV1().Namespaces().Delete(context.WithoutCancel(tb.Context()), g.Namespace, metav1.DeleteOptions{})
		})
	}
	g.root = ShortTempDir(tb)
	g.DM = StartDeviceManagerForTest(tb, kubeletpeer.DeviceManagerOptions{Dir: filepath.Join(g.root, "device-plugins")})
	g.kubeconfig = cp.AgentKubeconfig(tb, g.Namespace, opts.Role)
	g.StartPlugin(tb)
	WaitForResources(tb, g.DM, GPUResource, SimulatedGPUs*DefaultSplit, SimulatedGPUs*DefaultSplit)
	g.GPUs = g.Registered(tb)
	if len(g.GPUs) != SimulatedGPUs {
		tb.Fatalf("annotation has %d GPUs, want %d", len(g.GPUs), SimulatedGPUs)
	}
	g.ByIndex = map[uint]string{}
	for _, d := range g.GPUs {
		g.ByIndex[d.Index] = d.ID
	}
	return g
}

// StartPlugin starts the node's plugin process (again, after Plugin.Stop) with the node's
// options and sets Plugin; it does not wait for the registration.
func (g *GPUNode) StartPlugin(tb testing.TB) *DevicePlugin {
	tb.Helper()
	// Metrics and probes on a free port: the default :9394 would collide between the nodes of
	// one host (Args may name another address: the last one wins).
	args := append([]string{"--simulate", "dgxa100", "--kubeconfig", g.kubeconfig, "--kubelet-root-dir", g.root,
		"--prepare-state-dir=false", "--metrics-bind-address=127.0.0.1:0", "-v", "2"}, g.opts.Args...)
	g.Plugin = StartDevicePlugin(tb, g.opts.Bin, g.Name, args...)
	return g.Plugin
}

// countChanges watches the Node and counts the changes of its register annotation.
func (g *GPUNode) countChanges(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithCancel(tb.Context())
	w, err := g.cp.AdminClient().CoreV1().Nodes().Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", g.Name).String(),
	})
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	tb.Cleanup(func() {
		cancel()
		w.Stop()
		wg.Wait()
	})
	wg.Go(func() {
		last := ""
		for ev := range w.ResultChan() {
			if n, ok := ev.Object.(*corev1.Node); ok {
				if v := n.Annotations[annotation.KeyNVIDIARegister]; v != last {
					last = v
					g.changes.Add(1)
				}
			}
		}
	})
}

// RegisterChanges counts the changes of the register annotation a watch of the Node saw since
// it was created.
func (g *GPUNode) RegisterChanges() int64 { return g.changes.Load() }

// Registered decodes the Node's register annotation.
func (g *GPUNode) Registered(tb testing.TB) []annotation.Device {
	tb.Helper()
	n := g.cp.GetNode(tb, g.Name)
	devs, err := annotation.Decode(n.Annotations[annotation.KeyNVIDIARegister])
	if err != nil {
		tb.Fatalf("decode %s of node %s: %v", annotation.KeyNVIDIARegister, g.Name, err)
	}
	return devs
}

// MakeReady gives the Node what a kubelet would: its device count (from the device
// manager), room for pods, the Ready condition, and no not-ready taint.
func (g *GPUNode) MakeReady(tb testing.TB) {
	tb.Helper()
	ctx := Context(tb)
	nodes := g.cp.AdminClient().CoreV1().Nodes()
	if err := g.DM.UpdateNodeStatus(ctx, g.cp.AdminClient().CoreV1(), g.Name); err != nil {
		tb.Fatal(err)
	}
	patch := fmt.Appendf(nil, `{"status":{"capacity":{"pods":"110","cpu":"64","memory":"512Gi"},"allocatable":{"pods":"110","cpu":"64","memory":"512Gi"},`+
		`"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":%[1]q,"lastTransitionTime":%[1]q}]}}`, time.Now().UTC().Format(time.RFC3339))
	if _, err := nodes.Patch(ctx, g.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		tb.Fatal(err)
	}
	if _, err := nodes.Patch(ctx, g.Name, types.MergePatchType, []byte(`{"spec":{"taints":null}}`), metav1.PatchOptions{}); err != nil {
		tb.Fatal(err)
	}
}

// LabelNodes labels the nodes with one value of TestLabel (the first node's name) and
// returns the examples/extender flag that selects them, so that an extender sees only the
// test's nodes of the shared cluster.
func (cp *ControlPlane) LabelNodes(tb testing.TB, nodes ...*GPUNode) string {
	tb.Helper()
	value := nodes[0].Name
	label := fmt.Appendf(nil, `{"metadata":{"labels":{%q:%q}}}`, TestLabel, value)
	for _, g := range nodes {
		if _, err := cp.AdminClient().CoreV1().Nodes().Patch(tb.Context(), g.Name, types.MergePatchType, label, metav1.PatchOptions{}); err != nil {
			tb.Fatal(err)
		}
	}
	return "--node-label-selector=" + TestLabel + "=" + value
}

// Share is one container's share of the GPU with NVML index gpu.
func (g *GPUNode) Share(gpu uint, mem, cores int32) allocation.ContainerDevice {
	return allocation.ContainerDevice{UUID: g.ByIndex[gpu], Type: "NVIDIA", Usedmem: mem, Usedcores: cores}
}

// Ctr describes a container of a test pod.
type Ctr struct {
	Name string
	Init bool
	// GPUs is the nvidia.com/gpu limit; 0: none.
	GPUs int64
}

// CreatePod creates a pending pod in the node's namespace with the given containers (no
// scheduler name: a test's scheduler binds it, or Schedule does).
func (g *GPUNode) CreatePod(tb testing.TB, name string, ctrs ...Ctr) *corev1.Pod {
	tb.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: g.Namespace}}
	for _, c := range ctrs {
		k := corev1.Container{Name: c.Name, Image: "registry.invalid/cuda:0"}
		if c.GPUs > 0 {
			k.Resources.Limits = corev1.ResourceList{GPUResource: *resource.NewQuantity(c.GPUs, resource.DecimalSI)}
		}
		if c.Init {
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, k)
		} else {
			pod.Spec.Containers = append(pod.Spec.Containers, k)
		}
	}
	created, err := g.cp.AdminClient().CoreV1().Pods(g.Namespace).Create(tb.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("create pod %s: %v", name, err)
	}
	return created
}

// Schedule writes what HAMi's scheduler writes at filter and bind (one entry per container,
// init containers first) and returns the bound pod.
func (g *GPUNode) Schedule(tb testing.TB, pod *corev1.Pod, devices allocation.PodDevices) *corev1.Pod {
	tb.Helper()
	return allocationtest.Schedule(tb, g.cp.AdminClient(), pod, g.Name, devices, allocationtest.Options{})
}

// GPUContainers returns the names of pod's containers that ask for GPUResource, init
// containers first: the kubelet's Allocate order.
func GPUContainers(pod *corev1.Pod) []string {
	var out []string
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			if q, ok := c.Resources.Limits[GPUResource]; ok && !q.IsZero() {
				out = append(out, c.Name)
			}
		}
	}
	return out
}

// Admit plays the kubelet's admission of pod: the device manager's Allocate for each GPU
// container, init containers first. It returns the allocations by container and the first
// error (the device manager's, with the plugin's text), after which it stops.
func (g *GPUNode) Admit(ctx context.Context, pod *corev1.Pod) (map[string]kubeletpeer.Allocation, error) {
	out := map[string]kubeletpeer.Allocation{}
	for _, c := range GPUContainers(pod) {
		a, err := g.DM.Allocate(ctx, pod, c)
		if err != nil {
			return out, fmt.Errorf("container %s: %w", c, err)
		}
		out[c] = a
	}
	return out, nil
}

// FailAdmission writes the pod's status as the kubelet does when its admission failed with
// err (an Allocate error): phase Failed, reason UnexpectedAdmissionError, message "Allocate
// failed due to rpc error: code = … desc = <the plugin's error>, which is unexpected".
func (g *GPUNode) FailAdmission(tb testing.TB, pod *corev1.Pod, err error) *corev1.Pod {
	tb.Helper()
	return g.cp.FailAdmission(tb, pod, err)
}

// FailAdmission writes pod's status as the kubelet does when its admission failed with err;
// see [GPUNode.FailAdmission].
func (cp *ControlPlane) FailAdmission(tb testing.TB, pod *corev1.Pod, err error) *corev1.Pod {
	tb.Helper()
	text := err.Error()
	if i := strings.Index(text, "rpc error:"); i >= 0 {
		text = text[i:]
	}
	p, gerr := cp.AdminClient().CoreV1().Pods(pod.Namespace).Get(tb.Context(), pod.Name, metav1.GetOptions{})
	if gerr != nil {
		tb.Fatalf("get pod %s/%s: %v", pod.Namespace, pod.Name, gerr)
	}
	p.Status.Phase = corev1.PodFailed
	p.Status.Reason = "UnexpectedAdmissionError"
	p.Status.Message = fmt.Sprintf("Allocate failed due to %s, which is unexpected", text)
	out, uerr := cp.AdminClient().CoreV1().Pods(pod.Namespace).UpdateStatus(tb.Context(), p, metav1.UpdateOptions{})
	if uerr != nil {
		tb.Fatalf("write the status of pod %s/%s: %v", pod.Namespace, pod.Name, uerr)
	}
	return out
}

// Pod reads a pod of the node's namespace; ok is false when it does not exist.
func (g *GPUNode) Pod(tb testing.TB, name string) (*corev1.Pod, bool) {
	tb.Helper()
	p, err := g.cp.AdminClient().CoreV1().Pods(g.Namespace).Get(tb.Context(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		tb.Fatalf("get pod %s: %v", name, err)
	}
	return p, true
}

// Lock returns the Node's lock value, "" when there is none.
func (g *GPUNode) Lock(tb testing.TB) string {
	tb.Helper()
	return g.cp.GetNode(tb, g.Name).Annotations[nodelock.Key]
}

// WantProtocolEnd checks the end state of a pod's allocation: bind-phase phase, the lock gone
// from the Node and the plugin still running.
func (g *GPUNode) WantProtocolEnd(tb testing.TB, name string, phase allocation.BindPhase) {
	tb.Helper()
	if p, ok := g.Pod(tb, name); ok {
		if got := p.Annotations[allocation.KeyBindPhase]; got != string(phase) {
			tb.Errorf("pod %s: %s = %q, want %q", name, allocation.KeyBindPhase, got, phase)
		}
	}
	if l := g.Lock(tb); l != "" {
		tb.Errorf("node lock left behind: %s", l)
	}
	if !g.Plugin.Running() {
		tb.Errorf("deviceplugin exited: %v", g.Plugin.ExitError())
	}
}

// PatchPodAnnotation merge-patches one annotation of pod.
func (cp *ControlPlane) PatchPodAnnotation(tb testing.TB, pod *corev1.Pod, key, value string) {
	tb.Helper()
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: value}}})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := cp.AdminClient().CoreV1().Pods(pod.Namespace).Patch(tb.Context(), pod.Name, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
		tb.Fatal(err)
	}
}

// Bind binds pod to node with a plain Binding, as a scheduler that knows nothing of HAMi does.
func (cp *ControlPlane) Bind(tb testing.TB, pod *corev1.Pod, node string) {
	tb.Helper()
	b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID}, Target: corev1.ObjectReference{Kind: "Node", Name: node}}
	if err := cp.AdminClient().CoreV1().Pods(pod.Namespace).Bind(tb.Context(), b, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
}

// ErrPluginExited is the error of a device plugin process that had exited before it was stopped.
var ErrPluginExited = errors.New("deviceplugin had exited")

// pluginRuns numbers the plugin processes, for their log names.
var pluginRuns atomic.Int64

// DevicePlugin is one examples/deviceplugin process.
type DevicePlugin struct {
	p       *proc.Process
	sp      *proc.Spawner
	logPath string
	stopped bool
}

// StartDevicePlugin starts the plugin binary bin for node with args. When tb ends it is
// stopped with SIGTERM (unless Stop was called) and must exit 0 (a race the detector found
// exits 66); its log tail is printed when tb failed.
func StartDevicePlugin(tb testing.TB, bin, node string, args ...string) *DevicePlugin {
	tb.Helper()
	d := &DevicePlugin{logPath: filepath.Join(tb.TempDir(), fmt.Sprintf("deviceplugin-%d.log", pluginRuns.Add(1)))}
	env := []string{"NODE_NAME=" + node}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "NODE_NAME=") && !strings.HasPrefix(e, "NodeName=") && !strings.HasPrefix(e, "HOOK_PATH=") {
			env = append(env, e)
		}
	}
	d.sp = proc.NewSpawner()
	p, err := d.sp.Start(proc.Options{Name: "deviceplugin", Path: bin, Args: args, Env: env, LogPath: d.logPath})
	if err != nil {
		d.sp.Close()
		tb.Fatal(err)
	}
	d.p = p
	tb.Cleanup(func() {
		if !d.stopped {
			d.Stop(tb)
		}
		if tb.Failed() {
			tb.Logf("deviceplugin log:\n%s", p.LogTail(80))
		}
	})
	return d
}

// Stop sends SIGTERM and fails tb unless the process exits 0 within 20 s.
func (d *DevicePlugin) Stop(tb testing.TB) {
	tb.Helper()
	d.stopped = true
	defer d.sp.Close()
	if !d.Running() {
		tb.Errorf("%v before SIGTERM: %v\n%s", ErrPluginExited, d.p.ExitError(), d.p.LogTail(40))
		return
	}
	if err := d.p.Stop(20 * time.Second); err != nil {
		tb.Errorf("%v\n%s", err, d.p.LogTail(40))
		return
	}
	if ee := (*exec.ExitError)(nil); errors.As(d.p.ExitError(), &ee) {
		tb.Errorf("deviceplugin exited with %v after SIGTERM, want 0\n%s", ee, d.p.LogTail(40))
	}
}

// Running reports whether the process is still running.
func (d *DevicePlugin) Running() bool {
	select {
	case <-d.p.Exited():
		return false
	default:
		return true
	}
}

// ExitError is the process's exit error, nil while it runs or after a clean exit.
func (d *DevicePlugin) ExitError() error { return d.p.ExitError() }

// Signal sends sig to the process.
func (d *DevicePlugin) Signal(tb testing.TB, sig syscall.Signal) {
	tb.Helper()
	if err := syscall.Kill(d.p.Pid(), sig); err != nil {
		tb.Fatalf("signal deviceplugin: %v", err)
	}
}

// Log returns what the process has logged so far.
func (d *DevicePlugin) Log(tb testing.TB) string {
	tb.Helper()
	b, err := os.ReadFile(d.logPath)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}
