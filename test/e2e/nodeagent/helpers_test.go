package nodeagent_test

import (
	"context"
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

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/envtest/proc"
	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

const (
	resourceName = "nvidia.com/gpu"
	// gpus and split are the simulated DGX A100's GPUs and the plugin's default split count.
	gpus  = 8
	split = 10
	// agentRole is the ClusterRole the agents run with: exactly nodeagent.ClusterRoleRules(),
	// the rules of deploy/rbac.yaml.
	agentRole = "e2e-nodeagent"
	// updateLine is HAMi's log line before each write of the register annotation.
	updateLine = "Updating node annotations with 8 device(s)"
)

// agent is one examples/deviceplugin process.
type agent struct {
	p       *proc.Process
	spawner *proc.Spawner
	logPath string
	stopped bool
}

// startAgent starts the plugin for node with the kubelet root dir root (its device-plugins
// folder is the device manager's), simulating a DGX A100. When tb ends it is stopped with
// SIGTERM and must exit 0 (a race the detector found exits 66).
func startAgent(tb testing.TB, node, root, kubeconfig string, extra ...string) *agent {
	tb.Helper()
	if errAgentBuild != nil {
		tb.Fatal(errAgentBuild)
	}
	a := &agent{spawner: proc.NewSpawner(), logPath: filepath.Join(tb.TempDir(), "deviceplugin.log")}
	args := append([]string{"--simulate", "dgxa100", "--kubeconfig", kubeconfig, "--kubelet-root-dir", root,
		"--prepare-state-dir=false", "-v", "2"}, extra...)
	env := []string{"NODE_NAME=" + node}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "NODE_NAME=") && !strings.HasPrefix(e, "NodeName=") && !strings.HasPrefix(e, "HOOK_PATH=") {
			env = append(env, e)
		}
	}
	p, err := a.spawner.Start(proc.Options{Name: "deviceplugin", Path: agentBin, Args: args, Env: env, LogPath: a.logPath})
	if err != nil {
		a.spawner.Close()
		tb.Fatal(err)
	}
	a.p = p
	tb.Cleanup(func() {
		if !a.stopped {
			a.stop(tb)
		}
		if tb.Failed() {
			tb.Logf("deviceplugin log:\n%s", p.LogTail(80))
		}
	})
	return a
}

// stop sends SIGTERM and fails tb unless the process exits 0 within 20 s.
func (a *agent) stop(tb testing.TB) {
	tb.Helper()
	a.stopped = true
	defer a.spawner.Close()
	if !a.running() {
		tb.Errorf("deviceplugin had exited before SIGTERM: %v\n%s", a.p.ExitError(), a.p.LogTail(40))
		return
	}
	if err := a.p.Stop(20 * time.Second); err != nil {
		tb.Errorf("%v\n%s", err, a.p.LogTail(40))
		return
	}
	if ee := (*exec.ExitError)(nil); errors.As(a.p.ExitError(), &ee) {
		tb.Errorf("deviceplugin exited with %v after SIGTERM, want 0\n%s", ee, a.p.LogTail(40))
	}
}

// running reports whether the process is still running.
func (a *agent) running() bool {
	select {
	case <-a.p.Exited():
		return false
	default:
		return true
	}
}

// signal sends sig to the process.
func (a *agent) signal(tb testing.TB, sig syscall.Signal) {
	tb.Helper()
	if err := syscall.Kill(a.p.Pid(), sig); err != nil {
		tb.Fatalf("signal deviceplugin: %v", err)
	}
}

// log returns what the process has logged so far.
func (a *agent) log(tb testing.TB) string {
	tb.Helper()
	b, err := os.ReadFile(a.logPath)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// fixture is a node with the kubelet's device manager and the plugin running, registered.
type fixture struct {
	node, ns string
	dm       *kubeletpeer.DeviceManager
	agent    *agent
	// gpus are the registered GPUs, in the annotation's (canonical) order.
	gpus []annotation.Device
	// byIndex maps NVML index to UUID.
	byIndex map[uint]string
	// changes counts the changes of the register annotation a watch of the Node saw since it
	// was created.
	changes atomic.Int64
}

// newFixture creates a Node and a namespace, starts the device manager and the plugin, and
// waits until both channels carry the 8 GPUs.
func newFixture(tb testing.TB, extra ...string) *fixture {
	tb.Helper()
	f := &fixture{node: harness.UniqueName("gpu"), ns: harness.UniqueName("na")}
	cp.CreateNode(tb, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.node}})
	f.countChanges(tb)
	if err := cp.EnsureNamespace(tb.Context(), f.ns); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = cp.AdminClient().CoreV1().Namespaces().Delete(context.WithoutCancel(tb.Context()), f.ns, metav1.DeleteOptions{})
	})
	root := harness.ShortTempDir(tb)
	f.dm = harness.StartDeviceManagerForTest(tb, kubeletpeer.DeviceManagerOptions{Dir: filepath.Join(root, "device-plugins")})
	f.agent = startAgent(tb, f.node, root, cp.AgentKubeconfig(tb, f.ns, agentRole), extra...)
	harness.WaitForResources(tb, f.dm, resourceName, gpus*split, gpus*split)
	f.gpus = f.registered(tb)
	if len(f.gpus) != gpus {
		tb.Fatalf("annotation has %d GPUs, want %d", len(f.gpus), gpus)
	}
	f.byIndex = map[uint]string{}
	for _, d := range f.gpus {
		f.byIndex[d.Index] = d.ID
	}
	return f
}

// countChanges watches the Node and counts the changes of its register annotation.
func (f *fixture) countChanges(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithCancel(tb.Context())
	w, err := cp.AdminClient().CoreV1().Nodes().Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", f.node).String(),
	})
	if err != nil {
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
					f.changes.Add(1)
				}
			}
		}
	})
}

// registered decodes the Node's register annotation.
func (f *fixture) registered(tb testing.TB) []annotation.Device {
	tb.Helper()
	n := cp.GetNode(tb, f.node)
	devs, err := annotation.Decode(n.Annotations[annotation.KeyNVIDIARegister])
	if err != nil {
		tb.Fatalf("decode %s of node %s: %v", annotation.KeyNVIDIARegister, f.node, err)
	}
	return devs
}

// share is one container's share of GPU index (NVML) gpu.
func (f *fixture) share(gpu uint, mem, cores int32) allocation.ContainerDevice {
	return allocation.ContainerDevice{UUID: f.byIndex[gpu], Type: "NVIDIA", Usedmem: mem, Usedcores: cores}
}

// ctr describes a container of a test pod.
type ctr struct {
	name string
	init bool
	gpus int64 // nvidia.com/gpu; 0: none
}

// createPod creates a pending pod in the fixture's namespace with the given containers.
func (f *fixture) createPod(tb testing.TB, name string, ctrs ...ctr) *corev1.Pod {
	tb.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns}}
	for _, c := range ctrs {
		k := corev1.Container{Name: c.name, Image: "registry.invalid/cuda:0"}
		if c.gpus > 0 {
			k.Resources.Limits = corev1.ResourceList{resourceName: *resource.NewQuantity(c.gpus, resource.DecimalSI)}
		}
		if c.init {
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, k)
		} else {
			pod.Spec.Containers = append(pod.Spec.Containers, k)
		}
	}
	created, err := cp.AdminClient().CoreV1().Pods(f.ns).Create(tb.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("create pod %s: %v", name, err)
	}
	return created
}

// schedule writes what HAMi's scheduler writes at filter and bind (one entry per container,
// init containers first) and returns the bound pod.
func (f *fixture) schedule(tb testing.TB, pod *corev1.Pod, devices allocation.PodDevices) *corev1.Pod {
	tb.Helper()
	return allocationtest.Schedule(tb, cp.AdminClient(), pod, f.node, devices, allocationtest.Options{})
}

// gpuContainers returns the names of pod's containers that ask for the resource, init
// containers first: the kubelet's Allocate order.
func gpuContainers(pod *corev1.Pod) []string {
	var out []string
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			if q, ok := c.Resources.Limits[resourceName]; ok && !q.IsZero() {
				out = append(out, c.Name)
			}
		}
	}
	return out
}

// pod reads a pod of the fixture's namespace; ok is false when it does not exist.
func (f *fixture) pod(tb testing.TB, name string) (*corev1.Pod, bool) {
	tb.Helper()
	p, err := cp.AdminClient().CoreV1().Pods(f.ns).Get(tb.Context(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		tb.Fatalf("get pod %s: %v", name, err)
	}
	return p, true
}

// lock returns the Node's lock value, "" when there is none.
func (f *fixture) lock(tb testing.TB) string {
	tb.Helper()
	return cp.GetNode(tb, f.node).Annotations[nodelock.Key]
}

// wantProtocolEnd checks the end state of a pod's allocation: bind-phase phase, the lock gone
// from the Node and the plugin still running.
func (f *fixture) wantProtocolEnd(tb testing.TB, name string, phase allocation.BindPhase) {
	tb.Helper()
	if p, ok := f.pod(tb, name); ok {
		if got := p.Annotations[allocation.KeyBindPhase]; got != string(phase) {
			tb.Errorf("pod %s: %s = %q, want %q", name, allocation.KeyBindPhase, got, phase)
		}
	}
	if l := f.lock(tb); l != "" {
		tb.Errorf("node lock left behind: %s", l)
	}
	if !f.agent.running() {
		tb.Errorf("deviceplugin exited: %v", f.agent.p.ExitError())
	}
}

func describe(err error) string {
	if err == nil {
		return "no error"
	}
	return fmt.Sprintf("error %q", err)
}
