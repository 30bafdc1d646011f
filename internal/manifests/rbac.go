package manifests

import (
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"
)

// Uncovered returns the "group/resource verb" triples of want that no rule of rules allows
// (rules naming resources do not count: a program's rules must cover every object).
func Uncovered(rules, want []rbacv1.PolicyRule) []string {
	var missing []string
	for _, w := range want {
		for _, g := range w.APIGroups {
			for _, r := range w.Resources {
				for _, v := range w.Verbs {
					if !slices.ContainsFunc(rules, func(p rbacv1.PolicyRule) bool {
						return slices.Contains(p.APIGroups, g) && slices.Contains(p.Resources, r) && slices.Contains(p.Verbs, v) && len(p.ResourceNames) == 0
					}) {
						missing = append(missing, g+"/"+r+" "+v)
					}
				}
			}
		}
	}
	return missing
}
