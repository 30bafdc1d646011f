//go:build e2e

package kubeletpeer_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
)

const testDriver = "test.hamireg.io"

// testPlugin is a minimal DRA driver on the upstream kubeletplugin helper (not the SDK's
// draplugin, so that the peer is tested on its own): every allocated device of a claim
// becomes one CDI ID test.hamireg.io/claim=<claimUID>-<device>.
type testPlugin struct {
	mu         sync.Mutex
	prepared   map[types.UID][]string // claim UID → CDI IDs
	prepares   int
	unprepared []types.UID
}

func (p *testPlugin) PrepareResourceClaims(_ context.Context, claims []*resourcev1.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		p.prepares++
		var res kubeletplugin.PrepareResult
		var ids []string
		for _, r := range c.Status.Allocation.Devices.Results {
			id := fmt.Sprintf("%s/claim=%s-%s", testDriver, c.UID, r.Device)
			ids = append(ids, id)
			res.Devices = append(res.Devices, kubeletplugin.Device{
				Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, CDIDeviceIDs: []string{id},
			})
		}
		p.prepared[c.UID] = ids
		out[c.UID] = res
	}
	return out, nil
}

func (p *testPlugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		delete(p.prepared, c.UID)
		p.unprepared = append(p.unprepared, c.UID)
		out[c.UID] = nil
	}
	return out, nil
}

func (p *testPlugin) HandleError(context.Context, error, string) {}

func (p *testPlugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func (p *testPlugin) state() (prepares int, unprepared []types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.prepares, slices.Clone(p.unprepared)
}

// TestDRAManager runs the kubelet's DRA manager against a real kube-apiserver: it wipes the
// node's ResourceSlices at start, registers a driver through its registry folder, prepares a
// claim allocated and reserved by hand, hands out its CDI IDs, and unprepares it — also
// after a restart on the same state folder.
func TestDRAManager(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()

	cp, err := envtest.Start(ctx, envtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	client := cp.AdminClient()

	const nodeName = "dra-peer"
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}
	if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A stale slice of another driver: the manager's start-up wipe deletes it.
	stale := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "stale"},
		Spec: resourcev1.ResourceSliceSpec{
			Driver: "stale.example.com", NodeName: new(nodeName),
			Pool:    resourcev1.ResourcePool{Name: nodeName, ResourceSliceCount: 1},
			Devices: []resourcev1.Device{{Name: "dev-0"}},
		},
	}
	if _, err := client.ResourceV1().ResourceSlices().Create(ctx, stale, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	if _, err := kubeletpeer.StartDRAManager(ctx, kubeletpeer.DRAManagerOptions{}); err == nil {
		t.Error("StartDRAManager without Client and NodeName succeeded")
	}
	// Defaults: temp folders, removed by Stop.
	m, err := kubeletpeer.StartDRAManager(ctx, kubeletpeer.DRAManagerOptions{Client: client, NodeName: nodeName})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForWipe(ctx); err != nil {
		t.Fatal(err)
	}
	if list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 0 {
		t.Fatalf("ResourceSlices after the wipe: %d, %v; want none", len(list.Items), err)
	}
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := m.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	for _, dir := range []string{m.RegistryDir(), m.StateDir()} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("default folder %s after Stop: %v; want it removed", dir, err)
		}
	}

	stateDir := t.TempDir()
	regDir, err := os.MkdirTemp("", "kp-reg-") //nolint:usetesting // t.TempDir embeds the test name; socket paths must stay < 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(regDir) }()
	m, err = kubeletpeer.StartDRAManager(ctx, kubeletpeer.DRAManagerOptions{Client: client, NodeName: nodeName, StateDir: stateDir, RegistryDir: regDir})
	if err != nil {
		t.Fatal(err)
	}
	defer func(m *kubeletpeer.DRAManager) { _ = m.Stop() }(m)
	if err := m.WaitForWipe(ctx); err != nil {
		t.Fatal(err)
	}

	plugin := &testPlugin{prepared: map[types.UID][]string{}}
	dataDir, err := os.MkdirTemp("", "kp-dra-") //nolint:usetesting // t.TempDir embeds the test name; socket paths must stay < 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(dataDir) }()
	helper, err := kubeletplugin.Start(ctx, plugin,
		kubeletplugin.DriverName(testDriver),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(nodeName),
		kubeletplugin.RegistrarDirectoryPath(m.RegistryDir()),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer helper.Stop()
	if err := m.WaitForDriver(ctx, testDriver); err != nil {
		t.Fatal(err)
	}
	if n := m.Registrations(testDriver); n != 1 {
		t.Errorf("Registrations = %d, want 1", n)
	}

	pod := allocatedPod(ctx, t, client, nodeName)

	if err := m.Prepare(ctx, pod); err != nil {
		t.Fatal(err)
	}
	uid := claimUID(ctx, t, client)
	want := []string{fmt.Sprintf("%s/claim=%s-gpu-3", testDriver, uid)}
	ids, err := m.GetResources(pod, "cuda")
	if err != nil || !slices.Equal(ids, want) {
		t.Fatalf("GetResources = %q, %v; want %q", ids, err, want)
	}
	if ids, err := m.GetResources(pod, "sidecar"); err != nil || len(ids) != 0 {
		t.Errorf("GetResources(sidecar, no claim) = %q, %v; want none", ids, err)
	}
	if _, err := m.GetResources(pod, "missing"); err == nil {
		t.Error("GetResources of a container the pod lacks succeeded")
	}
	if err := m.Prepare(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if n, _ := plugin.state(); n != 1 {
		t.Errorf("driver prepared %d times, want 1 (the second Prepare finds the claim prepared)", n)
	}

	// A kubelet restart: a new manager on the same state folder knows the prepared claim.
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	m, err = kubeletpeer.StartDRAManager(ctx, kubeletpeer.DRAManagerOptions{Client: client, NodeName: nodeName, StateDir: stateDir, RegistryDir: regDir})
	if err != nil {
		t.Fatal(err)
	}
	defer func(m *kubeletpeer.DRAManager) { _ = m.Stop() }(m)
	if err := m.WaitForDriver(ctx, testDriver); err != nil {
		t.Fatal(err)
	}
	if ids, err := m.GetResources(pod, "cuda"); err != nil || !slices.Equal(ids, want) {
		t.Fatalf("GetResources after the restart = %q, %v; want %q", ids, err, want)
	}
	if err := m.Unprepare(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if _, unprepared := plugin.state(); len(unprepared) != 1 || unprepared[0] != uid {
		t.Errorf("driver unprepared %v, want the claim once", unprepared)
	}
	if _, err := m.GetResources(pod, "cuda"); err == nil {
		t.Error("GetResources after Unprepare succeeded")
	}
	if err := m.Unprepare(ctx, pod); err != nil {
		t.Errorf("second Unprepare: %v", err)
	}
	if _, unprepared := plugin.state(); len(unprepared) != 1 {
		t.Errorf("driver unprepared %d times, want 1", len(unprepared))
	}

	helper.Stop()
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
}

// allocatedPod creates claim "gpu" and pod "dra" on nodeName using it (container cuda; the
// sidecar uses none), and allocates and reserves the claim as kube-scheduler would: device
// gpu-3 of the test driver's pool.
func allocatedPod(ctx context.Context, t *testing.T, client kubernetes.Interface, nodeName string) *corev1.Pod {
	t.Helper()
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu", Namespace: metav1.NamespaceDefault},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: testDriver},
		}}}},
	}
	claim, err := client.ResourceV1().ResourceClaims(claim.Namespace).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "dra", Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			NodeName:       nodeName,
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: new("gpu")}},
			Containers: []corev1.Container{
				{Name: "cuda", Image: "cuda", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}},
				{Name: "sidecar", Image: "sidecar"},
			},
		},
	}
	if pod, err = client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim.Status = resourcev1.ResourceClaimStatus{
		Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
			Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: testDriver, Pool: nodeName, Device: "gpu-3"}},
		}},
		ReservedFor: []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}},
	}
	if _, err := client.ResourceV1().ResourceClaims(claim.Namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return pod
}

func claimUID(ctx context.Context, t *testing.T, client kubernetes.Interface) types.UID {
	t.Helper()
	c, err := client.ResourceV1().ResourceClaims(metav1.NamespaceDefault).Get(ctx, "gpu", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c.UID
}
