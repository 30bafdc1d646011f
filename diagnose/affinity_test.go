package diagnose_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/diagnose"
)

// TestRequiredNodeAffinity: a DaemonSet's required node affinity is evaluated as the scheduler
// does; a node it does not match is case 1 with the selector as evidence.
func TestRequiredNodeAffinity(t *testing.T) {
	t.Parallel()
	const node = "gpu-a"
	req := func(key string, op corev1.NodeSelectorOperator, values ...string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: key, Operator: op, Values: values}
	}
	tests := map[string]struct {
		terms    []corev1.NodeSelectorTerm
		mismatch bool
		want     []string // in the finding's text
	}{
		"label In, other value":                  {terms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{req("gpu", corev1.NodeSelectorOpIn, "off")}}}},
		"label In":                               {terms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{req("gpu", corev1.NodeSelectorOpIn, "on", "yes")}}}},
		"metadata.name":                          {terms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{req("metadata.name", corev1.NodeSelectorOpIn, node)}}}},
		"other node":                             {terms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{req("metadata.name", corev1.NodeSelectorOpIn, "gpu-b")}}}},
		"terms ORed, empty term matches nothing": {terms: []corev1.NodeSelectorTerm{{}, {MatchExpressions: []corev1.NodeSelectorRequirement{req("gpu", corev1.NodeSelectorOpExists)}}}},
		"only an empty term":                     {terms: []corev1.NodeSelectorTerm{{}}},
		"expressions ANDed": {terms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
			req("gpu", corev1.NodeSelectorOpExists), req("zone", corev1.NodeSelectorOpExists)}}}},
		"Gt":              {terms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{req("gpu-count", corev1.NodeSelectorOpGt, "4")}}}},
		"Lt":              {terms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{req("gpu-count", corev1.NodeSelectorOpLt, "4")}}}},
		"bad operator":    {terms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{req("gpu", "Equals", "on")}}}},
		"Gt not a number": {terms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{req("gpu-count", corev1.NodeSelectorOpGt, "four")}}}},
	}
	mismatches := map[string][]string{
		"label In, other value": {"required node affinity: gpu In (off)"},
		"other node":            {"metadata.name In (gpu-b)"},
		"only an empty term":    nil,
		"expressions ANDed":     {"gpu Exists () and zone Exists ()"},
		"Lt":                    {"gpu-count Lt (4)"},
		"bad operator":          {"the scheduler cannot evaluate it", `Unsupported value: "Equals"`},
		"Gt not a number":       {"the scheduler cannot evaluate it"},
	}
	for name, tc := range tests {
		want, mismatch := mismatches[name]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			n := gpuNode(node)
			n.Labels["gpu-count"] = "8"
			ds := pluginDaemonSet()
			ds.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: tc.terms}}}
			objs := without(replace(healthyObjects(node), n, ds), isPod)
			r, err := diagnose.Node(t.Context(), fakeClient(true, objs...), node, opts())
			if err != nil {
				t.Fatal(err)
			}
			f, ok := r.Finding(diagnose.CodeNodeSelectorMismatch)
			if ok != mismatch {
				t.Fatalf("NodeSelectorMismatch finding %v, want %v:\n%s", ok, mismatch, dump(r))
			}
			if !mismatch {
				if _, ok := r.Finding(diagnose.CodePluginPodMissing); !ok {
					t.Errorf("no PluginPodMissing finding for a node the DaemonSet selects:\n%s", dump(r))
				}
				return
			}
			if r.Case != diagnose.CasePluginNotScheduled {
				t.Errorf("case = %v (%s), want %v", r.Case, r.Reason, diagnose.CasePluginNotScheduled)
			}
			text := findingText(f)
			for _, w := range append(want, "does not match the required node affinity of DaemonSet") {
				if !strings.Contains(text, w) {
					t.Errorf("finding lacks %q:\n%s", w, text)
				}
			}
		})
	}
}
