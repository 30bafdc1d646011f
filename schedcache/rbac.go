package schedcache

import rbacv1 "k8s.io/api/rbac/v1"

// ClusterRoleRules returns the cluster-wide RBAC rules of a [Cache] with its [Handshaker], no
// more: list and watch nodes (the informer), patch them (the handshake; only the Handshaker
// writes), and create and patch Events (Options.EventRecorder; the correlator patches repeated
// ones).
func ClusterRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list", "watch", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
}

// LeaseRoleRules returns the rules, for a Role in the Lease's namespace, of an [Elector] (get,
// create and update its Lease) and a [LeaseFollower] (get, list and watch kube-scheduler's
// Lease).
func LeaseRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "update"}},
	}
}
