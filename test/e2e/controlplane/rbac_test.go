package controlplane_test

import (
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// A device plugin's ServiceAccount without "patch nodes" can read its Node but cannot
// write the register annotation: the server answers 403 with its own message, which the
// SDK must surface (apierrors.IsForbidden).
func TestServiceAccountWithoutPatchIsForbidden(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	admin := cp.AdminClient()
	ns, role := harness.UniqueName("rbac"), harness.UniqueName("nodes-readonly")
	_, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create cluster role: %v", err)
	}
	node := harness.UniqueName("rbac-node")
	createNode(t, node, nil)

	limited, err := cp.ServiceAccountClient(ctx, ns, "limited", role)
	if err != nil {
		t.Fatalf("service account client: %v", err)
	}
	if _, err := limited.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err != nil {
		t.Fatalf("GET node with get/list/watch: %v", err)
	}
	_, err = limited.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType,
		annotationMergePatch(map[string]string{annotation.KeyNVIDIARegister: "[]"}), metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("PATCH node without patch permission: err = %v, want Forbidden", err)
	}
	want := `nodes "` + node + `" is forbidden: User "system:serviceaccount:` + ns + `:limited" cannot patch resource "nodes" in API group "" at the cluster scope`
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error = %q\nwant it to contain %q", err, want)
	}

	// The same ServiceAccount may patch once a role grants it: the 403 came from RBAC.
	writer := harness.UniqueName("nodes-patch")
	_, err = admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: writer},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"patch"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create cluster role: %v", err)
	}
	allowed, err := cp.ServiceAccountClient(ctx, ns, "limited", writer)
	if err != nil {
		t.Fatalf("service account client: %v", err)
	}
	_, err = allowed.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType,
		annotationMergePatch(map[string]string{annotation.KeyNVIDIARegister: "[]"}), metav1.PatchOptions{})
	if err != nil {
		t.Errorf("PATCH node with patch permission: %v", err)
	}
}
