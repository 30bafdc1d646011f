package nodelock

import rbacv1 "k8s.io/api/rbac/v1"

// ClusterRoleRules returns the RBAC rules a [Locker] needs, no more: get and patch nodes
// (read the lock and its resourceVersion, write it), and get pods (whether a lock's owner
// still exists). The same rules are in the ClusterRole manifest of the package documentation.
func ClusterRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}},
	}
}
