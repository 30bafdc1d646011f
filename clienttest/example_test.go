package clienttest_test

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/clienttest"
)

// Merge patches bump the resourceVersion as the API server's do, a stale resourceVersion is
// a conflict, and Fail stands in for an API server that does not answer.
func Example() {
	ctx := context.Background()
	cs := clienttest.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}})
	nodes := cs.CoreV1().Nodes()

	before, _ := nodes.Get(ctx, "gpu-1", metav1.GetOptions{})
	after, _ := nodes.Patch(ctx, "gpu-1", types.MergePatchType, []byte(`{"metadata":{"annotations":{"a":"1"}}}`), metav1.PatchOptions{})
	fmt.Println("resourceVersion grew:", after.ResourceVersion > before.ResourceVersion)

	stale := fmt.Sprintf(`{"metadata":{"annotations":{"a":"2"},"resourceVersion":%q}}`, before.ResourceVersion)
	_, err := nodes.Patch(ctx, "gpu-1", types.MergePatchType, []byte(stale), metav1.PatchOptions{})
	fmt.Println("stale patch is a conflict:", apierrors.IsConflict(err))

	outage := errors.New("connection refused")
	clienttest.Fail(&cs.Fake, "get", "nodes", 1, outage)
	_, err = nodes.Get(ctx, "gpu-1", metav1.GetOptions{})
	fmt.Println("first get:", err)
	_, err = nodes.Get(ctx, "gpu-1", metav1.GetOptions{})
	fmt.Println("second get:", err)
	// Output:
	// resourceVersion grew: true
	// stale patch is a conflict: true
	// first get: connection refused
	// second get: <nil>
}
