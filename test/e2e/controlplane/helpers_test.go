package controlplane_test

import (
	"context"
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// createNode creates a Node with the given labels (no status), deleted when the test ends.
func createNode(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	cp.CreateNode(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}})
}

// annotationMergePatch is what HAMi's device plugin sends: a JSON merge patch that sets
// only the given annotations.
func annotationMergePatch(annotations map[string]string) []byte {
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}}) // cannot fail for strings
	return b
}

func patchAnnotations(ctx context.Context, name string, patch []byte) error {
	_, err := cp.AdminClient().CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}
