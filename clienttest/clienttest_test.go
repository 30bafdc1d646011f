package clienttest_test

import (
	"errors"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/clienttest"
)

func rv(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("resourceVersion %q: %v", s, err)
	}
	return n
}

func TestPodPatches(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cs := clienttest.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}})
	pods := cs.CoreV1().Pods("ns")
	p0, err := pods.Get(ctx, "p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p1, err := pods.Patch(ctx, "p", types.MergePatchType, []byte(`{"metadata":{"annotations":{"k":"v"}}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rv(t, p1.ResourceVersion) <= rv(t, p0.ResourceVersion) || p1.Annotations["k"] != "v" {
		t.Errorf("patched pod rv %s (was %s), annotations %v", p1.ResourceVersion, p0.ResourceVersion, p1.Annotations)
	}
	// A patch naming the current resourceVersion applies.
	body := `{"metadata":{"annotations":{"k":null},"resourceVersion":"` + p1.ResourceVersion + `"}}`
	p2, err := pods.Patch(ctx, "p", types.MergePatchType, []byte(body), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := p2.Annotations["k"]; ok {
		t.Errorf("annotation not removed: %v", p2.Annotations)
	}
	if _, err := pods.Patch(ctx, "p", types.MergePatchType, []byte(body), metav1.PatchOptions{}); !apierrors.IsConflict(err) {
		t.Errorf("stale patch = %v, want a conflict", err)
	}
	if _, err := pods.Patch(ctx, "gone", types.MergePatchType, []byte(`{}`), metav1.PatchOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("patch of a missing pod = %v, want NotFound", err)
	}
	// Strategic merge patches are the fake's own.
	if _, err := pods.Patch(ctx, "p", types.StrategicMergePatchType, []byte(`{"metadata":{"labels":{"l":"1"}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("strategic merge patch: %v", err)
	}
}

func TestFailAll(t *testing.T) {
	t.Parallel()
	cs := clienttest.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}})
	refused := errors.New("refused")
	clienttest.Fail(&cs.Fake, "get", "nodes", -1, refused)
	for range 3 {
		if _, err := cs.CoreV1().Nodes().Get(t.Context(), "n", metav1.GetOptions{}); !errors.Is(err, refused) {
			t.Fatalf("get = %v, want refused", err)
		}
	}
	if _, err := cs.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{}); err != nil {
		t.Errorf("list = %v: only gets fail", err)
	}
}
