package preemption_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/test/e2e/harness"
)

// TestDeleteWithoutKubelet records why the tests run a reaper: kube-scheduler's preemption
// deletes a victim with empty DeleteOptions (k8s.io/kubernetes pkg/scheduler/util.DeletePod),
// so the victim's terminationGracePeriodSeconds decides. A bound pod with a grace period
// stays Terminating (deletionTimestamp set) until its kubelet confirms — without a kubelet,
// for ever, and its GPU memory with it. A bound pod whose spec says 0 is removed at once.
func TestDeleteWithoutKubelet(t *testing.T) {
	ns := namespace(t, "kubelet")
	pods := cp.AdminClient().CoreV1().Pods(ns)
	for name, grace := range map[string]int64{"grace-30": 30, "grace-0": 0} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.PodSpec{
			NodeName: harness.UniqueName("no-kubelet"), TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/never-pulled:0"}},
		}}
		if _, err := pods.Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := pods.Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		got, err := pods.Get(t.Context(), name, metav1.GetOptions{})
		switch {
		case grace > 0 && (err != nil || got.DeletionTimestamp == nil):
			t.Errorf("%s: after the delete: %v, err %v; want it Terminating", name, got, err)
		case grace == 0 && !apierrors.IsNotFound(err):
			t.Errorf("%s: after the delete: %v, err %v; want it gone", name, got, err)
		}
		if grace > 0 {
			if err := pods.Delete(t.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
				t.Fatal(err)
			}
		}
	}
}
