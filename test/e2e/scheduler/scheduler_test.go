package scheduler_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	kubeschedulerconfigv1 "k8s.io/kube-scheduler/config/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/test/e2e/harness"
	"github.com/hamireg/hamireg/test/e2e/internal/testplugin"
)

// A plain Pod is bound to the only Node whose status has room for it; no kubelet is needed
// for scheduling, only the Node's allocatable.
func TestSchedulerBindsPodToNodeWithAllocatable(t *testing.T) {
	t.Parallel()
	defaultScheduler(t)
	test := harness.UniqueName("bind")
	createReadyNode(t, test+"-small", test, corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi"), corev1.ResourcePods: resource.MustParse("110"),
	})
	createReadyNode(t, test+"-big", test, basicResources())
	createPod(t, test, "plain", test, "", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")})
	if node := waitForBinding(t, test, "plain"); node != test+"-big" {
		t.Errorf("pod bound to %s, want %s-big (the only node with 1 CPU allocatable)", node, test)
	}
}

// A Pod that fits nowhere stays Pending, with PodScheduled=False/Unschedulable and a
// FailedScheduling event that names the reason.
func TestSchedulerLeavesUnfittablePodPending(t *testing.T) {
	t.Parallel()
	defaultScheduler(t)
	test := harness.UniqueName("pending")
	createReadyNode(t, test, test, basicResources())
	createPod(t, test, "too-big", test, "", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64")})

	events := cp.AdminClient().CoreV1().Events(test)
	selector := fields.Set{"involvedObject.name": "too-big", "reason": "FailedScheduling"}.String()
	var ev corev1.Event
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := events.List(ctx, metav1.ListOptions{FieldSelector: selector})
		if err != nil || len(l.Items) == 0 {
			return false, err
		}
		ev = l.Items[0]
		return true, nil
	})
	if err != nil {
		t.Fatalf("no FailedScheduling event: %v", err)
	}
	if !strings.Contains(ev.Message, "Insufficient cpu") {
		t.Errorf("FailedScheduling message = %q, want it to mention Insufficient cpu", ev.Message)
	}
	// The scheduler records the event and updates the Pod's status separately.
	var p *corev1.Pod
	var cond *corev1.PodCondition
	err = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err = cp.AdminClient().CoreV1().Pods(test).Get(ctx, "too-big", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		cond = nil
		for i := range p.Status.Conditions {
			if p.Status.Conditions[i].Type == corev1.PodScheduled {
				cond = &p.Status.Conditions[i]
			}
		}
		return cond != nil, nil
	})
	if err != nil {
		t.Fatalf("no PodScheduled condition: %v", err)
	}
	if cond.Status != corev1.ConditionFalse || cond.Reason != corev1.PodReasonUnschedulable {
		t.Errorf("PodScheduled condition = %+v, want False/Unschedulable", cond)
	}
	if p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending {
		t.Errorf("pod node %q phase %s, want unbound and Pending", p.Spec.NodeName, p.Status.Phase)
	}
	t.Logf("FailedScheduling: %s", ev.Message)
}

// Channel 1 end to end: a device plugin's devices go through the kubelet's device manager
// into the Node's allocatable, and the scheduler places a Pod requesting the resource only
// where the manager reported it.
func TestSchedulerUsesDeviceManagerAllocatable(t *testing.T) {
	t.Parallel()
	defaultScheduler(t)
	const gpu = "vendor.example.com/gpu"
	test := harness.UniqueName("devices")
	withGPU, without := test+"-gpu", test+"-nogpu"
	createReadyNode(t, withGPU, test, basicResources())
	createReadyNode(t, without, test, basicResources())

	dm, err := kubeletpeer.StartDeviceManager(t.Context(), kubeletpeer.DeviceManagerOptions{})
	if err != nil {
		t.Fatalf("start the kubelet device manager: %v", err)
	}
	t.Cleanup(func() { _ = dm.Stop() })
	p, err := testplugin.Start(dm.Dir(), "vendor.sock", testplugin.Devices(2, 1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	if err := p.Register(t.Context(), dm.SocketPath(), gpu); err != nil {
		t.Fatalf("Register: %v", err)
	}
	err = wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 15*time.Second, true, func(ctx context.Context) (bool, error) {
		r, err := dm.Capacity(ctx)
		return err == nil && r.Allocatable[gpu] == 2, err
	})
	if err != nil {
		t.Fatalf("device manager never reported 2 allocatable: %v", err)
	}
	if err := dm.UpdateNodeStatus(t.Context(), cp.AdminClient().CoreV1(), withGPU); err != nil {
		t.Fatal(err)
	}
	n, err := cp.AdminClient().CoreV1().Nodes().Get(t.Context(), withGPU, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c, a := n.Status.Capacity[gpu], n.Status.Allocatable[gpu]; c.Value() != 3 || a.Value() != 2 {
		t.Errorf("node status %s: capacity %s allocatable %s, want 3 and 2", gpu, c.String(), a.String())
	}

	createPod(t, test, "wants-gpu", test, "", corev1.ResourceList{gpu: resource.MustParse("2")})
	if node := waitForBinding(t, test, "wants-gpu"); node != withGPU {
		t.Errorf("pod bound to %s, want %s", node, withGPU)
	}
}

// The harness passes extenders through the KubeSchedulerConfiguration: a second scheduler
// with its own profile calls an HTTP filter extender, which here admits one Node only.
func TestSchedulerCallsConfiguredExtender(t *testing.T) {
	t.Parallel()
	test := harness.UniqueName("extender")
	chosen := test + "-chosen"
	var (
		mu    sync.Mutex
		calls int
	)
	ext := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var args extenderv1.ExtenderArgs
		if err := json.NewDecoder(r.Body).Decode(&args); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		calls++
		mu.Unlock()
		res := extenderv1.ExtenderFilterResult{Nodes: &corev1.NodeList{}, FailedNodes: extenderv1.FailedNodesMap{}}
		for _, n := range args.Nodes.Items {
			if n.Name == chosen {
				res.Nodes.Items = append(res.Nodes.Items, n)
			} else {
				res.FailedNodes[n.Name] = "not chosen by the e2e extender"
			}
		}
		_ = json.NewEncoder(w).Encode(&res)
	}))
	t.Cleanup(ext.Close)

	schedulerName := "hamireg-e2e-extender"
	s, err := cp.StartScheduler(t.Context(), envtest.SchedulerOptions{Config: &kubeschedulerconfigv1.KubeSchedulerConfiguration{
		Profiles:  []kubeschedulerconfigv1.KubeSchedulerProfile{{SchedulerName: &schedulerName}},
		Extenders: []kubeschedulerconfigv1.Extender{{URLPrefix: ext.URL, FilterVerb: "filter", Weight: 1, HTTPTimeout: metav1.Duration{Duration: 5 * time.Second}}},
	}})
	if err != nil {
		t.Fatalf("start scheduler with extender: %v", err)
	}
	t.Cleanup(func() { _ = s.Stop() })

	for _, n := range []string{test + "-a", chosen, test + "-b"} {
		createReadyNode(t, n, test, basicResources())
	}
	createPod(t, test, "filtered", test, schedulerName, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")})
	if node := waitForBinding(t, test, "filtered"); node != chosen {
		t.Errorf("pod bound to %s, want %s (the only node the extender admits)", node, chosen)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls == 0 {
		t.Error("the extender was never called")
	}
}
