//go:build e2e

package kubeletpeer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
)

// healthPlugin is testPlugin with a health stream: every stream gets the current health of
// device gpu-3 at once and each change.
type healthPlugin struct {
	*testPlugin
	pool string

	mu      sync.Mutex
	health  kubeletplugin.HealthStatus
	changed chan struct{}
}

func (p *healthPlugin) set(h kubeletplugin.HealthStatus) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.health = h
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *healthPlugin) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	for {
		p.mu.Lock()
		h, changed := p.health, p.changed
		p.mu.Unlock()
		r := kubeletplugin.DeviceHealthReport{Devices: []kubeletplugin.DeviceHealth{{PoolName: p.pool, DeviceName: "gpu-3", Health: h, Message: "gpu-3 is " + string(h)}}}
		select {
		case reports <- r:
		case <-ctx.Done():
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil
		}
	}
}

// TestDRAManagerPodStatus: the health a driver streams reaches the pod's
// allocatedResourcesStatus through WritePodStatus, and a change through SyncPodStatus, which
// runs once at a time and returns when its context ends.
func TestDRAManagerPodStatus(t *testing.T) {
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
	const nodeName = "dra-health"
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	m, err := kubeletpeer.StartDRAManager(ctx, kubeletpeer.DRAManagerOptions{Client: client, NodeName: nodeName})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Stop() }()
	if err := m.WaitForWipe(ctx); err != nil {
		t.Fatal(err)
	}
	plugin := &healthPlugin{testPlugin: &testPlugin{prepared: map[types.UID][]string{}}, pool: nodeName, health: kubeletplugin.HealthStatusHealthy, changed: make(chan struct{})}
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
	)
	if err != nil {
		t.Fatal(err)
	}
	defer helper.Stop()
	if err := m.WaitForDriver(ctx, testDriver); err != nil {
		t.Fatal(err)
	}
	pod := allocatedPod(ctx, t, client, nodeName)
	if err := m.Prepare(ctx, pod); err != nil {
		t.Fatal(err)
	}
	id := corev1.ResourceID(fmt.Sprintf("%s/claim=%s-gpu-3", testDriver, claimUID(ctx, t, client)))

	pods := client.CoreV1()
	read := func() (*corev1.Pod, corev1.ResourceHealth) {
		t.Helper()
		p, err := pods.Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, cs := range p.Status.ContainerStatuses {
			for _, rs := range cs.AllocatedResourcesStatus {
				for _, r := range rs.Resources {
					if cs.Name == "cuda" && rs.Name == "claim:gpu" && r.ResourceID == id {
						return p, r
					}
				}
			}
		}
		return p, corev1.ResourceHealth{}
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				p, _ := read()
				t.Fatalf("timed out waiting for %s; container statuses %+v", what, p.Status.ContainerStatuses)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// The kubelet's status sync once the driver's first report is in: Healthy, with message.
	waitFor("gpu-3 Healthy in the pod's status", func() bool {
		if err := m.WritePodStatus(ctx, pods, pod); err != nil {
			t.Fatal(err)
		}
		_, r := read()
		return r.Health == corev1.ResourceHealthStatusHealthy
	})
	p, r := read()
	if r.Message == nil || *r.Message != "gpu-3 is Healthy" {
		t.Errorf("message %v, want the driver's", r.Message)
	}
	if len(p.Status.ContainerStatuses) != 2 {
		t.Errorf("container statuses %+v, want cuda and sidecar (waiting)", p.Status.ContainerStatuses)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == "sidecar" && (len(cs.AllocatedResourcesStatus) != 0 || cs.State.Waiting == nil) {
			t.Errorf("sidecar status %+v, want waiting without resources", cs)
		}
	}
	rv := p.ResourceVersion
	if err := m.WritePodStatus(ctx, pods, pod); err != nil {
		t.Fatal(err)
	}
	if p, _ := read(); p.ResourceVersion != rv {
		t.Errorf("WritePodStatus with unchanged health wrote the pod (resourceVersion %s → %s)", rv, p.ResourceVersion)
	}

	// A change reaches the pod through the manager's updates channel.
	syncCtx, stopSync := context.WithCancel(ctx)
	syncDone := make(chan error, 1)
	go func() { syncDone <- m.SyncPodStatus(syncCtx, pods) }()
	waitFor("a second SyncPodStatus refused", func() bool {
		done, cancel := context.WithCancel(ctx)
		cancel()
		return errors.Is(m.SyncPodStatus(done, pods), kubeletpeer.ErrSyncRunning)
	})
	plugin.set(kubeletplugin.HealthStatusUnhealthy)
	waitFor("gpu-3 Unhealthy in the pod's status", func() bool { _, r := read(); return r.Health == corev1.ResourceHealthStatusUnhealthy })
	plugin.set(kubeletplugin.HealthStatusHealthy)
	waitFor("gpu-3 Healthy again in the pod's status", func() bool { _, r := read(); return r.Health == corev1.ResourceHealthStatusHealthy })
	stopSync()
	if err := <-syncDone; err != nil {
		t.Errorf("SyncPodStatus: %v", err)
	}

	if err := m.Unprepare(ctx, pod); err != nil {
		t.Fatal(err)
	}
	helper.Stop()
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
}
