package dra

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Errors of [SetPodOwner], for errors.Is.
var (
	// ErrInvalidOwner: SetPodOwner cannot make the pod the claim's owner.
	ErrInvalidOwner = errors.New("invalid claim owner")
)

// SetPodOwner makes pod the controller of claim: an ownerReference (v1 Pod, the pod's name
// and UID, controller and blockOwnerDeletion set), as the resourceclaim controller gives the
// claims it makes from a pod's claim template. The garbage collector then deletes the claim
// with its pod, so claims made for pods are never left behind (HAMi-DRA's webhook makes
// claims without an owner, which pile up). It is for code that creates a ResourceClaim for
// one pod; claims shared by several pods should have no pod owner.
//
// Create the pod first (the reference needs its UID), then the claim; kube-scheduler waits
// for a claim the pod names. It fails, wrapping [ErrInvalidOwner], for a pod without a name
// or UID (not created yet), one in another namespace than the claim, and a claim already
// controlled by another object; a reference to the same pod is replaced (it is idempotent).
// Where the API server runs the OwnerReferencesPermissionEnforcement admission plugin, the
// creator needs update on pods/finalizers to set blockOwnerDeletion.
func SetPodOwner(claim *resourcev1.ResourceClaim, pod *corev1.Pod) error {
	switch {
	case claim == nil || pod == nil:
		return fmt.Errorf("set the owner of a claim: nil claim or pod: %w", ErrInvalidOwner)
	case pod.Name == "" || pod.UID == "":
		return fmt.Errorf("set pod %s/%s as the owner of claim %s: the pod has no name or UID: create the pod first, then the claim: %w",
			pod.Namespace, pod.Name, claim.Name, ErrInvalidOwner)
	case pod.Namespace != claim.Namespace:
		return fmt.Errorf("set pod %s/%s as the owner of claim %s/%s: an owner must be in the claim's namespace: %w",
			pod.Namespace, pod.Name, claim.Namespace, claim.Name, ErrInvalidOwner)
	}
	refs := claim.OwnerReferences[:0:0]
	for _, r := range claim.OwnerReferences {
		if r.UID == pod.UID {
			continue
		}
		if r.Controller != nil && *r.Controller {
			return fmt.Errorf("set pod %s/%s as the owner of claim %s/%s: it is controlled by %s %s already: %w",
				pod.Namespace, pod.Name, claim.Namespace, claim.Name, r.Kind, r.Name, ErrInvalidOwner)
		}
		refs = append(refs, r)
	}
	yes := true
	refs = append(refs, metav1.OwnerReference{
		APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
		Controller: &yes, BlockOwnerDeletion: &yes,
	})
	claim.OwnerReferences = refs
	return nil
}
