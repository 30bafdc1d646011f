package drarobust_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/hamicore"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/nodeagent/nodedra"
	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlscantest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// robustNode is a Node with the kubelet's DRA manager in-process; its DRA driver is either
// the node agent in-process (startAgent) or the DRA plugin in a child process (startChild).
// The plugin makes each claim's HAMi-core state folder under hook.
type robustNode struct {
	name    string
	profile dra.Profile
	dra     *kubeletpeer.DRAManager
	root    string
	cdiDir  string
	plugin  string // PluginDir
	hook    string
	kubelet string // the device plugins' folder

	mu     sync.Mutex
	world  *nodedra.World
	stop   func()
	errors []error // what the plugin handed Options.OnError
}

// startNode creates the Node (ready, untainted), its namespace, the DeviceClass and the
// kubelet's DRA manager.
func startNode(tb testing.TB) *robustNode {
	tb.Helper()
	if errScheduler != nil {
		tb.Fatal(errScheduler)
	}
	n := &robustNode{name: harness.UniqueName("robust"), profile: dra.SDKProfile(), root: harness.ShortTempDir(tb)}
	n.cdiDir = filepath.Join(n.root, "cdi")
	n.plugin = filepath.Join(n.root, "plugin")
	n.hook = filepath.Join(n.root, "hook")
	cp.CreateNode(tb, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{
		corev1.LabelHostname: n.name, harness.TestLabel: n.name,
	}}})
	ctx := harness.Context(tb)
	if err := cp.EnsureNamespace(ctx, n.name); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = cp.AdminClient().CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), n.name, metav1.DeleteOptions{})
	})
	cp.CreateDeviceClass(tb, n.profile)
	n.dra = cp.StartDRAManagerForTest(tb, kubeletpeer.DRAManagerOptions{NodeName: n.name, RegistryDir: filepath.Join(n.root, "reg")})
	srv, err := kubeletpeer.StartRegistrationServer(ctx, filepath.Join(n.root, "dp"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = srv.Stop() })
	n.kubelet = srv.Dir()
	n.makeReady(tb)
	tb.Cleanup(n.stopDriver)
	return n
}

// makeReady gives the Node what a kubelet would: room for pods, the Ready condition, no
// not-ready taint.
func (n *robustNode) makeReady(tb testing.TB) {
	tb.Helper()
	ctx := harness.Context(tb)
	nodes := cp.AdminClient().CoreV1().Nodes()
	patch := fmt.Appendf(nil, `{"status":{"capacity":{"pods":"1100","cpu":"64","memory":"512Gi"},"allocatable":{"pods":"1100","cpu":"64","memory":"512Gi"},`+
		`"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":%[1]q,"lastTransitionTime":%[1]q}]}}`, time.Now().UTC().Format(time.RFC3339))
	if _, err := nodes.Patch(ctx, n.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		tb.Fatal(err)
	}
	if _, err := nodes.Patch(ctx, n.name, types.MergePatchType, []byte(`{"spec":{"taints":null}}`), metav1.PatchOptions{}); err != nil {
		tb.Fatal(err)
	}
}

// agentOptions shape the in-process agent's plugin.
type agentOptions struct {
	staleClaimPeriod time.Duration
	clock            clock.WithTicker
}

// startAgent starts the node agent with its DRA world in-process (again), on a new scanner
// of a simulated DGX A100, and waits until the driver registered (again).
func (n *robustNode) startAgent(tb testing.TB, o agentOptions) {
	tb.Helper()
	regs := n.dra.Registrations(n.profile.Driver)
	sim := nvmlscantest.NewNode(tb, dgxa100.New())
	scanner, err := nvmlscan.New(sim.Server, nvmlscan.Options{Sysfs: sim.Sysfs})
	if err != nil {
		tb.Fatal(err)
	}
	popts := draplugin.Options{
		Profile:          n.profile,
		RegistrarDir:     n.dra.RegistryDir(),
		PluginDir:        n.plugin,
		CDIDir:           n.cdiDir,
		Env:              hamicore.EnvOptions{HookPath: n.hook},
		PrepareStateDir:  true,
		SliceSyncDelay:   -1,
		StaleClaimPeriod: o.staleClaimPeriod,
		Clock:            o.clock,
		OnError: func(_ context.Context, err error, _ string) {
			n.mu.Lock()
			n.errors = append(n.errors, err)
			n.mu.Unlock()
		},
	}
	world, err := nodedra.New(cp.AdminClient(), n.name, nodedra.Options{Plugin: popts})
	if err != nil {
		_ = scanner.Close()
		tb.Fatal(err)
	}
	agent, err := nodeagent.New(cp.AdminClient(), n.name, scanner, nodeagent.Options{DRA: world, Kubelet: kubeletplugin.Options{PluginDir: n.kubelet}})
	if err != nil {
		_ = scanner.Close()
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(harness.Context(tb))
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	n.mu.Lock()
	n.world = world
	n.stop = func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			tb.Errorf("node agent of %s: %v", n.name, err)
		}
		_ = scanner.Close()
	}
	n.mu.Unlock()
	n.waitForRegistration(tb, regs)
}

// waitForRegistration waits until the driver registered with the DRA manager more often than
// regs.
func (n *robustNode) waitForRegistration(tb testing.TB, regs int) {
	tb.Helper()
	harness.Eventually(tb, "the DRA driver registered", harness.DRAWait, func() bool { return n.dra.Registrations(n.profile.Driver) > regs })
}

// stopDriver stops the in-process agent; idempotent.
func (n *robustNode) stopDriver() {
	n.mu.Lock()
	stop := n.stop
	n.stop = nil
	n.mu.Unlock()
	if stop != nil {
		stop()
	}
}

func (n *robustNode) currentPlugin() *draplugin.Plugin {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.world.Plugin()
}

func (n *robustNode) reported() []error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]error(nil), n.errors...)
}

// prepare plays the kubelet admitting pod and returns the CDI device IDs of container cuda.
func (n *robustNode) prepare(ctx context.Context, pod *corev1.Pod) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, harness.DRAWait)
	defer cancel()
	if err := n.dra.Prepare(ctx, pod); err != nil {
		return nil, fmt.Errorf("prepare pod %s: %w", pod.Name, err)
	}
	return n.dra.GetResources(pod, "cuda")
}

// leftovers are what prepared claims leave on the node: the checkpoint's entries, the CDI
// spec files and the HAMi-core state folders.
type leftovers struct {
	checkpoint, specs, stateDirs int
}

func (n *robustNode) leftovers(tb testing.TB) leftovers {
	tb.Helper()
	var l leftovers
	data, err := os.ReadFile(filepath.Join(n.plugin, draplugin.CheckpointFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		tb.Fatal(err)
	}
	if err == nil {
		var c struct {
			Claims map[string]json.RawMessage `json:"claims"`
		}
		if err := json.Unmarshal(data, &c); err != nil {
			tb.Fatalf("checkpoint: %v", err)
		}
		l.checkpoint = len(c.Claims)
	}
	l.specs = len(harness.CDISpecFiles(tb, n.cdiDir))
	dirs, err := os.ReadDir(filepath.Join(n.hook, "vgpu", "claims"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		tb.Fatal(err)
	}
	l.stateDirs = len(dirs)
	return l
}
