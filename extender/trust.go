package extender

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/mig"
)

// Defaults of the trusted identities ([Options.TrustedUsers], [Options.TrustedGroups]).
var (
	// DefaultTrustedUsers are the ServiceAccounts of examples/extender/deploy (the scheduler)
	// and examples/deviceplugin/deploy (the node agent).
	DefaultTrustedUsers = []string{
		"system:serviceaccount:kube-system:hami-scheduler",
		"system:serviceaccount:kube-system:hami-device-plugin",
	}
	// DefaultTrustedGroups are the cluster administrators, who can remove the webhook anyway.
	DefaultTrustedGroups = []string{"system:masters"}
)

// LabelWebhookIgnore is HAMi's opt-out label: a pod labelled hami.io/webhook=ignore is not
// mutated, but the allocation annotation guard applies to it as to every pod.
const LabelWebhookIgnore = "hami.io/webhook"

// AllocationAnnotationKeys returns the pod annotations the scheduler and the node agent own,
// sorted: the keys of the allocation protocol shared by every vendor (hami.io/vgpu-node,
// hami.io/bind-phase, hami.io/bind-time, hami.io/vgpu-mig-allocations) and the to-allocate
// and allocated keys of every vendor of [annotation.Vendors] and of v. A pod carrying one
// of them is served devices by a device plugin, so the webhook refuses a pod created with
// any of them and lets only the trusted identities change them.
func AllocationAnnotationKeys(v annotation.Vendor) []string {
	keys := []string{allocation.KeyNode, allocation.KeyBindPhase, allocation.KeyBindTime, mig.KeyAllocations}
	for _, vd := range append(annotation.Vendors(), v) {
		for _, k := range []string{vd.ToAllocateKey, vd.AllocatedKey} {
			if k != "" {
				keys = append(keys, k)
			}
		}
	}
	sort.Strings(keys)
	return slices.Compact(keys)
}

// guardAllocation is the first step of Admit for a pod, whatever its scheduler: a CREATE
// carrying a scheduler-owned allocation annotation is denied, naming it; an UPDATE that adds,
// changes or removes one is denied unless the request's user is trusted. Nil allows.
func (e *Extender) guardAllocation(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	deny := func(msg string) *admissionv1.AdmissionResponse {
		return &admissionv1.AdmissionResponse{UID: req.UID, Result: &metav1.Status{Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden, Message: msg}}
	}
	bad := func(err error) *admissionv1.AdmissionResponse {
		return &admissionv1.AdmissionResponse{UID: req.UID, Result: &metav1.Status{Code: http.StatusBadRequest, Message: "decode pod: " + err.Error()}}
	}
	switch req.Operation {
	case "", admissionv1.Create:
		ann, err := podAnnotations(req.Object.Raw)
		if err != nil {
			return bad(err)
		}
		for _, k := range e.allocationKeys {
			if _, ok := ann[k]; ok {
				return deny(fmt.Sprintf("pod carries the scheduler-owned annotation %s: only the scheduler and the node agent write it", k))
			}
		}
	case admissionv1.Update:
		ann, err := podAnnotations(req.Object.Raw)
		if err != nil {
			return bad(err)
		}
		old, err := podAnnotations(req.OldObject.Raw)
		if err != nil {
			return bad(err)
		}
		for _, k := range e.allocationKeys {
			v, ok := ann[k]
			ov, ook := old[k]
			if ok == ook && v == ov {
				continue
			}
			if e.trusted(req.UserInfo) {
				return nil
			}
			return deny(fmt.Sprintf("user %q may not change the scheduler-owned annotation %s: only the scheduler and the node agent write it", req.UserInfo.Username, k))
		}
	case admissionv1.Delete, admissionv1.Connect: // a deletion writes no annotation
	}
	return nil
}

// trusted reports whether u is one of Options.TrustedUsers or in one of Options.TrustedGroups.
func (e *Extender) trusted(u authenticationv1.UserInfo) bool {
	if slices.Contains(e.opts.TrustedUsers, u.Username) {
		return true
	}
	for _, g := range u.Groups {
		if slices.Contains(e.opts.TrustedGroups, g) {
			return true
		}
	}
	return false
}

// podAnnotations decodes only the annotations of a pod's JSON; an empty object has none.
func podAnnotations(raw []byte) (map[string]string, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var obj struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, err
	}
	return obj.Metadata.Annotations, nil
}

// logDenied logs a guard denial at V(2).
func logDenied(logger klog.Logger, req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) {
	logger.V(2).Info("Denied a pod's allocation annotations", "pod", klog.KRef(req.Namespace, req.Name), "operation", req.Operation,
		"user", req.UserInfo.Username, "reason", resp.Result.Message)
}
