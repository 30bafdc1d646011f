package doctor_test

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// doctorFlags are the doctor's flags for the options the tests pass to the library: HAMi's
// namespace, the scheduler name, the node label selector and the webhook.
func doctorFlags(opts diagnose.Options) []string {
	flags := []string{"--hami-namespace", opts.Namespace, "--scheduler-name", opts.SchedulerName}
	if len(opts.NodeLabelSelector) > 0 {
		var terms []string
		for _, k := range slices.Sorted(maps.Keys(opts.NodeLabelSelector)) {
			terms = append(terms, k+"="+opts.NodeLabelSelector[k])
		}
		flags = append(flags, "--node-label-selector", strings.Join(terms, ","))
	}
	if opts.Webhook != "" {
		flags = append(flags, "--webhook", opts.Webhook)
	}
	return flags
}

// doctorCLI runs the doctor's plugin binary (cmd/kubectl-hami_doctor, built once into cp.Dir()) with
// args and the flags of opts, as `kubectl hami-doctor` with kubeconfig ("" for the admin's).
func doctorCLI(t *testing.T, kubeconfig string, opts diagnose.Options, args ...string) harness.DoctorRun {
	t.Helper()
	if kubeconfig == "" {
		kubeconfig = cp.Kubeconfig()
	}
	bin := harness.BuildDoctor(t, cp.Dir())
	return harness.RunDoctor(t, bin, kubeconfig, append(args, doctorFlags(opts)...)...)
}

// wantCLIQuota checks the plugin's verbs on the pod stopped by its namespace's ResourceQuota
// (P3 with QuotaExceeded): `pod NS/NAME -o json`, `pod NAME -n NS` and `pods -n NS`, each
// exiting 1.
func wantCLIQuota(t *testing.T, opts diagnose.Options, ns, name string) {
	t.Helper()
	js := doctorCLI(t, "", opts, "pod", ns+"/"+name, "-o", "json")
	var raw struct {
		Case string `json:"case"`
	}
	var r diagnose.PodReport
	if err := json.Unmarshal([]byte(js.Stdout), &raw); err != nil {
		t.Fatalf("pod %s/%s -o json: not JSON: %v", ns, name, err)
	}
	if err := json.Unmarshal([]byte(js.Stdout), &r); err != nil {
		t.Fatalf("pod %s/%s -o json: not a pod report: %v", ns, name, err)
	}
	if js.Code != 1 || raw.Case != string(diagnose.P3NoNodeFits) || r.Namespace != ns || r.Name != name {
		t.Errorf("pod %s/%s -o json: exit %d, case %q, pod %s/%s; want exit 1 and %q", ns, name, js.Code, raw.Case, r.Namespace, r.Name, string(diagnose.P3NoNodeFits))
	}
	if _, ok := r.Finding(diagnose.CodeQuotaExceeded); !ok {
		t.Errorf("pod %s/%s -o json: no finding %s: %+v", ns, name, diagnose.CodeQuotaExceeded, r.Findings)
	}

	text := doctorCLI(t, "", opts, "pod", name, "-n", ns)
	caseLine := ""
	for line := range strings.Lines(text.Stdout) {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "case" {
			caseLine = line
		}
	}
	if text.Code != 1 || !strings.HasPrefix(text.Stdout, "Pod "+ns+"/"+name+": "+string(diagnose.P3NoNodeFits)) ||
		!strings.Contains(caseLine, string(diagnose.P3NoNodeFits)+": ") {
		t.Errorf("pod %s -n %s: exit %d, case line %q; want exit 1 and the case %s", name, ns, text.Code, caseLine, string(diagnose.P3NoNodeFits))
	}

	list := doctorCLI(t, "", opts, "pods", "-n", ns)
	podLine := ""
	for line := range strings.Lines(list.Stdout) {
		if f := strings.Fields(line); len(f) > 1 && f[0] == ns && f[1] == name {
			podLine = line
		}
	}
	if list.Code != 1 || !strings.Contains(podLine, string(diagnose.P3NoNodeFits)) {
		t.Errorf("pods -n %s: exit %d, line of %s %q; want exit 1 and %s", ns, list.Code, name, podLine, string(diagnose.P3NoNodeFits))
	}
}
