package controlplane_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// uniqueName returns prefix-<random>, a valid DNS label for isolating a test's objects.
func uniqueName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return strings.ToLower(prefix) + "-" + hex.EncodeToString(b)
}

// createNode creates a Node with the given labels (no status).
func createNode(t *testing.T, name string, labels map[string]string) *corev1.Node {
	t.Helper()
	n, err := cp.AdminClient().CoreV1().Nodes().Create(t.Context(), &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	return n
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
