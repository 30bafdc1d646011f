package diagnose

import (
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

func requiredAffinity(spec *corev1.PodSpec) *corev1.NodeSelector {
	if spec.Affinity == nil || spec.Affinity.NodeAffinity == nil {
		return nil
	}
	return spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
}

// matchesNodeSelector evaluates required node affinity: the terms are ORed, the expressions
// of a term ANDed (an empty term matches nothing), as the scheduler does.
func matchesNodeSelector(node *corev1.Node, sel *corev1.NodeSelector) bool {
	for _, term := range sel.NodeSelectorTerms {
		if len(term.MatchExpressions) == 0 && len(term.MatchFields) == 0 {
			continue
		}
		ok := true
		for _, e := range term.MatchExpressions {
			v, has := node.Labels[e.Key]
			ok = ok && matchRequirement(e, v, has)
		}
		for _, e := range term.MatchFields {
			ok = ok && e.Key == "metadata.name" && matchRequirement(e, node.Name, true)
		}
		if ok {
			return true
		}
	}
	return false
}

func matchRequirement(e corev1.NodeSelectorRequirement, v string, has bool) bool {
	switch e.Operator {
	case corev1.NodeSelectorOpIn:
		return has && slices.Contains(e.Values, v)
	case corev1.NodeSelectorOpNotIn:
		return !has || !slices.Contains(e.Values, v)
	case corev1.NodeSelectorOpExists:
		return has
	case corev1.NodeSelectorOpDoesNotExist:
		return !has
	case corev1.NodeSelectorOpGt, corev1.NodeSelectorOpLt:
		if !has || len(e.Values) != 1 {
			return false
		}
		got, err1 := strconv.ParseInt(v, 10, 64)
		want, err2 := strconv.ParseInt(e.Values[0], 10, 64)
		if err1 != nil || err2 != nil {
			return false
		}
		if e.Operator == corev1.NodeSelectorOpGt {
			return got > want
		}
		return got < want
	}
	return false
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
