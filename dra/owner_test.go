package dra_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/dra"
)

func TestSetPodOwner(t *testing.T) {
	t.Parallel()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "pod-uid"}}
	yes, no := true, false
	want := metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "p", UID: "pod-uid", Controller: &yes, BlockOwnerDeletion: &yes}
	other := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "rs-uid", Controller: &no}
	tests := map[string]struct {
		refs    []metav1.OwnerReference
		pod     *corev1.Pod
		want    []metav1.OwnerReference
		wantErr string
	}{
		"none":                {want: []metav1.OwnerReference{want}},
		"again":               {refs: []metav1.OwnerReference{want}, want: []metav1.OwnerReference{want}},
		"beside a non-owner":  {refs: []metav1.OwnerReference{other}, want: []metav1.OwnerReference{other, want}},
		"pod not created yet": {pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}, wantErr: "create the pod first"},
		"other namespace":     {pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "p", UID: "u"}}, wantErr: "claim's namespace"},
		"controlled already": {refs: []metav1.OwnerReference{{Kind: "Job", Name: "j", UID: "j", Controller: &yes}},
			wantErr: "controlled by Job j"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", OwnerReferences: tc.refs}}
			p := pod
			if tc.pod != nil {
				p = tc.pod
			}
			err := dra.SetPodOwner(claim, p)
			if tc.wantErr != "" {
				if !errors.Is(err, dra.ErrInvalidOwner) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("SetPodOwner: %v, want ErrInvalidOwner with %q", err, tc.wantErr)
				}
				if diff := cmp.Diff(tc.refs, claim.OwnerReferences); diff != "" {
					t.Errorf("references changed on error:\n%s", diff)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, claim.OwnerReferences); diff != "" {
				t.Errorf("references (-want +got):\n%s", diff)
			}
		})
	}
}

// A claim made for one pod is owned by it, so the garbage collector deletes it with the pod.
func ExampleSetPodOwner() {
	// The pod as the API server returned it from Create: it has its UID.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "train-0", UID: "5d1c…"}}
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "train-0-gpu"}}
	if err := dra.SetPodOwner(claim, pod); err != nil {
		fmt.Println(err)
		return
	}
	r := claim.OwnerReferences[0]
	fmt.Println(r.Kind, r.Name, *r.Controller, *r.BlockOwnerDeletion)
	// Output: Pod train-0 true true
}
