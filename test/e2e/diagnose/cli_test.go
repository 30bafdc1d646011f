package diagnose_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// buildDoctor builds cmd/kubectl-hami_doctor once per test binary (harness.BuildDoctor).
func buildDoctor(t *testing.T) string {
	t.Helper()
	return harness.BuildDoctor(t, cp.Dir())
}

// doctor runs the built CLI against the control plane with the scenario's namespace.
func (h *hami) doctor(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	bin := buildDoctor(t)
	h.renewLease(t)
	r := harness.RunDoctor(t, bin, cp.Kubeconfig(), append(args, "--hami-namespace", h.ns)...)
	return r.Stdout, r.Stderr, r.Code
}

// TestDiagnoseDoctorCLI runs the doctor command line (cmd/kubectl-hami_doctor) against the API server:
// text and JSON output, and its exit statuses (0 healthy, 1 a case applies, 2 errors).
func TestDiagnoseDoctorCLI(t *testing.T) {
	t.Parallel()
	buildDoctor(t) // before the scenario's objects, so the Lease stays fresh
	h := installHAMi(t, install{})
	prefix := harness.UniqueName("cli")
	healthy := gpuNode(prefix+"-ok", h.now)
	unlabelled := gpuNode(prefix+"-nolabel", h.now)
	delete(unlabelled.Labels, gpuLabel)
	withoutPlugin(unlabelled)
	unlabelled.Annotations[annotation.KeyNVIDIARegister] = annotation.Encode(h100s()) // stale: what makes it a GPU node
	createNode(t, healthy)
	createNode(t, unlabelled)
	h.addPluginPod(t, healthy.Name, running)

	t.Run("node healthy", func(t *testing.T) {
		out, _, code := h.doctor(t, "node", healthy.Name)
		if code != 0 {
			t.Errorf("exit %d, want 0", code)
		}
		for _, want := range []string{
			"Node " + healthy.Name + ": healthy",
			"nvidia.com/gpu 80 allocatable, 8 healthy device(s) in hami.io/node-nvidia-register",
			"annotation: 8 GPU(s) × split 10 = 80",
			"leader Pod " + h.schedulerPod,
			"[info] case 5 FollowerLogsNothing",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q", want)
			}
		}
	})
	t.Run("node case 1", func(t *testing.T) {
		out, _, code := h.doctor(t, "node", unlabelled.Name)
		if code != 1 {
			t.Errorf("exit %d, want 1", code)
		}
		for _, want := range []string{
			"Node " + unlabelled.Name + ": case 1: device plugin not scheduled on the node",
			"[error] case 1 NodeSelectorMismatch",
			"fix:      kubectl label node " + unlabelled.Name + " gpu=on",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q", want)
			}
		}
	})
	t.Run("node JSON", func(t *testing.T) {
		out, _, code := h.doctor(t, "node", unlabelled.Name, "-o", "json")
		var r struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			diagnose.Report
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("output is not a report: %v", err)
		}
		if r.APIVersion != "doctor.hamireg.io/v1alpha1" || r.Kind != "NodeReport" {
			t.Errorf("apiVersion %q kind %q, want doctor.hamireg.io/v1alpha1 NodeReport", r.APIVersion, r.Kind)
		}
		if code != 1 || r.Case != diagnose.CasePluginNotScheduled || r.Node != unlabelled.Name {
			t.Errorf("exit %d, node %s, case %q", code, r.Node, r.Case)
		}
		if f, ok := r.Finding(diagnose.CodeNodeSelectorMismatch); !ok || len(f.Fix) == 0 || f.Fix[0] != "kubectl label node "+unlabelled.Name+" gpu=on" {
			t.Errorf("finding %+v", f)
		}
	})
	t.Run("nodes", func(t *testing.T) {
		out, _, code := h.doctor(t, "nodes")
		if code != 1 {
			t.Errorf("exit %d, want 1 (a case applies to one node)", code)
		}
		lines := map[string]string{}
		for line := range strings.Lines(out) {
			if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], prefix) {
				lines[f[0]] = line
			}
		}
		if l := lines[healthy.Name]; !strings.Contains(l, "ok  ") || !strings.Contains(l, "healthy") {
			t.Errorf("line of %s: %q", healthy.Name, l)
		}
		if l := lines[unlabelled.Name]; !strings.Contains(l, "case 1") || !strings.Contains(l, "lacks the label gpu=on") {
			t.Errorf("line of %s: %q", unlabelled.Name, l)
		}
	})
	t.Run("nodes JSON", func(t *testing.T) {
		out, _, _ := h.doctor(t, "nodes", "-o", "json")
		var list struct {
			Kind  string            `json:"kind"`
			Items []diagnose.Report `json:"items"`
		}
		if err := json.Unmarshal([]byte(out), &list); err != nil || list.Kind != "NodeReportList" {
			t.Fatalf("output is not a NodeReportList (kind %q): %v", list.Kind, err)
		}
		got := map[string]diagnose.Case{}
		for _, r := range list.Items {
			if strings.HasPrefix(r.Node, prefix) {
				got[r.Node] = r.Case
			}
		}
		if len(got) != 2 || got[healthy.Name] != diagnose.Healthy || got[unlabelled.Name] != diagnose.CasePluginNotScheduled {
			t.Errorf("cases %v", got)
		}
	})
	t.Run("unknown node", func(t *testing.T) {
		_, errOut, code := h.doctor(t, "node", prefix+"-missing")
		if code != 2 || !strings.Contains(errOut, "node not found") {
			t.Errorf("exit %d, stderr %q", code, errOut)
		}
	})
}
