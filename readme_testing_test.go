package hamireg_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/clienttest"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
	"github.com/hamireg/hamireg/nodeagent"
)

// The README's "Testing your component", compiled and run here; hack/release's consumer
// rehearsal runs the same text in a module outside the repository, against the SDK fetched
// from a module proxy.

// snippet: README
// npus is a vendor's device source, and its Allocator: what a container receives.
type npus []annotation.Device

func (n npus) Devices(context.Context) ([]annotation.Device, []error, error) { return n, nil, nil }
func (npus) Changed() <-chan struct{}                                        { return nil }

func (n npus) Allocate(_ context.Context, req nodeagent.ContainerRequest) (allocation.Response, error) {
	var visible []string
	for _, d := range req.Devices {
		i := slices.IndexFunc(n, func(dev annotation.Device) bool { return dev.ID == d.UUID })
		if i < 0 {
			return allocation.Response{}, fmt.Errorf("NPU %s is not on this node", d.UUID)
		}
		visible = append(visible, strconv.FormatUint(uint64(n[i].Index), 10))
	}
	return allocation.Response{Envs: map[string]string{"ACME_VISIBLE_DEVICES": strings.Join(visible, ",")}}, nil
}

func TestAgentServesTheSchedulersChoice(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t) // the agent's log lines go to t.Log, per test
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	acme := annotation.Vendor{
		Name: "ACME", RegisterKey: "hami.io/node-acme-register", ResourceName: "acme.com/npu",
		ToAllocateKey: "hami.io/acme-devices-to-allocate", AllocatedKey: "hami.io/acme-devices-allocated",
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "infer", UID: "uid-1"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}}}
	// clienttest: merge patches bump resourceVersions and a stale one conflicts, as on the
	// API server; the node lock and bind-phase depend on that.
	client := clienttest.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "npu-1"}}, pod)
	kubelet := kubelettest.Start(t) // the kubelet's registration server; closed by t.Cleanup

	agent, err := nodeagent.New(client, "npu-1", npus{
		{ID: "NPU-a", Index: 0, Count: 4, Devmem: 16384, Devcore: 100, Type: "ACME-N1", Health: true},
		{ID: "NPU-b", Index: 1, Count: 4, Devmem: 16384, Devcore: 100, Type: "ACME-N1", Health: true},
	}, nodeagent.Options{
		Vendor:        acme, // the Allocator is the source, which implements it
		Kubelet:       kubeletplugin.Options{PluginDir: kubelet.Dir(), SocketName: "acme.sock"},
		EventRecorder: record.NewFakeRecorder(16),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.Run(runCtx) }()
	defer func() { // join Run: nothing the agent started outlives the test
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	// Wait until the kubelet has the devices: PickHealthy picks from its last device list.
	if st, err := kubelet.WaitFor(ctx, func(s kubelettest.State) bool {
		p, ok := s.Resource("acme.com/npu")
		return ok && p.Healthy() == 8
	}); err != nil {
		t.Fatal(err, st)
	}
	// HAMi's scheduler gives the container NPU-b (filter and bind, node lock included).
	devs := allocation.PodDevices{{{UUID: "NPU-b", Type: "ACME", Usedmem: 8192, Usedcores: 50}}}
	if _, err := allocationtest.NewScheduler(client, allocationtest.Options{Vendor: acme}).Schedule(ctx, pod, "npu-1", devs); err != nil {
		t.Fatal(err)
	}
	ids, err := kubelet.PickHealthy(ctx, "acme.com/npu", 1) // steered by the agent's preference
	if err != nil {
		t.Fatal(err)
	}
	resp, err := kubelet.Allocate(ctx, "acme.com/npu", ids)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetContainerResponses()[0].GetEnvs()["ACME_VISIBLE_DEVICES"]; got != "1" {
		t.Errorf("ACME_VISIBLE_DEVICES = %q, want 1 (NPU-b)", got)
	}
	served, err := client.CoreV1().Pods("default").Get(ctx, "infer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := served.Annotations[allocation.KeyBindPhase]; got != string(allocation.PhaseSuccess) {
		t.Errorf("bind-phase %q, want success", got)
	}
}

// end snippet
