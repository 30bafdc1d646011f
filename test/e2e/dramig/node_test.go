package dramig_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/nodeagent/nodedra"
	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlscantest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

var (
	// migGPUs are the GPUs scanned in MIG mode; the others are shared through HAMi-core.
	migGPUs = []uint{0, 1, 2}
	// draGPUs are the GPUs the DRA world owns: two in MIG mode, two shared.
	draGPUs = []string{"0", "1", "3", "4"}
)

// allowlist publishes A100-40GB's 1g.10gb (a REV profile: one compute slice on two memory
// slices) beside the chart's profiles.
func allowlist() mig.Allowlist {
	return mig.Allowlist{{Models: []string{"A100-SXM4-40GB"}, Profiles: []string{"1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "7g.40gb"}}}
}

// mixedSource scans GPUs 0-2 in MIG mode and the others in HAMi-core mode, from one
// simulated node: two scanners, each excluding the other's GPUs.
type mixedSource struct {
	mig, core *nvmlscan.Scanner
}

var (
	_ nodeagent.Source    = mixedSource{}
	_ nodeagent.PCISource = mixedSource{}
)

func (s mixedSource) Devices(ctx context.Context) ([]annotation.Device, []error, error) {
	a, fa, err := s.mig.Devices(ctx)
	if err != nil {
		return nil, nil, err
	}
	b, fb, err := s.core.Devices(ctx)
	if err != nil {
		return nil, nil, err
	}
	return append(a, b...), append(fa, fb...), nil
}

func (mixedSource) Changed() <-chan struct{} { return nil }

func (s mixedSource) PCIBusIDs() map[string]string {
	out := s.mig.PCIBusIDs()
	for k, v := range s.core.PCIBusIDs() {
		out[k] = v
	}
	return out
}

// migNode is a Node with the kubelet's DRA manager and device-plugin registration server
// in-process and the node agent on a simulated DGX A100 serving both worlds.
type migNode struct {
	name    string
	profile dra.Profile
	dra     *kubeletpeer.DRAManager
	sim     *nvmlscantest.Node
	cdiDir  string
	world   *nodedra.World
	agent   *nodeagent.Agent
	// uuids are the simulated GPUs' UUIDs by index.
	uuids []string
	// start starts the node agent and its DRA world; stop stops them (one test goroutine).
	start func(*testing.T)
	stop  func()
}

// startMIGNode creates the Node (ready, untainted) and its namespace, starts the kubelet
// peers and the agent, and waits until the driver has registered.
func startMIGNode(t *testing.T) *migNode {
	t.Helper()
	if errScheduler != nil {
		t.Fatal(errScheduler)
	}
	n := &migNode{name: harness.UniqueName("dramig"), profile: dra.SDKProfile()}
	root := harness.ShortTempDir(t)
	n.cdiDir = filepath.Join(root, "cdi")
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
	cp.CreateDeviceClass(t, n.profile)
	cp.MIGCreateDeviceClass(t, n.profile)
	n.dra = cp.StartDRAManagerForTest(t, kubeletpeer.DRAManagerOptions{NodeName: n.name, RegistryDir: filepath.Join(root, "reg")})
	srv, err := kubeletpeer.StartRegistrationServer(ctx, filepath.Join(root, "dp"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })

	n.sim = nvmlscantest.NewNode(t, dgxa100.New())
	t.Cleanup(func() {
		if err := n.sim.MIGOverlaps(); err != nil {
			t.Error(err)
		}
	})
	for i := range harness.SimulatedGPUs {
		n.uuids = append(n.uuids, n.sim.UUID(i))
	}
	var migOnly, coreOnly []uint
	for i := range uint(harness.SimulatedGPUs) {
		if slices.Contains(migGPUs, i) {
			coreOnly = append(coreOnly, i)
		} else {
			migOnly = append(migOnly, i)
		}
	}
	migScanner, err := nvmlscan.New(n.sim.Server, nvmlscan.Options{Sysfs: n.sim.Sysfs, Mode: nvmlscan.ModeMIG, ExcludeIndexes: migOnly,
		MIGAllowlist: allowlist(), MIGProfileDiscovery: nvmlscan.MIGDiscoveryAllProfiles})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = migScanner.Close() })
	coreScanner, err := nvmlscan.New(n.sim.Server, nvmlscan.Options{Sysfs: n.sim.Sysfs, ExcludeIndexes: coreOnly})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = coreScanner.Close() })

	n.start = func(t *testing.T) {
		t.Helper()
		world, err := nodedra.New(cp.AdminClient(), n.name, nodedra.Options{
			Plugin: draplugin.Options{
				Profile:        n.profile,
				RegistrarDir:   n.dra.RegistryDir(),
				PluginDir:      filepath.Join(root, "plugin"),
				CDIDir:         n.cdiDir,
				SliceSyncDelay: -1,
			},
			GPUs: draGPUs,
		})
		if err != nil {
			t.Fatal(err)
		}
		agent, err := nodeagent.New(cp.AdminClient(), n.name, mixedSource{mig: migScanner, core: coreScanner}, nodeagent.Options{
			Kubelet: kubeletplugin.Options{PluginDir: srv.Dir()},
			DRA:     world,
			MIG:     migScanner.MIG(),
		})
		if err != nil {
			t.Fatal(err)
		}
		n.world, n.agent = world, agent
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- agent.Run(runCtx) }()
		n.stop = func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("node agent of %s: %v", n.name, err)
			}
		}
	}
	n.start(t)
	t.Cleanup(func() { n.stop() })
	harness.WaitForDriver(t, n.dra, n.profile.Driver)
	n.makeReady(t)
	return n
}

// restart stops the node agent and starts a new one on the same folders (its DRA plugin reads
// the checkpoint of the old one), and waits until it has registered again.
func (n *migNode) restart(t *testing.T) {
	t.Helper()
	regs := n.dra.Registrations(n.profile.Driver)
	n.stop()
	n.start(t)
	harness.Eventually(t, "the restarted agent registered", harness.DRAWait, func() bool { return n.dra.Registrations(n.profile.Driver) > regs })
}

// makeReady gives the Node what a kubelet would: room for pods, the Ready condition, no
// not-ready taint.
func (n *migNode) makeReady(t *testing.T) {
	t.Helper()
	ctx := harness.Context(t)
	nodes := cp.AdminClient().CoreV1().Nodes()
	patch := fmt.Appendf(nil, `{"status":{"capacity":{"pods":"110","cpu":"64","memory":"512Gi"},"allocatable":{"pods":"110","cpu":"64","memory":"512Gi"},`+
		`"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":%[1]q,"lastTransitionTime":%[1]q}]}}`, time.Now().UTC().Format(time.RFC3339))
	if _, err := nodes.Patch(ctx, n.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.Patch(ctx, n.name, types.MergePatchType, []byte(`{"spec":{"taints":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitForSlices waits until the node's pool is published: a counter slice and a device slice
// with the MIG placements of the DRA-owned MIG GPUs.
func (n *migNode) waitForSlices(t *testing.T) []*resourcev1.ResourceSlice {
	t.Helper()
	w := cp.WatchSlices(t, n.profile.Driver, n.name)
	return w.WaitFor(t, "a counter slice and a device slice with MIG devices", func(s []*resourcev1.ResourceSlice) bool {
		counters, migDevs := 0, 0
		for _, sl := range s {
			counters += len(sl.Spec.SharedCounters)
			for _, d := range sl.Spec.Devices {
				if len(d.ConsumesCounters) > 0 {
					migDevs++
				}
			}
		}
		return len(s) == 2 && counters == 2 && migDevs > 0
	})
}

// prepare plays the kubelet admitting pod: Prepare and GetResources of container cuda.
func (n *migNode) prepare(t *testing.T, pod *corev1.Pod) []string {
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

// unprepare plays the kubelet ending pod: Unprepare, retried until the plugin (after a
// restart, once it registered again) answers.
func (n *migNode) unprepare(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	ctx := harness.Context(t)
	harness.Eventually(t, "Unprepare of pod "+pod.Name, harness.DRAWait, func() bool {
		err := n.dra.Unprepare(ctx, pod)
		if err != nil {
			t.Logf("unprepare pod %s: %v", pod.Name, err)
		}
		return err == nil
	})
}

// instances are the simulation's live MIG instances of GPU i.
func (n *migNode) instances(i int) []string {
	var out []string
	for _, in := range n.sim.MIGInstances(i) {
		out = append(out, fmt.Sprintf("%s@%d+%d=%s", in.Profile, in.Placement.Start, in.Placement.Size, in.MigUUID))
	}
	return out
}

// result is the one allocation result of an allocated claim.
func result(t *testing.T, c *resourcev1.ResourceClaim) resourcev1.DeviceRequestAllocationResult {
	t.Helper()
	if c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s: allocation %+v, want one result", c.Name, c.Status.Allocation)
	}
	return c.Status.Allocation.Devices.Results[0]
}
