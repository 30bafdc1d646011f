package scheduler_test

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// defaultSched is the binary's shared kube-scheduler, started by the first test that
// needs it.
var defaultSched struct {
	once sync.Once
	err  error
}

// defaultScheduler starts one kube-scheduler with the default configuration for the whole
// binary (tests share it like they share the control plane).
func defaultScheduler(t *testing.T) {
	t.Helper()
	defaultSched.once.Do(func() {
		// t.Context only bounds the wait for readiness; the scheduler outlives the test.
		_, defaultSched.err = cp.StartScheduler(t.Context(), envtest.SchedulerOptions{})
	})
	if defaultSched.err != nil {
		t.Fatalf("start kube-scheduler: %v", defaultSched.err)
	}
}

// createReadyNode creates a Node labelled for the test with the given allocatable
// resources (also its capacity), as a kubelet would report them, and removes the
// not-ready taint that the TaintNodesByCondition admission plugin puts on new Nodes (no
// node-lifecycle controller runs here to remove it).
func createReadyNode(t *testing.T, name, test string, allocatable corev1.ResourceList) {
	t.Helper()
	ctx := t.Context()
	nodes := cp.AdminClient().CoreV1().Nodes()
	n := cp.CreateNode(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{harness.TestLabel: test}}})
	n.Spec.Taints = nil
	n, err := nodes.Update(ctx, n, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("remove taints: %v", err)
	}
	n.Status.Capacity = allocatable
	n.Status.Allocatable = allocatable
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now()}}
	if _, err := nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update node status: %v", err)
	}
}

// basicResources is a small worker node: 4 CPUs, 8 GiB, 110 pods.
func basicResources() corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("4"),
		corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
}

// createPod creates a Pod in ns that selects the test's Nodes and requests the given
// resources; schedulerName "" means default-scheduler.
func createPod(t *testing.T, ns, name, test, schedulerName string, requests corev1.ResourceList) {
	t.Helper()
	if err := cp.EnsureNamespace(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			SchedulerName: schedulerName,
			NodeSelector:  map[string]string{harness.TestLabel: test},
			Containers: []corev1.Container{{
				Name:      "main",
				Image:     "registry.invalid/never-pulled:0",
				Resources: corev1.ResourceRequirements{Requests: requests, Limits: limitsFor(requests)},
			}},
		},
	}
	if _, err := cp.AdminClient().CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
}

// limitsFor copies extended resources into limits (they must be equal there).
func limitsFor(requests corev1.ResourceList) corev1.ResourceList {
	l := corev1.ResourceList{}
	for k, v := range requests {
		if k != corev1.ResourceCPU && k != corev1.ResourceMemory {
			l[k] = v
		}
	}
	return l
}

// waitForBinding waits until the Pod is bound and returns its node.
func waitForBinding(t *testing.T, ns, name string) string {
	t.Helper()
	var node string
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := cp.AdminClient().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		node = p.Spec.NodeName
		return node != "", nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s not bound: %v", ns, name, err)
	}
	return node
}
