package register

import rbacv1 "k8s.io/api/rbac/v1"

// ClusterRoleRules returns the RBAC rules a [Writer] needs, no more: list and watch its Node
// (Run's watch, scoped by a field selector, which RBAC cannot restrict further), patch it
// (the annotation), and create and patch Events (Warning Events on failed writes; the
// correlator patches repeated ones). Sync called outside Run also needs get on nodes. The same
// rules are in the ClusterRole manifest of the package documentation.
func ClusterRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list", "watch", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
}
