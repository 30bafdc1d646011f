package sidecar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// devmem is the memory of the one GPU each test node registers (an A10's).
const devmem = 23028

// stack is one test's scheduler: the examples/extender process (as the cluster admin), a
// kube-scheduler with the example's configuration calling it under a profile of its own.
type stack struct {
	name, url string
}

func newStack(t *testing.T) *stack {
	t.Helper()
	if errBuild != nil {
		t.Fatal(errBuild)
	}
	s := &stack{name: harness.UniqueName("hami-scheduler")}
	// No device plugin runs to release the node lock after a bind: it expires after 2 s.
	s.url = cp.StartExtender(t, extenderBin, "--scheduler-name="+s.name, "--gpu-scheduler-policy=binpack", "--node-lock-timeout=2s")
	cfg := harness.ExtenderSchedulerConfig(t, s.url)
	cfg.Profiles[0].SchedulerName = &s.name
	sched, err := cp.StartScheduler(t.Context(), envtest.SchedulerOptions{Config: cfg})
	if err != nil {
		t.Fatalf("start kube-scheduler: %v", err)
	}
	t.Cleanup(func() {
		_ = sched.Stop()
		if t.Failed() {
			t.Logf("kube-scheduler log:\n%s", sched.LogTail(40))
		}
	})
	return s
}

// gpuNode creates a Node with one registered GPU (split 10, devmem MiB), labelled for test.
func gpuNode(t *testing.T, test string) {
	t.Helper()
	name := harness.UniqueName("node")
	alloc := int64(10)
	cp.CreateAPINode(t, name, harness.APINodeOptions{Labels: map[string]string{harness.TestLabel: test}, GPUAllocatable: &alloc,
		Devices: []annotation.Device{{ID: "GPU-" + name, Count: 10, Devmem: devmem, Devcore: 100, Type: "NVIDIA-NVIDIA A10", Mode: "hami-core", Health: true}}})
}

// namespace creates a namespace (deleted when t ends) with a ResourceQuota on GPU memory when
// limit > 0.
func namespace(t *testing.T, limit int64) string {
	t.Helper()
	ns := harness.UniqueName("sidecar")
	if err := cp.EnsureNamespace(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.AdminClient().CoreV1().Namespaces().Delete(context.WithoutCancel(t.Context()), ns, metav1.DeleteOptions{})
	})
	if limit > 0 {
		memKey, _ := allocation.QuotaKeys(allocation.Config{})
		rq := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "gpu-quota", Namespace: ns},
			Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourceName(memKey): *resource.NewQuantity(limit, resource.DecimalSI)}}}
		if _, err := cp.AdminClient().CoreV1().ResourceQuotas(ns).Create(t.Context(), rq, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return ns
}

func container(name string, mem int64) corev1.Container {
	return corev1.Container{Name: name, Image: "registry.invalid/never-pulled:0", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
		corev1.ResourceName(allocation.DefaultResourceCount):  *resource.NewQuantity(1, resource.DecimalSI),
		corev1.ResourceName(allocation.DefaultResourceMemory): *resource.NewQuantity(mem, resource.DecimalSI),
	}}}
}

// pod is a pod of s in ns on test's nodes with an app container asking app MiB and, when
// sidecar > 0, a native sidecar asking sidecar MiB.
func (s *stack) pod(ns, name, test string, sidecar, app int64) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{SchedulerName: s.name, NodeSelector: map[string]string{harness.TestLabel: test},
			Containers: []corev1.Container{container("app", app)}}}
	if sidecar > 0 {
		sc := container("sidecar", sidecar)
		always := corev1.ContainerRestartPolicyAlways
		sc.RestartPolicy = &always
		p.Spec.InitContainers = []corev1.Container{sc}
	}
	return p
}

func create(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if _, err := cp.AdminClient().CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", p.Name, err)
	}
}

// waitBound waits until the pod is bound and returns it.
func waitBound(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	var p *corev1.Pod
	harness.Eventually(t, "pod "+name+" bound", 60*time.Second, func() bool {
		var err error
		p, err = cp.AdminClient().CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p.Spec.NodeName != ""
	})
	return p
}

// waitUnschedulable waits until kube-scheduler marks the pod Unschedulable with a message that
// contains want, and checks that it stays unbound.
func waitUnschedulable(t *testing.T, ns, name, want string) {
	t.Helper()
	var msg string
	harness.Eventually(t, "pod "+name+" unschedulable with "+want, 60*time.Second, func() bool {
		p, err := cp.AdminClient().CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != "" {
			t.Fatalf("pod %s bound to %s; the rule leaves it Pending (%s)", name, p.Spec.NodeName, want)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				msg = c.Message
			}
		}
		return strings.Contains(msg, want)
	})
	t.Logf("%s: %s", name, msg)
}

// checkDevices checks that the bound sidecar pod holds one entry per container, init first,
// on the node's GPU: the wire format is HAMi's.
func checkDevices(t *testing.T, p *corev1.Pod, sidecar, app int64) {
	t.Helper()
	want := fmt.Sprintf("GPU-%s,NVIDIA,%d,0:;GPU-%s,NVIDIA,%d,0:;", p.Spec.NodeName, sidecar, p.Spec.NodeName, app)
	if got := p.Annotations[annotation.KeyNVIDIAAllocated]; got != want {
		t.Errorf("%s: devices %q, want %q", p.Name, got, want)
	}
}

// TestSidecarCountedOnTheCard: a sidecar (10000 MiB) and an app container (10000 MiB) run
// together, so the pod holds 20000 MiB of the 23028 MiB card; a pod asking 12000 MiB more
// stays Pending with CardInsufficientMemory (HAMi v2.10.0 counts max(10000, 10000) and
// oversubscribes the card).
func TestSidecarCountedOnTheCard(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	test := harness.UniqueName("card")
	gpuNode(t, test)
	ns := namespace(t, 0)
	create(t, s.pod(ns, "with-sidecar", test, 10000, 10000))
	checkDevices(t, waitBound(t, ns, "with-sidecar"), 10000, 10000)
	create(t, s.pod(ns, "second", test, 0, 12000))
	waitUnschedulable(t, ns, "second", allocation.ReasonCardInsufficientMemory)
	// What fits beside the sidecar pod by the rule binds.
	create(t, s.pod(ns, "third", test, 0, devmem-20000))
	waitBound(t, ns, "third")
}

// TestSidecarCountedByTheQuota: under a 15000 MiB quota a sidecar (5000 MiB) and an app
// container (5000 MiB) count 10000; a pod asking 6000 MiB more is denied by the admission
// webhook ("exceeding resource quota") and, created anyway, stays Pending with
// ResourceQuotaNotFit although the card has room (HAMi v2.10.0 counts 5000 and places it);
// 5000 MiB fits the quota and binds.
func TestSidecarCountedByTheQuota(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	test := harness.UniqueName("quota")
	gpuNode(t, test)
	ns := namespace(t, 15000)
	create(t, s.pod(ns, "with-sidecar", test, 5000, 5000))
	checkDevices(t, waitBound(t, ns, "with-sidecar"), 5000, 5000)

	over := s.pod(ns, "over", test, 0, 6000)
	// The webhook counts the bound sidecar pod once the extender's informer shows it.
	harness.Eventually(t, "the webhook denies the pod over the quota", 30*time.Second, func() bool {
		resp := admit(t, s.url, over)
		return !resp.Allowed && resp.Result != nil && resp.Result.Message == "exceeding resource quota"
	})
	if resp := admit(t, s.url, s.pod(ns, "within", test, 0, 5000)); !resp.Allowed {
		t.Errorf("the webhook denies a pod within the quota: %+v", resp.Result)
	}
	create(t, over)
	waitUnschedulable(t, ns, "over", allocation.ReasonResourceQuotaNotFit)
	create(t, s.pod(ns, "within", test, 0, 5000))
	waitBound(t, ns, "within")
}

// admit posts an AdmissionReview of pod's creation to the extender's webhook.
func admit(t *testing.T, url string, pod *corev1.Pod) *admissionv1.AdmissionResponse {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	review := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: types.UID("review-" + pod.Name), Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Namespace: pod.Namespace, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}}}
	body, err := json.Marshal(review)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+extender.PathWebhook, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Response == nil {
		t.Fatalf("webhook answer: %v (status %d)", err, resp.StatusCode)
	}
	return out.Response
}
