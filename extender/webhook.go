package extender

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"

	"io"
	"net/http"
	"strconv"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/allocation"
)

// Webhook constants.
const (
	// EnvTaskPriority carries nvidia.com/priority into the container, as HAMi's webhook does.
	EnvTaskPriority = "CUDA_TASK_PRIORITY"
	// DefaultSchedulerNameK8s is kube-scheduler's own profile name, which the webhook overwrites
	// unless Options.KeepDefaultScheduler.
	DefaultSchedulerNameK8s = corev1.DefaultSchedulerName
)

// decodeReview reads an AdmissionReview (admission.k8s.io/v1 or v1beta1: the same JSON) and
// checks that it carries a request.
func decodeReview(body io.Reader) (*admissionv1.AdmissionReview, error) {
	var review admissionv1.AdmissionReview
	if err := decodeJSON(body, &review); err != nil {
		return nil, err
	}
	if review.Request == nil {
		return nil, errors.New("admission review without a request")
	}
	return &review, nil
}

func (e *Extender) serveWebhook(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "webhook: method "+r.Method+" not allowed, use POST", http.StatusMethodNotAllowed)
		return
	}
	review, err := decodeReview(http.MaxBytesReader(w, r.Body, e.opts.MaxBodyBytes))
	if err != nil {
		err = &RequestError{Route: PathWebhook, Err: err}
		klog.FromContext(r.Context()).V(2).Info("Refused an admission request", "err", err)
		status := requestStatus(err)
		writeJSON(w, status, &admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
			Response: &admissionv1.AdmissionResponse{Result: &metav1.Status{Code: int32(status), Message: err.Error()}},
		})
		return
	}
	out := &admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: e.Admit(r.Context(), review.Request)}
	if out.APIVersion == "" {
		out.APIVersion, out.Kind = admissionv1.SchemeGroupVersion.String(), "AdmissionReview"
	}
	writeJSON(w, http.StatusOK, out)
}

// Admit guards the allocation protocol and mutates a pod on admission as HAMi's webhook does.
//
// First, for every pod whatever its scheduler name or labels: a CREATE of a pod that carries a
// scheduler-owned allocation annotation ([AllocationAnnotationKeys]) is denied with a message
// naming the annotation, and an UPDATE that adds, changes or removes one is denied unless the
// request's user is one of Options.TrustedUsers or in one of Options.TrustedGroups (the
// scheduler's and the node agent's ServiceAccounts by default): a device plugin serves the
// devices those annotations name, so a pod that wrote its own would get a GPU nobody counted
// (HAMi #3041). Other UPDATEs, and every other operation, are allowed unchanged.
//
// Then, at CREATE (spec §3): a pod with a container
// that asks for an NVIDIA resource gets spec.schedulerName = Options.SchedulerName, the GPU
// count Config.DefaultGPUNum where it asks for memory or cores only, nvidia.com/gpucores 100
// where it asks for whole GPUs without cores (not when Options.DeviceClasses holds a class
// whose extendedResourceName is the count resource: with that mapping kube-scheduler refuses a
// pod on every node whose allocatable lists no nvidia.com/gpucores, so a whole-GPU ask stays
// the count alone, which a DRA node serves through the class and the device plugin serves
// with the whole memory), and CUDA_TASK_PRIORITY from nvidia.com/priority. It never turns
// resources into ResourceClaims: a pod that names spec.resourceClaims keeps them, and a pod
// that asks nvidia.com/gpu keeps asking it, for kube-scheduler's mapping to serve.
// Everything else is allowed unchanged: other objects, pods without such a container, pods of
// another scheduler, pods labelled hami.io/webhook=ignore (HAMi's opt-out, which HAMi's chart
// puts in the webhook's objectSelector), privileged containers. Denied: a pod without
// containers ("pod has no containers"), a GPU pod whose allocation.KeyDeviceScoringWeights
// does not parse (with HAMi v2.10.0's parse error, as HAMi's webhook after PR #2827; the
// filter refuses it too), a GPU pod with spec.nodeName ("pod has node assigned"), and, as HAMi's
// fitResourceQuota, a GPU pod that would take its namespace over a ResourceQuota limit on
// GPU memory or cores ("exceeding resource quota", counted as allocation.AdmissionQuotaAsk
// counts the mutated pod against what the namespace's pods hold). The patch is a JSON patch
// of the changed fields only, the difference between the object as sent and as mutated
// (gomodules.xyz/jsonpatch/v2), so it applies to that object whichever of its fields are
// absent or null.
func (e *Extender) Admit(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	e.stats.admissions.Add(1)
	allow := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Kind.Kind != "Pod" {
		return allow
	}
	// Trust first, for every pod whatever its scheduler or labels (see guardAllocation).
	if denied := e.guardAllocation(req); denied != nil {
		logDenied(klog.FromContext(ctx), req, denied)
		return denied
	}
	if req.Operation != "" && req.Operation != admissionv1.Create {
		return allow
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return &admissionv1.AdmissionResponse{UID: req.UID, Result: &metav1.Status{Code: http.StatusBadRequest, Message: "decode pod: " + err.Error()}}
	}
	if pod.Labels[LabelWebhookIgnore] == "ignore" { // HAMi's opt-out, of the mutation only
		return allow
	}
	deny := func(msg string) *admissionv1.AdmissionResponse {
		return &admissionv1.AdmissionResponse{UID: req.UID, Result: &metav1.Status{Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden, Message: msg}}
	}
	if len(pod.Spec.Containers) == 0 {
		return deny("pod has no containers")
	}
	if s := pod.Spec.SchedulerName; s != "" && s != e.opts.SchedulerName && (s != DefaultSchedulerNameK8s || e.opts.KeepDefaultScheduler) {
		return allow
	}
	doc, err := decodePodDocument(req.Object.Raw)
	if err != nil {
		return &admissionv1.AdmissionResponse{UID: req.UID, Result: &metav1.Status{Code: http.StatusBadRequest, Message: err.Error()}}
	}
	failed := func(err error) *admissionv1.AdmissionResponse {
		return &admissionv1.AdmissionResponse{UID: req.UID, Result: &metav1.Status{Code: http.StatusInternalServerError, Message: "mutate pod: " + err.Error()}}
	}
	gpu := false
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged {
			klog.FromContext(ctx).V(4).Info("Denying admission as container is privileged", "pod", klog.KObj(&pod), "container", c.Name)
			continue
		}
		limits, env, asks := e.mutateContainer(c)
		gpu = gpu || asks
		if err := doc.mutateContainer(i, limits, env); err != nil {
			return failed(err)
		}
	}
	if !gpu {
		return allow
	}
	if _, err := allocation.PodScoringWeights(pod.Annotations, e.opts.Config.Version); err != nil {
		return deny(err.Error())
	}
	if pod.Spec.NodeName != "" {
		return deny("pod has node assigned")
	}
	if e.quotaDenies(&pod, cmp.Or(pod.Namespace, req.Namespace)) {
		return deny("exceeding resource quota")
	}
	if err := doc.setSchedulerName(e.opts.SchedulerName); err != nil {
		return failed(err)
	}
	patch, err := doc.patch(req.Object.Raw)
	if err != nil {
		return failed(err)
	}
	if patch == nil {
		return allow
	}
	pt := admissionv1.PatchTypeJSONPatch
	klog.FromContext(ctx).V(4).Info("Mutated GPU pod", "pod", klog.KObj(&pod), "schedulerName", e.opts.SchedulerName)
	return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true, Patch: patch, PatchType: &pt}
}

// mutateContainer returns the limits to add, the env to append, and whether the container asks
// for an NVIDIA GPU (after the defaults).
func (e *Extender) mutateContainer(c *corev1.Container) (corev1.ResourceList, []corev1.EnvVar, bool) {
	cfg := e.opts.Config
	limits := c.Resources.Limits
	add := corev1.ResourceList{}
	var env []corev1.EnvVar
	if q, ok := limits[corev1.ResourceName(cfg.ResourcePriority)]; ok {
		env = append(env, corev1.EnvVar{Name: EnvTaskPriority, Value: strconv.FormatInt(q.Value(), 10)})
	}
	_, count := limits[corev1.ResourceName(cfg.ResourceCount)]
	_, cores := limits[corev1.ResourceName(cfg.ResourceCores)]
	_, mem := limits[corev1.ResourceName(cfg.ResourceMemory)]
	pct, hasPct := limits[corev1.ResourceName(cfg.ResourceMemoryPercentage)]
	if !count && (cores || mem || hasPct) && cfg.DefaultGPUNum > 0 {
		add[corev1.ResourceName(cfg.ResourceCount)] = *resource.NewQuantity(int64(cfg.DefaultGPUNum), resource.DecimalSI)
		count = true
	}
	whole := !mem // HAMi: a memory percentage decides when present (100: whole), else no gpumem
	if hasPct {
		whole = pct.Value() == 100
	}
	// Whole GPUs get cores 100, unless a DeviceClass maps the count resource: kube-scheduler's
	// DynamicResources plugin refuses a pod whose extended resources a node's allocatable does
	// not list, so the ask stays count-only, which both worlds serve whole.
	if count && !cores && whole && cfg.ResourceCores != "" && e.mapping().class == nil {
		add[corev1.ResourceName(cfg.ResourceCores)] = *resource.NewQuantity(100, resource.DecimalSI)
	}
	return add, env, count
}
