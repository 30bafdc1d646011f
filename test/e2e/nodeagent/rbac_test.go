package nodeagent_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/internal/manifests"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/nodeagent/nodedra"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// deployDir holds the example's manifests.
var deployDir = filepath.Join("..", "..", "..", "examples", "deviceplugin", "deploy")

// TestDeployManifests creates examples/deviceplugin/deploy on the API server and asks it,
// with SubjectAccessReviews, what the DaemonSet's ServiceAccount may do: exactly the verbs
// of nodeagent.ClusterRoleRules() (with which every agent of this package runs),
// nodedra.ClusterRoleRules() (what --dra adds, in dra.yaml beside the DeviceClasses) and
// nodeagent.NodeCapacityRules() (what --report-node-capacity adds, in node-capacity.yaml),
// and nothing else.
func TestDeployManifests(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := cp.AdminClient()
	if err := cp.EnsureNamespace(ctx, "kube-system"); err != nil {
		t.Fatal(err)
	}
	var sa *corev1.ServiceAccount
	cleanup := func(f func(context.Context) error) {
		t.Cleanup(func() { _ = f(context.WithoutCancel(ctx)) })
	}
	for _, obj := range manifests.Glob(t, filepath.Join(deployDir, "*.yaml")) {
		var err error
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			sa = o
			_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
			cleanup(func(ctx context.Context) error {
				return c.CoreV1().ServiceAccounts(o.Namespace).Delete(ctx, o.Name, metav1.DeleteOptions{})
			})
		case *rbacv1.ClusterRole:
			_, err = c.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
			cleanup(func(ctx context.Context) error {
				return c.RbacV1().ClusterRoles().Delete(ctx, o.Name, metav1.DeleteOptions{})
			})
		case *rbacv1.ClusterRoleBinding:
			_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
			cleanup(func(ctx context.Context) error {
				return c.RbacV1().ClusterRoleBindings().Delete(ctx, o.Name, metav1.DeleteOptions{})
			})
		case *appsv1.DaemonSet:
			var ds *appsv1.DaemonSet
			ds, err = c.AppsV1().DaemonSets(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
			if err == nil && ds.Spec.Template.Spec.NodeSelector["gpu"] != "on" {
				t.Errorf("stored DaemonSet has nodeSelector %v", ds.Spec.Template.Spec.NodeSelector)
			}
			cleanup(func(ctx context.Context) error {
				return c.AppsV1().DaemonSets(o.Namespace).Delete(ctx, o.Name, metav1.DeleteOptions{})
			})
		case *corev1.Service: // monitor-service.yaml: the API server validates it (NodePort 31992, Local)
			_, err = c.CoreV1().Services(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
			cleanup(func(ctx context.Context) error {
				return c.CoreV1().Services(o.Namespace).Delete(ctx, o.Name, metav1.DeleteOptions{})
			})
		case *resourcev1.DeviceClass:
			_, err = c.ResourceV1().DeviceClasses().Create(ctx, o, metav1.CreateOptions{})
			cleanup(func(ctx context.Context) error {
				return c.ResourceV1().DeviceClasses().Delete(ctx, o.Name, metav1.DeleteOptions{})
			})
		default:
			t.Fatalf("unexpected manifest %T", obj)
		}
		if err != nil {
			t.Fatalf("create %T: %v", obj, err)
		}
	}
	if sa == nil {
		t.Fatal("no ServiceAccount in the manifests")
	}

	user := "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
	can := func(verb, group, res, sub string) bool {
		t.Helper()
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + sa.Namespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: verb, Group: group, Resource: res, Subresource: sub, Namespace: namespaced(res),
			},
		}}
		r, err := c.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("SubjectAccessReview: %v", err)
		}
		return r.Status.Allowed
	}
	allowed := map[string][]string{} // "group/resource" -> verbs
	for _, r := range append(nodeagent.ClusterRoleRules(), nodedra.ClusterRoleRules()...) {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				allowed[g+"/"+res] = append(allowed[g+"/"+res], r.Verbs...)
			}
		}
	}
	harness.Eventually(t, "the RBAC authorizer to see the binding", 30*time.Second, func() bool { return can("patch", "", "nodes", "") })

	verbs := []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
	for _, gr := range []struct{ group, res string }{
		{"", "nodes"}, {"", "pods"}, {"", "events"}, {"", "secrets"}, {"", "configmaps"}, {"", "services"},
		{"resource.k8s.io", "resourceslices"}, {"resource.k8s.io", "resourceclaims"},
		{"resource.k8s.io", "deviceclasses"},
	} {
		for _, verb := range verbs {
			if want, got := slices.Contains(allowed[gr.group+"/"+gr.res], verb), can(verb, gr.group, gr.res, ""); got != want {
				t.Errorf("%s %s (group %q): allowed %v, want %v", verb, gr.res, gr.group, got, want)
			}
		}
	}
	if !can("patch", "", "nodes", "status") { // node-capacity.yaml
		t.Error("patch nodes/status denied, want allowed by node-capacity.yaml (nodeagent.NodeCapacityRules)")
	}
	for _, d := range []struct{ verb, group, res, sub string }{
		{"update", "", "nodes", "status"}, {"get", "", "nodes", "status"},
		{"create", "", "pods", "binding"}, {"patch", "", "pods", "status"}, {"create", "", "pods", "eviction"},
		{"list", "apps", "daemonsets", ""}, {"get", "coordination.k8s.io", "leases", ""},
		{"create", "events.k8s.io", "events", ""},
	} {
		if can(d.verb, d.group, d.res, d.sub) {
			t.Errorf("%s %s/%s (group %q) allowed, want denied", d.verb, d.res, d.sub, d.group)
		}
	}
}

// namespaced gives a namespace for the namespaced resources the review asks about.
func namespaced(res string) string {
	switch res {
	case "nodes", "resourceslices", "deviceclasses":
		return ""
	}
	return "default"
}
