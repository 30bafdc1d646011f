package acmeplugin_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/internal/manifests"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

const (
	resourceName = "acme.example/npu"
	// npus and split are the plugin's simulated NPUs and its split count.
	npus  = 4
	split = 10
)

// acme is the vendor of the plugin, as examples/acmeplugin declares it.
var acme = annotation.NewVendor("ACME", resourceName)

// fixture is a node with the kubelet's device manager and the plugin running, registered.
type fixture struct {
	node, ns, devRoot string
	dm                *kubeletpeer.DeviceManager
	// registered are the NPUs of the register annotation, in its (canonical) order.
	registered []annotation.Device
}

// newFixture creates a Node and a namespace, the ClusterRole of deploy/rbac.yaml (under a
// name of its own) bound to the plugin's ServiceAccount, starts the device manager and the
// plugin, and waits for the register annotation and the kubelet's capacity.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := t.Context()
	f := &fixture{node: harness.UniqueName("npu"), ns: harness.UniqueName("acme"), devRoot: filepath.Join(t.TempDir(), "dev")}
	cp.CreateNode(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.node}})
	if err := cp.EnsureNamespace(ctx, f.ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.AdminClient().CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), f.ns, metav1.DeleteOptions{})
	})

	objs := manifests.Glob(t, filepath.Join("..", "..", "..", "examples", "acmeplugin", "deploy", "rbac.yaml"))
	role, ok := manifests.Find[*rbacv1.ClusterRole](objs, "acme-device-plugin")
	if !ok {
		t.Fatal("no ClusterRole acme-device-plugin in deploy/rbac.yaml")
	}
	role = &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: harness.UniqueName("acme-device-plugin")}, Rules: role.Rules}
	if _, err := cp.AdminClient().RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.AdminClient().RbacV1().ClusterRoles().Delete(context.WithoutCancel(ctx), role.Name, metav1.DeleteOptions{})
	})
	kubeconfig, err := cp.ServiceAccountKubeconfig(ctx, t.TempDir(), f.ns, "acme-device-plugin", role.Name)
	if err != nil {
		t.Fatal(err)
	}

	root := harness.ShortTempDir(t)
	f.dm = harness.StartDeviceManagerForTest(t, kubeletpeer.DeviceManagerOptions{Dir: filepath.Join(root, "device-plugins")})
	startPlugin(t, f.node, "--simulate", fmt.Sprint(npus), "--dev-root", f.devRoot, "--device-split-count", fmt.Sprint(split),
		"--kubeconfig", kubeconfig, "--kubelet-root-dir", root, "-v", "2")

	harness.Eventually(t, "the register annotation "+acme.RegisterKey, 30*time.Second, func() bool {
		devs, err := annotation.NodeDevices(cp.GetNode(t, f.node), acme)
		f.registered = devs
		return err == nil && len(devs) == npus
	})
	harness.WaitForResources(t, f.dm, resourceName, npus*split, npus*split)
	for i, d := range f.registered {
		want := annotation.Device{ID: d.ID, Index: uint(i), Count: split, Devmem: 16384, Devcore: 100, Type: "ACME-NPU", Health: true}
		if diff := cmp.Diff(want, d); diff != "" || !strings.HasPrefix(d.ID, fmt.Sprintf("ACME-%d-", i)) {
			t.Errorf("registered NPU %d (-want +got):\n%s", i, diff)
		}
		if _, err := os.Stat(filepath.Join(f.devRoot, fmt.Sprintf("acme%d", i))); err != nil {
			t.Errorf("device node of NPU %d: %v", i, err)
		}
	}
	return f
}

// startPlugin starts the examples/acmeplugin binary for node (harness.StartDevicePlugin: when t
// ends it is stopped with SIGTERM and must exit 0), its metrics on a free port (the default
// :9396 would collide between the tests' nodes; a later flag in args wins).
func startPlugin(t *testing.T, node string, args ...string) {
	t.Helper()
	if errBuild != nil {
		t.Fatal(errBuild)
	}
	harness.StartDevicePlugin(t, pluginBin, node, append([]string{"--metrics-bind-address=127.0.0.1:0"}, args...)...)
}

// share is a container's share of registered NPU k.
func (f *fixture) share(k int, mem, cores int32) allocation.ContainerDevice {
	return allocation.ContainerDevice{UUID: f.registered[k].ID, Type: acme.Name, Usedmem: mem, Usedcores: cores}
}

// TestAllocate binds pods as HAMi's scheduler binds them (the ACME vendor's pod annotations)
// and admits them through the kubelet's device manager, one container at a time: each
// container gets the device nodes and ACME environment of its entry, and no mounts; after the
// last one the pod has bind-phase success, its to-allocate entries are consumed and the node
// lock is gone.
func TestAllocate(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	type ctr struct {
		name string
		npus int64
	}
	tests := map[string]struct {
		ctrs    []ctr
		devices func() allocation.PodDevices
	}{
		"one NPU": {
			ctrs:    []ctr{{"infer", 1}},
			devices: func() allocation.PodDevices { return allocation.PodDevices{{f.share(2, 4096, 25)}} },
		},
		"two containers": {
			ctrs: []ctr{{"train", 2}, {"proxy", 0}, {"eval", 1}},
			devices: func() allocation.PodDevices {
				return allocation.PodDevices{{f.share(3, 8192, 50), f.share(0, 8192, 50)}, {}, {f.share(1, 2048, 10)}}
			},
		},
	}
	for name, tc := range tests { // sequential: one pod at a time holds the node lock
		t.Run(name, func(t *testing.T) {
			podName := strings.ReplaceAll(strings.ToLower(name), " ", "-")
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName, Namespace: f.ns}}
			var names []string
			for _, c := range tc.ctrs {
				k := corev1.Container{Name: c.name, Image: "registry.invalid/acme:0"}
				if c.npus > 0 {
					k.Resources.Limits = corev1.ResourceList{resourceName: *resource.NewQuantity(c.npus, resource.DecimalSI)}
					names = append(names, c.name)
				}
				pod.Spec.Containers = append(pod.Spec.Containers, k)
			}
			pod, err := cp.AdminClient().CoreV1().Pods(f.ns).Create(t.Context(), pod, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			devices := tc.devices()
			pod = allocationtest.Schedule(t, cp.AdminClient(), pod, f.node, devices, allocationtest.Options{Vendor: acme})
			if f.lock(t) == "" {
				t.Fatal("no node lock after bind")
			}
			entries := map[string]allocation.ContainerDevices{}
			for i, d := range devices {
				entries[pod.Spec.Containers[i].Name] = d
			}
			for _, c := range names {
				got, err := f.dm.Allocate(t.Context(), pod, c)
				if err != nil {
					t.Fatalf("allocate container %s: %v", c, err)
				}
				f.wantContainer(t, c, entries[c], got)
			}

			p, err := cp.AdminClient().CoreV1().Pods(f.ns).Get(t.Context(), podName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if ph := p.Annotations[allocation.KeyBindPhase]; ph != string(allocation.PhaseSuccess) {
				t.Errorf("%s = %q, want %q", allocation.KeyBindPhase, ph, allocation.PhaseSuccess)
			}
			if l := f.lock(t); l != "" {
				t.Errorf("node lock left behind: %s", l)
			}
			left, err := allocation.DecodePodDevices(p.Annotations[acme.ToAllocateKey], allocation.VersionMaster)
			if _, ok := left.Next(); err != nil || ok || len(left) != len(devices) {
				t.Errorf("%s = %q after the last container: want %d empty entries (%v)", acme.ToAllocateKey, p.Annotations[acme.ToAllocateKey], len(devices), err)
			}
			if got, want := p.Annotations[acme.AllocatedKey], allocation.EncodePodDevices(devices); got != want {
				t.Errorf("%s = %q, want the scheduler's %q untouched", acme.AllocatedKey, got, want)
			}
		})
	}
}

// wantContainer checks what the kubelet's device manager got for container name: a device
// node per NPU of the entry (host <dev-root>/acmeK, container /dev/acmeK, rw), in its order,
// ACME_VISIBLE_DEVICES and ACME_MEMORY_LIMIT_<i>, nothing else, and device ids that are
// replicas of the entry's NPUs (GetPreferredAllocation through ManagerImpl).
func (f *fixture) wantContainer(t *testing.T, name string, entry allocation.ContainerDevices, got kubeletpeer.Allocation) {
	t.Helper()
	want := kubeletpeer.Allocation{DeviceIDs: got.DeviceIDs, Envs: map[string]string{}}
	var ids []string
	for i, d := range entry {
		k := slices.IndexFunc(f.registered, func(r annotation.Device) bool { return r.ID == d.UUID })
		node := fmt.Sprintf("acme%d", f.registered[k].Index)
		want.Devices = append(want.Devices, kubeletpeer.Device{ContainerPath: "/dev/" + node, HostPath: filepath.Join(f.devRoot, node), Permissions: "rw"})
		want.Envs[fmt.Sprintf("ACME_MEMORY_LIMIT_%d", i)] = fmt.Sprint(d.Usedmem)
		ids = append(ids, d.UUID)
	}
	want.Envs["ACME_VISIBLE_DEVICES"] = strings.Join(ids, ",")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("container %s: what the kubelet got (-want +got):\n%s", name, diff)
	}
	if len(got.DeviceIDs[resourceName]) != len(entry) {
		t.Errorf("container %s: the kubelet chose %v, want %d devices", name, got.DeviceIDs[resourceName], len(entry))
	}
	for _, id := range got.DeviceIDs[resourceName] {
		if u, _, err := kubeletplugin.ParseVirtualDeviceID(id); err != nil || !slices.Contains(ids, u) {
			t.Errorf("container %s: the kubelet chose %s, not a replica of the scheduler's %v (%v)", name, id, ids, err)
		}
	}
}

// lock returns the Node's lock value, "" when there is none.
func (f *fixture) lock(t *testing.T) string {
	t.Helper()
	return cp.GetNode(t, f.node).Annotations[nodelock.Key]
}
