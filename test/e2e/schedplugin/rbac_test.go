package schedplugin_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/internal/manifests"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// TestRBACManifest creates examples/scheduler/deploy/rbac.yaml on the API server (every name
// of its own under a unique suffix, so that the harness's ClusterRole hami-scheduler, which
// the tests' schedulers run with, is not touched) and asks the API server, with
// SubjectAccessReviews, what the ServiceAccount may do:
//
//   - every verb the program uses: kube-scheduler's (bind, pod status, events, its Lease
//     hami-scheduler, the client CA of its delegated authentication) and the plugin's and
//     webhook's (pods patch, nodes get and patch, resourcequotas list and watch, events);
//   - over a grid of resources and verbs, exactly what the manifest's rules and the bootstrap
//     roles it binds (system:kube-scheduler, system:volume-scheduler, read from the API
//     server) grant, and nothing more.
func TestRBACManifest(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := cp.AdminClient()
	if err := cp.EnsureNamespace(ctx, "kube-system"); err != nil {
		t.Fatal(err)
	}
	suffix := "-" + harness.UniqueName("rbac")
	rename := func(n string) string {
		if len(n) > 7 && n[:7] == "system:" || n == "extension-apiserver-authentication-reader" {
			return n // bootstrap roles
		}
		return n + suffix
	}
	cleanup := func(f func(context.Context) error) {
		t.Cleanup(func() { _ = f(context.WithoutCancel(ctx)) })
	}
	var sa *corev1.ServiceAccount
	var clusterRules, leaseRules []rbacv1.PolicyRule
	var boundRoles []string
	for _, obj := range manifests.Glob(t, filepath.Join("..", "..", "..", "examples", "scheduler", "deploy", "rbac.yaml")) {
		var err error
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			o.Name = rename(o.Name)
			sa = o
			_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
			cleanup(func(ctx context.Context) error {
				return c.CoreV1().ServiceAccounts(o.Namespace).Delete(ctx, o.Name, metav1.DeleteOptions{})
			})
		case *rbacv1.ClusterRole:
			o.Name = rename(o.Name)
			clusterRules = append(clusterRules, o.Rules...)
			_, err = c.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
			cleanup(func(ctx context.Context) error {
				return c.RbacV1().ClusterRoles().Delete(ctx, o.Name, metav1.DeleteOptions{})
			})
		case *rbacv1.ClusterRoleBinding:
			o.Name, o.RoleRef.Name = rename(o.Name), rename(o.RoleRef.Name)
			for i := range o.Subjects {
				o.Subjects[i].Name = rename(o.Subjects[i].Name)
			}
			boundRoles = append(boundRoles, o.RoleRef.Name)
			_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
			cleanup(func(ctx context.Context) error {
				return c.RbacV1().ClusterRoleBindings().Delete(ctx, o.Name, metav1.DeleteOptions{})
			})
		case *rbacv1.Role:
			o.Name = rename(o.Name)
			leaseRules = append(leaseRules, o.Rules...)
			_, err = c.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
			cleanup(func(ctx context.Context) error {
				return c.RbacV1().Roles(o.Namespace).Delete(ctx, o.Name, metav1.DeleteOptions{})
			})
		case *rbacv1.RoleBinding:
			o.Name, o.RoleRef.Name = rename(o.Name), rename(o.RoleRef.Name)
			for i := range o.Subjects {
				o.Subjects[i].Name = rename(o.Subjects[i].Name)
			}
			_, err = c.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
			cleanup(func(ctx context.Context) error {
				return c.RbacV1().RoleBindings(o.Namespace).Delete(ctx, o.Name, metav1.DeleteOptions{})
			})
		default:
			t.Fatalf("unexpected manifest %T", obj)
		}
		if err != nil {
			t.Fatalf("create %T: %v", obj, err)
		}
	}
	if sa == nil {
		t.Fatal("no ServiceAccount in rbac.yaml")
	}
	// The bootstrap roles the manifest binds, as this API server has them.
	for _, name := range boundRoles {
		if name == rename("hami-scheduler") {
			continue
		}
		r, err := c.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("bootstrap role %s: %v", name, err)
		}
		clusterRules = append(clusterRules, r.Rules...)
	}

	user := "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
	can := func(verb, group, res, sub, ns, name string) bool {
		t.Helper()
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + sa.Namespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: verb, Group: group, Resource: res, Subresource: sub, Namespace: ns, Name: name,
			},
		}}
		r, err := c.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("SubjectAccessReview: %v", err)
		}
		return r.Status.Allowed
	}
	harness.Eventually(t, "the RBAC authorizer to see the bindings", 30*time.Second, func() bool {
		return can("patch", "", "nodes", "", "", "") && can("update", "coordination.k8s.io", "leases", "", "kube-system", "hami-scheduler")
	})

	// What the program does.
	for _, d := range []struct{ verb, group, res, sub, ns, name string }{
		{"patch", "", "pods", "", "default", ""},                 // HAMi's pod annotations
		{"get", "", "pods", "", "default", ""},                   // a lock owner's existence
		{"list", "", "pods", "", "", ""},                         // usage
		{"watch", "", "pods", "", "", ""},                        //
		{"get", "", "nodes", "", "", ""},                         // the node lock
		{"patch", "", "nodes", "", "", ""},                       // the node lock, the handshake
		{"list", "", "nodes", "", "", ""},                        //
		{"watch", "", "nodes", "", "", ""},                       //
		{"list", "", "resourcequotas", "", "", ""},               // the GPU quota
		{"watch", "", "resourcequotas", "", "", ""},              //
		{"create", "", "pods", "binding", "default", ""},         // kube-scheduler's bind
		{"patch", "", "pods", "status", "default", ""},           // conditions, nominatedNodeName
		{"delete", "", "pods", "", "default", ""},                // preemption
		{"create", "", "events", "", "default", ""},              // HAMi's events
		{"patch", "", "events", "", "default", ""},               //
		{"create", "events.k8s.io", "events", "", "default", ""}, // kube-scheduler's events
		{"get", "coordination.k8s.io", "leases", "", "kube-system", "hami-scheduler"},
		{"update", "coordination.k8s.io", "leases", "", "kube-system", "hami-scheduler"},
		{"create", "coordination.k8s.io", "leases", "", "kube-system", ""},
		{"list", "coordination.k8s.io", "leases", "", "kube-system", ""},  // the handshake writer follows the Lease
		{"watch", "coordination.k8s.io", "leases", "", "kube-system", ""}, //
		{"get", "", "configmaps", "", "kube-system", "extension-apiserver-authentication"},
	} {
		if !can(d.verb, d.group, d.res, d.sub, d.ns, d.name) {
			t.Errorf("%s %s/%s %s/%s (group %q) denied, the program needs it", d.verb, d.res, d.sub, d.ns, d.name, d.group)
		}
	}

	// Nothing more than the rules grant.
	verbs := []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
	for _, gr := range []struct{ group, res, ns string }{
		{"", "nodes", ""}, {"", "pods", "default"}, {"", "resourcequotas", "default"}, {"", "events", "default"},
		{"", "secrets", "default"}, {"", "configmaps", "kube-system"}, {"", "services", "default"},
		{"", "namespaces", ""}, {"", "persistentvolumeclaims", "default"}, {"apps", "deployments", "default"},
		{"coordination.k8s.io", "leases", "kube-system"}, {"coordination.k8s.io", "leases", "default"},
		{"rbac.authorization.k8s.io", "clusterroles", ""}, {"resource.k8s.io", "resourceslices", ""},
	} {
		rules := clusterRules
		if gr.ns == "kube-system" {
			rules = append(slices.Clip(rules), leaseRules...)
		}
		for _, verb := range verbs {
			if want, got := grants(rules, verb, gr.group, gr.res), can(verb, gr.group, gr.res, "", gr.ns, ""); got != want {
				t.Errorf("%s %s in %q (group %q): allowed %v, the rules grant %v", verb, gr.res, gr.ns, gr.group, got, want)
			}
		}
	}
	for _, d := range []struct{ verb, group, res, sub string }{
		{"patch", "", "nodes", "status"}, {"update", "", "nodes", "status"}, {"create", "", "pods", "eviction"},
		{"update", "", "pods", ""}, {"delete", "", "nodes", ""},
	} {
		if can(d.verb, d.group, d.res, d.sub, namespaced(d.res), "") {
			t.Errorf("%s %s/%s (group %q) allowed, want denied", d.verb, d.res, d.sub, d.group)
		}
	}
}

// grants reports whether a rule without resource names grants verb on group/resource.
func grants(rules []rbacv1.PolicyRule, verb, group, res string) bool {
	for _, r := range rules {
		if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
			continue
		}
		if (slices.Contains(r.APIGroups, group) || slices.Contains(r.APIGroups, "*")) &&
			(slices.Contains(r.Resources, res) || slices.Contains(r.Resources, "*")) &&
			(slices.Contains(r.Verbs, verb) || slices.Contains(r.Verbs, "*")) {
			return true
		}
	}
	return false
}

// namespaced gives a namespace for the namespaced resources the review asks about.
func namespaced(res string) string {
	if res == "nodes" {
		return ""
	}
	return "default"
}
