package diagnose

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// requiredAffinityMismatch reports whether node fails the required node affinity of spec, with
// the scheduler's own matcher (terms ORed, expressions ANDed, an empty term matching nothing).
// A selector that does not parse matches no node; err then says why.
func requiredAffinityMismatch(node *corev1.Node, spec *corev1.PodSpec) (sel *corev1.NodeSelector, mismatch bool, err error) {
	if spec.Affinity == nil || spec.Affinity.NodeAffinity == nil || spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil, false, nil
	}
	sel = spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	ok, err := nodeaffinity.NewLazyErrorNodeSelector(sel).Match(node)
	return sel, !ok, err
}

func describeNodeSelector(sel *corev1.NodeSelector) string {
	var terms []string
	for _, t := range sel.NodeSelectorTerms {
		var parts []string
		for _, e := range slices.Concat(t.MatchExpressions, t.MatchFields) {
			parts = append(parts, e.Key+" "+string(e.Operator)+" ("+strings.Join(e.Values, ",")+")")
		}
		terms = append(terms, strings.Join(parts, " and "))
	}
	return strings.Join(terms, " or ")
}
