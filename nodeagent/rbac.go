package nodeagent

import (
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/register"
)

// ClusterRoleRules returns the RBAC rules an Agent needs, no more: those of the register
// annotation writer (list, watch and patch nodes; create and patch events) and of the node
// lock (get and patch nodes, get pods), patch pods for the device annotations and the
// bind-phase, and list and watch pods for the agent's pod informer (with Options.MIG or
// Options.DRA: the node's pods, by field selector spec.nodeName, to release the MIG devices no
// live reservation owns and to refuse a claim on a GPU a pod holds). Without MIG and DRA the
// agent lists and watches no pods. The same rules are in the ClusterRole of
// examples/deviceplugin/deploy.
func ClusterRoleRules() []rbacv1.PolicyRule {
	verbs := map[string]map[string]bool{}
	add := func(rules []rbacv1.PolicyRule) {
		for _, r := range rules {
			for _, res := range r.Resources {
				if verbs[res] == nil {
					verbs[res] = map[string]bool{}
				}
				for _, v := range r.Verbs {
					verbs[res][v] = true
				}
			}
		}
	}
	add(register.ClusterRoleRules())
	add(nodelock.ClusterRoleRules())
	add([]rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch", "patch"}}})
	var out []rbacv1.PolicyRule
	for _, res := range []string{"nodes", "pods", "events"} {
		var vs []string
		for _, v := range []string{"get", "list", "watch", "create", "patch"} {
			if verbs[res][v] {
				vs = append(vs, v)
			}
		}
		out = append(out, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{res}, Verbs: vs})
	}
	return out
}

// ClusterRoleRulesFor returns the RBAC rules an Agent with opts needs: [ClusterRoleRules],
// and patch on nodes/status with Options.NodeCapacity.
func ClusterRoleRulesFor(opts Options) []rbacv1.PolicyRule {
	rules := ClusterRoleRules()
	if opts.NodeCapacity {
		rules = append(rules, NodeCapacityRules()...)
	}
	return rules
}

// NodeCapacityRules are the rules Options.NodeCapacity adds to [ClusterRoleRules]: patch on
// nodes/status. examples/deviceplugin/deploy/node-capacity.yaml grants them.
func NodeCapacityRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}}}
}
