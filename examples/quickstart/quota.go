package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
)

// The quota step: a namespace whose ResourceQuota allows 20000 MiB of GPU memory (HAMi's
// key, limits.nvidia.com/gpumem), a pod under it and one that would go over it.
const (
	quotaNamespace = "team-a"
	quotaName      = "gpu-quota"
	quotaKey       = "limits.nvidia.com/gpumem"
	quotaMiB       = 20000
	underPod       = "small" // 1 GPU, 8000 MiB: placed
	underMiB       = 8000
	overPod        = "big" // 2 GPUs × 8000 MiB: 8000 used + 16000 > 20000
	overGPUs       = 2
	overMiB        = 8000
	// eventFilteringFailed is the reason of HAMi's Events for a pod no node fits
	// (extender.EventFilteringFailed; the quickstart's module does not link package extender).
	eventFilteringFailed = "FilteringFailed"
)

// gpuPod is a pod of one CUDA container asking gpus GPUs with mem MiB each.
func gpuPod(namespace, name string, gpus, mem int64, annotations map[string]string) *corev1.Pod {
	limits := corev1.ResourceList{
		annotation.ResourceNVIDIAGPU: *resource.NewQuantity(gpus, resource.DecimalSI),
		"nvidia.com/gpumem":          *resource.NewQuantity(mem, resource.DecimalSI),
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Annotations: annotations},
		Spec: corev1.PodSpec{
			SchedulerName: schedulerName, // the webhook would set it; see apply
			Containers: []corev1.Container{{Name: "cuda", Image: "nvcr.io/nvidia/cuda:12.6.3-base-ubuntu24.04", Command: []string{"nvidia-smi"},
				Resources: corev1.ResourceRequirements{Limits: limits}}},
		},
	}
}

// quota is step 3: the ResourceQuota, the pod under it placed, the pod over it Pending with
// the extender's FilteringFailed and ResourceQuotaNotFit Events.
func (q *quickstart) quota(ctx context.Context) error {
	q.out.step(3, time.Since(q.start), "namespace %s: ResourceQuota %s = %d (MiB of GPU memory)", quotaNamespace, quotaKey, quotaMiB)
	c := q.cp.AdminClient()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: quotaNamespace}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", quotaNamespace, err)
	}
	rq := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: quotaName, Namespace: quotaNamespace},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{quotaKey: *resource.NewQuantity(quotaMiB, resource.DecimalSI)}},
	}
	if _, err := c.CoreV1().ResourceQuotas(quotaNamespace).Create(ctx, rq, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ResourceQuota %s/%s: %w", quotaNamespace, quotaName, err)
	}
	q.out.item("quota", "kubectl -n %s create quota %s --hard=%s=%d", quotaNamespace, quotaName, quotaKey, quotaMiB)

	pods := c.CoreV1().Pods(quotaNamespace)
	t := time.Now()
	under, err := pods.Create(ctx, gpuPod(quotaNamespace, underPod, 1, underMiB, nil), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s/%s: %w", quotaNamespace, underPod, err)
	}
	var final *corev1.Pod
	err = q.poll(ctx, func() bool {
		p, err := pods.Get(ctx, underPod, metav1.GetOptions{})
		if err == nil {
			final = p
		}
		return err == nil && p.Annotations[allocation.KeyBindPhase] == string(allocation.PhaseSuccess)
	})
	if err != nil {
		return failed(fmt.Errorf("pod %s/%s (%d MiB, under the quota) was not placed: %w%s", quotaNamespace, underPod, underMiB, err, q.podEvents(ctx, under)), "extender", q.extender)
	}
	q.out.item("placed", "pod %s/%s, 1 GPU with %d MiB: on %s, %s %s, %v after the create", quotaNamespace, underPod, underMiB, final.Spec.NodeName, allocation.KeyBindPhase, allocation.PhaseSuccess, round(time.Since(t)))

	over, err := pods.Create(ctx, gpuPod(quotaNamespace, overPod, overGPUs, overMiB, nil), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s/%s: %w", quotaNamespace, overPod, err)
	}
	var events []corev1.Event
	err = q.poll(ctx, func() bool {
		list, err := c.CoreV1().Events(quotaNamespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(over.UID)})
		if err != nil {
			return false
		}
		events = quotaEvents(list.Items)
		return len(events) == 3
	})
	if err != nil {
		return failed(fmt.Errorf("pod %s/%s (over the quota) has no %s and %s Events: %w%s", quotaNamespace, overPod,
			eventFilteringFailed, allocation.ReasonResourceQuotaNotFit, err, q.podEvents(ctx, over)), "extender", q.extender)
	}
	p, err := pods.Get(ctx, overPod, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get pod %s/%s: %w", quotaNamespace, overPod, err)
	}
	if p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending {
		return fmt.Errorf("pod %s/%s over the quota is %s on node %q, want Pending and unbound", quotaNamespace, overPod, p.Status.Phase, p.Spec.NodeName)
	}
	q.out.item("pending", "pod %s/%s, %d GPUs with %d MiB each: %s, not bound; the extender's Events on it:", quotaNamespace, overPod, overGPUs, overMiB, p.Status.Phase)
	for _, e := range events {
		q.out.item("", "%s %s: %s", e.Type, e.Reason, e.Message)
	}
	return nil
}

// quotaEvents picks, from a pod's Events, the extender's FilteringFailed Events for the quota
// (the reason word and the summary) and its ResourceQuotaNotFit Event with the detail, in
// that order; fewer than three until all have come.
func quotaEvents(list []corev1.Event) []corev1.Event {
	var word, summary, detail *corev1.Event
	for i := range list {
		e := &list[i]
		switch {
		case e.Reason == eventFilteringFailed && strings.Contains(e.Message, allocation.ReasonResourceQuotaNotFit):
			word = e
		case e.Reason == eventFilteringFailed && strings.HasPrefix(e.Message, "no available node"):
			summary = e
		case e.Reason == allocation.ReasonResourceQuotaNotFit:
			detail = e
		}
	}
	var out []corev1.Event
	for _, e := range []*corev1.Event{word, summary, detail} {
		if e != nil {
			out = append(out, *e)
		}
	}
	return out
}
