package schedplugin_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/internal/manifests"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// Pods placed by the plugin on a node of examples/deviceplugin (the kubelet's device manager,
// simulated DGX A100) are allocated by the kubelet's Allocate: at bind the pod has HAMi's
// annotations, bind-phase allocating and the node lock; the container gets the devices and
// the memory limit the plugin chose; then bind-phase is success and the lock is gone, so the
// next pod binds on the same node.
func TestDevicePluginAllocatesPlacements(t *testing.T) {
	t.Parallel()
	if errDevicePlugin != nil {
		t.Fatal(errDevicePlugin)
	}
	g := cp.StartGPUNode(t, harness.GPUNodeOptions{Bin: devicePluginBin})
	g.MakeReady(t)
	cp.LabelNodes(t, g) // harness.TestLabel=g.Name
	sched := startScheduler(t, nil)
	for i, ask := range []map[string]int64{
		{resGPU: 1, resMem: 4096, resCores: 30},
		{resGPU: 2, resMem: 10000},
	} {
		name := fmt.Sprintf("cuda-%d", i)
		createPod(t, gpuPod(g.Namespace, name, sched, g.Name, ask))
		p := waitBound(t, g.Namespace, name)
		pd := wantBindStart(t, p, annotation.NVIDIA())
		if len(pd) != 1 || len(pd[0]) != int(ask[resGPU]) {
			t.Fatalf("pod %s: devices %v, want %d GPUs for its one container", name, pd, ask[resGPU])
		}
		got, err := g.Admit(t.Context(), p)
		if err != nil {
			t.Fatalf("kubelet admission of %s: %v", name, err)
		}
		var uuids []string
		for k, d := range pd[0] {
			uuids = append(uuids, d.UUID)
			if d.Usedmem != int32(ask[resMem]) {
				t.Errorf("pod %s GPU %s: %d MiB, want %d", name, d.UUID, d.Usedmem, ask[resMem])
			}
			if lim := got["cuda"].Envs[fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d", k)]; lim != fmt.Sprintf("%dm", ask[resMem]) {
				t.Errorf("pod %s: CUDA_DEVICE_MEMORY_LIMIT_%d = %q, want %dm", name, k, lim, ask[resMem])
			}
		}
		if vis := got["cuda"].Envs["NVIDIA_VISIBLE_DEVICES"]; vis != strings.Join(uuids, ",") {
			t.Errorf("pod %s: NVIDIA_VISIBLE_DEVICES = %q, want the plugin's GPUs %v", name, vis, uuids)
		}
		g.WantProtocolEnd(t, name, allocation.PhaseSuccess)
	}
}

// Pods placed by the plugin on API-object nodes are allocated by allocationtest's stand-in of
// HAMi's own device plugin, which finds the pod through the node lock (HAMi's Allocate): it
// serves the plugin's device entry, sets bind-phase success and releases the lock.
func TestHAMiDevicePluginAllocatesPlacements(t *testing.T) {
	t.Parallel()
	test := harness.UniqueName("hamidp")
	node := harness.UniqueName("gpu")
	devs := apiGPUNode(t, test, node)
	ns := namespace(t, "hamidp")
	sched := startScheduler(t, nil)
	plugin := allocationtest.NewPlugin(cp.AdminClient(), node, allocationtest.Options{})
	for i := range 3 {
		name := fmt.Sprintf("cuda-%d", i)
		createPod(t, gpuPod(ns, name, sched, test, map[string]int64{resGPU: 1, resMem: 8000, resCores: 25}))
		p := waitBound(t, ns, name)
		pd := wantBindStart(t, p, annotation.NVIDIA())
		a, err := plugin.Allocate(t.Context(), 1)
		if err != nil {
			t.Fatalf("HAMi's Allocate for %s: %v", name, err)
		}
		if a.Pod != (types.NamespacedName{Namespace: ns, Name: name}) || !a.Last || a.Failed {
			t.Errorf("Allocate served %+v, want the last entry of %s/%s", a, ns, name)
		}
		if len(a.Devices) != 1 || len(pd) != 1 || a.Devices[0] != pd[0][0] {
			t.Errorf("Allocate served %v, the plugin placed %v", a.Devices, pd)
		}
		if !strings.HasPrefix(a.Devices[0].UUID, "GPU-"+node+"-") || a.Devices[0].Usedmem != 8000 || a.Devices[0].Usedcores != 25 {
			t.Errorf("device %+v, want 8000 MiB and 25 %% of a GPU of %s (%d registered)", a.Devices[0], node, len(devs))
		}
		wantAllocated(t, ns, name)
	}
}

// The ACME vendor of examples/acmeplugin: with vendors [{name: ACME, resourceName:
// acme.example/npu}] in its args, the plugin places an NPU pod on a node of examples/acmeplugin
// (the kubelet's device manager, simulated NPUs) with the vendor's annotations, and the
// kubelet's Allocate through the plugin serves the device node the plugin chose.
func TestACMEVendorPlacedAndAllocated(t *testing.T) {
	t.Parallel()
	if errACME != nil {
		t.Fatal(errACME)
	}
	const npuResource = "acme.example/npu"
	acme := annotation.NewVendor("ACME", npuResource)
	ctx := t.Context()
	node, ns := harness.UniqueName("npu"), namespace(t, "acme")
	cp.CreateNode(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{harness.TestLabel: node}}})

	objs := manifests.Glob(t, filepath.Join("..", "..", "..", "examples", "acmeplugin", "deploy", "rbac.yaml"))
	role, ok := manifests.Find[*rbacv1.ClusterRole](objs, "acme-device-plugin")
	if !ok {
		t.Fatal("no ClusterRole acme-device-plugin in examples/acmeplugin/deploy/rbac.yaml")
	}
	role = &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: harness.UniqueName("acme-device-plugin")}, Rules: role.Rules}
	if _, err := cp.AdminClient().RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.AdminClient().RbacV1().ClusterRoles().Delete(context.WithoutCancel(ctx), role.Name, metav1.DeleteOptions{})
	})
	kubeconfig, err := cp.ServiceAccountKubeconfig(ctx, t.TempDir(), ns, "acme-device-plugin", role.Name)
	if err != nil {
		t.Fatal(err)
	}
	root := harness.ShortTempDir(t)
	devRoot := filepath.Join(t.TempDir(), "dev")
	dm := harness.StartDeviceManagerForTest(t, kubeletpeer.DeviceManagerOptions{Dir: filepath.Join(root, "device-plugins")})
	harness.StartDevicePlugin(t, acmePluginBin, node, "--simulate", "4", "--dev-root", devRoot, "--device-split-count", "10",
		"--kubeconfig", kubeconfig, "--kubelet-root-dir", root, "--metrics-bind-address=127.0.0.1:0", "-v", "2")
	var registered []annotation.Device
	harness.Eventually(t, "the register annotation "+acme.RegisterKey, 30*time.Second, func() bool {
		devs, err := annotation.NodeDevices(cp.GetNode(t, node), acme)
		registered = devs
		return err == nil && len(devs) == 4
	})
	harness.WaitForResources(t, dm, npuResource, 40, 40)
	makeReady(t, dm, node)

	sched := startScheduler(t, map[string]any{"vendors": []map[string]any{{"name": "ACME", "resourceName": npuResource}}})
	createPod(t, gpuPod(ns, "npu", sched, node, map[string]int64{npuResource: 1}))
	p := waitBound(t, ns, "npu")
	pd := wantBindStart(t, p, acme)
	if len(pd) != 1 || len(pd[0]) != 1 || pd[0][0].Type != acme.Name {
		t.Fatalf("devices %v, want one ACME NPU", pd)
	}
	if !strings.HasPrefix(pd[0][0].UUID, "ACME-") {
		t.Errorf("device %+v is not one of the registered NPUs %v", pd[0][0], registered)
	}
	got, err := dm.Allocate(ctx, p, "cuda")
	if err != nil {
		t.Fatalf("kubelet admission: %v", err)
	}
	if vis := got.Envs["ACME_VISIBLE_DEVICES"]; vis != pd[0][0].UUID {
		t.Errorf("ACME_VISIBLE_DEVICES = %q, want the plugin's NPU %s", vis, pd[0][0].UUID)
	}
	if len(got.Devices) != 1 || !strings.HasPrefix(got.Devices[0].HostPath, devRoot) {
		t.Errorf("device nodes %+v, want the NPU's under %s", got.Devices, devRoot)
	}
	wantAllocated(t, ns, "npu")
}

// makeReady gives a Node what a kubelet would: the device manager's counts, room for pods,
// the Ready condition, no taints.
func makeReady(tb testing.TB, dm *kubeletpeer.DeviceManager, node string) {
	tb.Helper()
	ctx := tb.Context()
	nodes := cp.AdminClient().CoreV1().Nodes()
	if err := dm.UpdateNodeStatus(ctx, cp.AdminClient().CoreV1(), node); err != nil {
		tb.Fatal(err)
	}
	n := cp.GetNode(tb, node)
	for k, v := range map[corev1.ResourceName]string{corev1.ResourcePods: "110", corev1.ResourceCPU: "64", corev1.ResourceMemory: "512Gi"} {
		n.Status.Capacity[k] = resource.MustParse(v)
		n.Status.Allocatable[k] = resource.MustParse(v)
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now()}}
	n, err := nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	n.Spec.Taints = nil
	if _, err := nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		tb.Fatal(err)
	}
}
