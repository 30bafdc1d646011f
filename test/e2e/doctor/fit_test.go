package doctor_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// gpus asks n GPUs of mem MiB each.
func gpus(n, mem string) map[string]string {
	return map[string]string{harness.GPUResource: n, "nvidia.com/gpumem": mem}
}

// TestP3MemoryShort: a holder pod takes 30000 of the 40960 MiB of each of the node's 8 GPUs
// (through HAMi's scheduler and the kubelet's Allocate); a pod asking 2 × 20000 MiB gets
// FilteringFailed. The doctor names P3-NoNodeFits with the shortage and the holder; its fix
// deletes the holder, after which kube-scheduler's retry binds the pod (S3).
func TestP3MemoryShort(t *testing.T) {
	t.Parallel()
	g := gpuNode(t)
	h := startHAMi(t, g)
	opts := doctorOptions(g, h.name)
	create(t, gpuPod(g.Namespace, "holder", h.name, gpus("8", "30000"), nil))
	allocated(t, g, "holder", opts)

	pod := create(t, gpuPod(g.Namespace, "short", h.name, gpus("2", "20000"), nil))
	waitEvent(t, g.Namespace, pod.Name, "FilteringFailed", "")
	r := doctor(t, g.Namespace, pod.Name, opts)
	f := wantCase(t, r, diagnose.P3NoNodeFits, diagnose.CodeFitShort, "asks cuda: 2 GPU × 20000 MiB", "kubectl -n "+g.Namespace+" delete pod holder")
	if r.Fit == nil || !containsLine([]string{r.Fit.Shortage}, g.Namespace+"/holder") {
		t.Errorf("the shortage does not name the holder %s/holder: %+v", g.Namespace, r.Fit)
	}
	fixLine(t, f, "frees its share of")

	deletePod(t, g.Namespace, "holder") // the fix
	retryUntilBound(t, g, pod.Name)
	allocated(t, g, pod.Name, opts)
}

// TestP3TypeMismatch: a pod with nvidia.com/use-gputype H100 on a node of A100s gets
// FilteringFailed (CardTypeMismatch). The doctor names P3-NoNodeFits with the selector; its
// fix removes the annotation (a change of the pod, on which kube-scheduler retries it) → S3.
func TestP3TypeMismatch(t *testing.T) {
	t.Parallel()
	g := gpuNode(t)
	h := startHAMi(t, g)
	opts := doctorOptions(g, h.name)
	pod := create(t, gpuPod(g.Namespace, "wants-h100", h.name, gpus("1", "4000"), map[string]string{allocation.KeyUseGPUType: "H100"}))
	waitEvent(t, g.Namespace, pod.Name, "FilteringFailed", "")
	r := doctor(t, g.Namespace, pod.Name, opts)
	if r.Case != diagnose.P3NoNodeFits {
		t.Errorf("case %s, want P3", r.Case)
	}
	f := wantCase(t, r, diagnose.P3NoNodeFits, diagnose.CodeTypeSelector, allocation.KeyUseGPUType+` = "H100"`, "")
	fixLine(t, f, "kubectl -n "+g.Namespace+" annotate pod "+pod.Name+" "+allocation.KeyUseGPUType+"-")

	patchPod(t, g.Namespace, pod.Name, map[string]any{"metadata": map[string]any{"annotations": map[string]any{allocation.KeyUseGPUType: nil}}}) // the fix
	allocated(t, g, pod.Name, opts)
}

// TestP3Quota: the namespace's ResourceQuota allows limits.nvidia.com/gpumem 10000 and the
// pod asks 20000 MiB: the extender (which enforces HAMi's quota) refuses every GPU
// (ResourceQuotaNotFit). The doctor names P3-NoNodeFits with the quota; its fix raises the
// limit to what the pod needs. kube-scheduler does not watch ResourceQuotas: it retries an
// unschedulable pod when a pod or node changes (or after 5 min), so the test then touches the
// pod (retryUntilBound) → S3.
func TestP3Quota(t *testing.T) {
	t.Parallel()
	harness.BuildDoctor(t, cp.Dir()) // before the scenario: the build takes a while
	g := gpuNode(t)
	memKey, _ := allocation.QuotaKeys(allocation.Config{})
	rq := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "gpu-quota", Namespace: g.Namespace},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourceName(memKey): resource.MustParse("10000")}}}
	quotas := cp.AdminClient().CoreV1().ResourceQuotas(g.Namespace)
	if _, err := quotas.Create(t.Context(), rq, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h := startHAMi(t, g) // after the quota: the extender's informer lists it before /readyz
	opts := doctorOptions(g, h.name)
	pod := create(t, gpuPod(g.Namespace, "over-quota", h.name, gpus("1", "20000"), nil))
	waitEvent(t, g.Namespace, pod.Name, "FilteringFailed", "")
	r := doctor(t, g.Namespace, pod.Name, opts)
	if r.Case != diagnose.P3NoNodeFits {
		t.Errorf("case %s, want P3", r.Case)
	}
	f := wantCase(t, r, diagnose.P3NoNodeFits, diagnose.CodeQuotaExceeded, `resourcequota `+g.Namespace+`/gpu-quota: spec.hard["`+memKey+`"] = 10000`, "")
	fixLine(t, f, `kubectl -n `+g.Namespace+` patch resourcequota gpu-quota --type merge -p '{"spec":{"hard":{"`+memKey+`":"20000"}}}'`)
	wantCLIQuota(t, opts, g.Namespace, pod.Name)

	mergePatch(t, "resourcequota gpu-quota", map[string]any{"spec": map[string]any{"hard": map[string]string{memKey: "20000"}}}, // the fix
		func(ctx context.Context, data []byte) error {
			_, err := quotas.Patch(ctx, "gpu-quota", types.MergePatchType, data, metav1.PatchOptions{})
			return err
		})
	retryUntilBound(t, g, pod.Name)
	allocated(t, g, pod.Name, opts)
}

// retryUntilBound waits until HAMi's scheduler has bound the pod. kube-scheduler retries an
// unschedulable pod when a pod or node changes (else after 5 min), and the extender may see
// the fix (the holder's deletion, the raised quota) only after such a retry: every 3 s the
// test changes the pod (an annotation of its own), as other changes in a busy cluster would.
func retryUntilBound(t *testing.T, g *harness.GPUNode, name string) {
	t.Helper()
	touched, n := time.Now(), 0
	harness.Eventually(t, "pod "+name+" bound after the fix", 45*time.Second, func() bool {
		if p, ok := g.Pod(t, name); ok && p.Spec.NodeName != "" {
			t.Logf("pod %s bound after %d touches", name, n)
			return true
		}
		if time.Since(touched) > 3*time.Second {
			n++
			touched = time.Now()
			patchPod(t, g.Namespace, name, map[string]any{"metadata": map[string]any{"annotations": map[string]string{"e2e.hamireg.io/retry": strconv.Itoa(n)}}})
		}
		return false
	})
}
