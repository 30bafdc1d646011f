package dramap_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/kubernetes/pkg/controller/deployment"
	"k8s.io/kubernetes/pkg/controller/replicaset"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/nodeagent/nodedra"
	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlscantest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// Labels of this package's nodes: the extender registers every node labelled
// harness.TestLabel=extenderLabel; a test's pods select its own nodes with groupLabel.
const (
	extenderLabel = "dramap"
	groupLabel    = "dramap.hamireg.io/group"
)

// nodeOptions shape a node.
type nodeOptions struct {
	// group is the value of groupLabel.
	group string
	// dra gives every GPU to the DRA world (nodedra with the SDK profile): a DRA node.
	dra bool
	// nodeCapacity runs the agent with Options.NodeCapacity (--report-node-capacity).
	nodeCapacity bool
}

// node is a Node with the kubelet's device manager (a child process), on a DRA node also its
// DRA manager, and the node agent in-process on a simulated DGX A100.
type node struct {
	name   string
	dm     *kubeletpeer.DeviceManager
	dra    *kubeletpeer.DRAManager // nil on a device-plugin node
	agent  *nodeagent.Agent
	cdiDir string
}

// startNode creates the Node (ready, untainted), starts the kubelet peers and the agent, and
// returns once the kubelet counts the agent's GPUs (0 on a DRA node) and the Node's status
// carries the count.
func startNode(t *testing.T, o nodeOptions) *node {
	t.Helper()
	kind := "dp"
	if o.dra {
		kind = "dra"
	}
	n := &node{name: harness.UniqueName(kind)}
	root := harness.ShortTempDir(t)
	n.cdiDir = filepath.Join(root, "cdi")
	cp.CreateNode(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{
		corev1.LabelHostname: n.name, harness.TestLabel: extenderLabel, groupLabel: o.group,
	}}})
	ctx := harness.Context(t)
	n.dm = harness.StartDeviceManagerForTest(t, kubeletpeer.DeviceManagerOptions{Dir: filepath.Join(root, "dp")})
	sim := nvmlscantest.NewNode(t, dgxa100.New())
	scanner, err := nvmlscan.New(sim.Server, nvmlscan.Options{Sysfs: sim.Sysfs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = scanner.Close() })
	opts := nodeagent.Options{Kubelet: kubeletplugin.Options{PluginDir: n.dm.Dir()}, NodeCapacity: o.nodeCapacity}
	if o.dra {
		p := dra.SDKProfile()
		n.dra = cp.StartDRAManagerForTest(t, kubeletpeer.DRAManagerOptions{NodeName: n.name, RegistryDir: filepath.Join(root, "reg")})
		world, err := nodedra.New(cp.AdminClient(), n.name, nodedra.Options{Plugin: draplugin.Options{
			Profile: p, RegistrarDir: n.dra.RegistryDir(), PluginDir: filepath.Join(root, "plugin"), CDIDir: n.cdiDir, SliceSyncDelay: -1,
		}})
		if err != nil {
			t.Fatal(err)
		}
		opts.DRA = world
	}
	if n.agent, err = nodeagent.New(cp.AdminClient(), n.name, scanner, opts); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- n.agent.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("node agent of %s: %v", n.name, err)
		}
	})
	if o.dra {
		harness.WaitForDriver(t, n.dra, dra.SDKDriver)
	}
	count := int64(harness.SimulatedGPUs * harness.DefaultSplit)
	if o.dra {
		count = 0 // every GPU is DRA's: the kubelet counts none
	}
	harness.WaitForResources(t, n.dm, harness.GPUResource, count, count)
	if err := n.dm.UpdateNodeStatus(ctx, cp.AdminClient().CoreV1(), n.name); err != nil {
		t.Fatal(err)
	}
	nodes := cp.AdminClient().CoreV1().Nodes()
	patch := fmt.Appendf(nil, `{"status":{"capacity":{"pods":"110","cpu":"64","memory":"512Gi"},"allocatable":{"pods":"110","cpu":"64","memory":"512Gi"},`+
		`"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":%[1]q,"lastTransitionTime":%[1]q}]}}`, time.Now().UTC().Format(time.RFC3339))
	if _, err := nodes.Patch(ctx, n.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.Patch(ctx, n.name, types.MergePatchType, []byte(`{"spec":{"taints":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	return n
}

// registered decodes the Node's register annotation.
func (n *node) registered(t *testing.T) []annotation.Device {
	t.Helper()
	devs, err := annotation.Decode(cp.GetNode(t, n.name).Annotations[annotation.KeyNVIDIARegister])
	if err != nil {
		t.Fatalf("decode the register annotation of %s: %v", n.name, err)
	}
	return devs
}

// startScheduler starts examples/extender over this package's nodes and kube-scheduler with
// the extender's configuration (profile hami-scheduler), both stopped when t ends.
func startScheduler(t *testing.T) {
	t.Helper()
	if errExtenderBuild != nil {
		t.Fatalf("build examples/extender: %v", errExtenderBuild)
	}
	url := cp.StartExtender(t, extenderBin, "--node-label-selector="+harness.TestLabel+"="+extenderLabel)
	s, err := cp.StartScheduler(harness.Context(t), envtest.SchedulerOptions{Config: harness.ExtenderSchedulerConfig(t, url)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
}

// runControllers runs kube-controller-manager's Deployment and ReplicaSet controllers
// in-process until t ends.
func runControllers(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(harness.Context(t))
	client := cp.AdminClient()
	f := informers.NewSharedInformerFactory(client, 0)
	dc, err := deployment.NewDeploymentController(ctx, f.Apps().V1().Deployments(), f.Apps().V1().ReplicaSets(), f.Core().V1().Pods(), client)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	rsc := replicaset.NewReplicaSetController(ctx, f.Apps().V1().ReplicaSets(), f.Core().V1().Pods(), client, replicaset.BurstReplicas)
	f.Start(ctx.Done())
	var wg sync.WaitGroup
	wg.Go(func() { dc.Run(ctx, 1) })
	wg.Go(func() { rsc.Run(ctx, 1) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		f.Shutdown()
	})
}

// namespace creates a namespace for the test's pods.
func namespace(t *testing.T) string {
	t.Helper()
	ns := harness.UniqueName("dramap")
	ctx := harness.Context(t)
	if err := cp.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.AdminClient().CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), ns, metav1.DeleteOptions{})
	})
	return ns
}

// release removes a pod the way a kubelet and kube-controller-manager would: through
// harness.ReleaseClaim when it holds an extended-resource claim, else a forced deletion.
func release(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if s := pod.Status.ExtendedResourceClaimStatus; s != nil {
		cp.ReleaseClaim(t, pod.Namespace, pod.Name, s.ResourceClaimName)
		return
	}
	_ = cp.AdminClient().CoreV1().Pods(pod.Namespace).Delete(context.WithoutCancel(t.Context()), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
}
