package dradoctor_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/nodeagent/nodedra"
	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlscantest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// draNode is a Node with the kubelet's DRA manager and device-plugin registration server
// in-process and the node agent on a simulated DGX A100 whose 8 GPUs the DRA world owns
// (SDK profile).
type draNode struct {
	name    string
	profile dra.Profile
	dra     *kubeletpeer.DRAManager
	sim     *nvmlscantest.Node
}

// startDRANode creates the Node (ready, untainted) and its namespace, starts the kubelet
// peers and the agent (stopped when t ends), and waits until the driver has registered.
func startDRANode(t *testing.T) *draNode {
	t.Helper()
	if errScheduler != nil {
		t.Fatal(errScheduler)
	}
	n := &draNode{name: harness.UniqueName("drd"), profile: dra.SDKProfile()}
	root := harness.ShortTempDir(t)
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
	n.dra = cp.StartDRAManagerForTest(t, kubeletpeer.DRAManagerOptions{NodeName: n.name, RegistryDir: filepath.Join(root, "reg")})
	srv, err := kubeletpeer.StartRegistrationServer(ctx, filepath.Join(root, "dp"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	n.sim = nvmlscantest.NewNode(t, dgxa100.New())

	scanner, err := nvmlscan.New(n.sim.Server, nvmlscan.Options{Sysfs: n.sim.Sysfs})
	if err != nil {
		t.Fatal(err)
	}
	world, err := nodedra.New(cp.AdminClient(), n.name, nodedra.Options{Plugin: draplugin.Options{
		Profile: n.profile, RegistrarDir: n.dra.RegistryDir(), PluginDir: filepath.Join(root, "plugin"),
		CDIDir: filepath.Join(root, "cdi"), SliceSyncDelay: -1,
	}})
	if err != nil {
		_ = scanner.Close()
		t.Fatal(err)
	}
	agent, err := nodeagent.New(cp.AdminClient(), n.name, scanner, nodeagent.Options{
		Period: 200 * time.Millisecond, Kubelet: kubeletplugin.Options{PluginDir: srv.Dir()}, DRA: world,
	})
	if err != nil {
		_ = scanner.Close()
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.Run(actx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("node agent of %s: %v", n.name, err)
		}
		_ = scanner.Close()
	})
	harness.WaitForDriver(t, n.dra, n.profile.Driver)

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
