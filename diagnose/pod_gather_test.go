package diagnose_test

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/diagnose"
)

// TestPodGathersLockHolderWithoutGPU: through Pod, the holder of a node lock is read even
// when it asks for no GPU and carries no HAMi annotation (found on real peers: such a holder
// read as gone, and the lock as stale for the wrong reason).
func TestPodGathersLockHolderWithoutGPU(t *testing.T) {
	t.Parallel()
	n := readyNode("gpu-1", time.Hour, lockAgo(10*time.Second, bindNS+"/elsewhere"))
	holder := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: bindNS, Name: "elsewhere"},
		Spec:   corev1.PodSpec{NodeName: "cpu-1", Containers: []corev1.Container{{Name: "main", Image: "busybox"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	pod := filtered("train-1", 20*time.Second)
	ev := lockedEvent()
	c := fake.NewClientset([]runtime.Object{&n, holder, pod, &ev, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: bindNS}}}...)
	r, err := diagnose.Pod(t.Context(), c, bindNS, "train-1", diagnose.Options{Clock: testingclock.NewFakePassiveClock(now)})
	if err != nil {
		t.Fatal(err)
	}
	if r.Lock == nil {
		t.Fatalf("no lock in the report: %+v", r.Findings)
	}
	if !r.Lock.HolderExists || r.Lock.HolderNode != "cpu-1" || !strings.Contains(r.Lock.Stale, "runs on node cpu-1") {
		t.Errorf("lock %+v, want the holder found on cpu-1", *r.Lock)
	}
	if r.Case != diagnose.P4NodeLocked {
		t.Errorf("case %s, want P4", r.Case)
	}
}
