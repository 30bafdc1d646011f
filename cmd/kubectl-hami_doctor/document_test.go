package main

import (
	"encoding/json"
	"runtime/debug"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// TestDocumentSchema decodes what every cluster verb prints with -o json and -o yaml as a
// script would: apiVersion and kind first, the case a string code.
func TestDocumentSchema(t *testing.T) {
	t.Parallel()
	kc := kubeconfig(t)
	tests := map[string]struct {
		args []string
		kind string
		// cases are the paths to the case codes: "" the document's, "items" each item's.
		cases []string
	}{
		"node":  {args: []string{"node", "gpu-7"}, kind: "NodeReport", cases: []string{""}},
		"nodes": {args: []string{"nodes"}, kind: "NodeReportList", cases: []string{"items"}},
		"pod":   {args: []string{"pod", "team-b/train"}, kind: "PodReport", cases: []string{""}},
		"pods":  {args: []string{"pods", "-A"}, kind: "PodReportList", cases: []string{"items"}},
	}
	for name, tc := range tests {
		for _, format := range []string{"json", "yaml"} {
			t.Run(name+"/"+format, func(t *testing.T) {
				t.Parallel()
				h := newHarness(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-7", Labels: map[string]string{"gpu": "on"},
					Annotations: map[string]string{"hami.io/node-nvidia-register": `[{"id":"GPU-a","count":10,"health":true}]`}}},
					gpuPod("team-b", "train"))
				out, errOut, code := h.run(t, append(tc.args, "--kubeconfig", kc, "-o", format)...)
				if code == exitError {
					t.Fatalf("exit %d: %s", code, errOut)
				}
				if format == "json" && !strings.HasPrefix(out, "{\n  \"apiVersion\": \"doctor.hamireg.io/v1alpha1\",\n  \"kind\": \""+tc.kind+"\",\n") {
					t.Errorf("JSON does not start with apiVersion and kind:\n%s", out)
				}
				var doc map[string]any
				if err := yaml.Unmarshal([]byte(out), &doc); err != nil {
					t.Fatal(err)
				}
				if doc["apiVersion"] != "doctor.hamireg.io/v1alpha1" || doc["kind"] != tc.kind {
					t.Errorf("apiVersion %v kind %v, want doctor.hamireg.io/v1alpha1 %s", doc["apiVersion"], doc["kind"], tc.kind)
				}
				objs := []any{doc}
				if tc.cases[0] == "items" {
					items, ok := doc["items"].([]any)
					if !ok || len(items) == 0 {
						t.Fatalf("items %v", doc["items"])
					}
					objs = items
				}
				for _, o := range objs {
					m, _ := o.(map[string]any)
					checkCase(t, m["case"])
					findings, _ := m["findings"].([]any)
					if len(findings) == 0 {
						t.Errorf("no findings in %v", m)
					}
					for _, f := range findings {
						fm, _ := f.(map[string]any)
						checkCase(t, fm["case"])
					}
				}
			})
		}
	}
}

// checkCase asserts a case is a string code: "Healthy", "N1-…" or "P3-…".
func checkCase(t *testing.T, v any) {
	t.Helper()
	s, ok := v.(string)
	if !ok {
		t.Errorf("case %v (%T), want a string", v, v)
		return
	}
	if s != "Healthy" && (len(s) < 4 || (s[0] != 'N' && s[0] != 'P') || s[2] != '-') {
		t.Errorf("case %q, want Healthy, N<n>-Name or P<n>-Name", s)
	}
}

func TestDocumentMarshal(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(document{kindUnlockResult, unlockResult{DryRun: true}})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"apiVersion":"doctor.hamireg.io/v1alpha1","kind":"UnlockResult","removed":false,"dryRun":true}`; string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}
	b, err = json.Marshal(document{kindVersion, struct{}{}})
	if err != nil || string(b) != `{"apiVersion":"doctor.hamireg.io/v1alpha1","kind":"Version"}` {
		t.Errorf("empty body: %s %v", b, err)
	}
	if _, err := json.Marshal(document{kindVersion, []int{1}}); err == nil {
		t.Error("a body that is not an object encoded")
	}
	b, err = json.Marshal(list[int](kindNodeReportList, nil))
	if err != nil || string(b) != `{"apiVersion":"doctor.hamireg.io/v1alpha1","kind":"NodeReportList","items":[]}` {
		t.Errorf("empty list: %s %v", b, err)
	}
}

func TestHelpOnStdout(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}, {"version", "-h"}, {"explain", "--help"}, {"nodes", "-h"}} {
		out, errOut, code := newHarness().run(t, args...)
		if code != exitHealthy || errOut != "" || !strings.Contains(out, "Usage:") {
			t.Errorf("%q: exit %d, stderr %q, stdout %q; want the usage on stdout and exit 0", args, code, errOut, out)
		}
	}
	out, errOut, code := newHarness().run(t)
	if code != exitError || out != "" || !strings.Contains(errOut, "Usage:") {
		t.Errorf("no verb: exit %d, stdout %q; want the usage on stderr and exit 2", code, out)
	}
	_, errOut, code = newHarness().run(t, "version", "--bogus")
	if code != exitError || !strings.Contains(errOut, "unknown flag: --bogus") {
		t.Errorf("version --bogus: exit %d, stderr %q", code, errOut)
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		bi   *debug.BuildInfo
		ok   bool
		want versionInfo
	}{
		"go install @v0.1.0": {
			bi: &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/hamireg/hamireg/cmd/kubectl-hami_doctor", Version: "v0.1.0"},
				Deps: []*debug.Module{{Path: "k8s.io/api", Version: "v0.37.2"}, {Path: sdkModule, Version: "v0.1.0"}}},
			ok:   true,
			want: versionInfo{Version: "v0.1.0", GoVersion: "go1.26.0", SDKVersion: "v0.1.0"},
		},
		"checkout with go.work": {
			bi: &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/hamireg/hamireg/cmd/kubectl-hami_doctor", Version: "(devel)"},
				Deps: []*debug.Module{{Path: sdkModule, Version: "v0.1.0", Replace: &debug.Module{Path: "../.."}}}},
			ok:   true,
			want: versionInfo{Version: "(devel)", GoVersion: "go1.26.0", SDKVersion: "(devel)", SDKReplace: "../.."},
		},
		"no build information": {ok: false, want: versionInfo{Version: "unknown", SDKVersion: "unknown"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got := buildVersion(tc.bi, tc.ok)
			tc.want.Platform = got.Platform
			if tc.want.GoVersion == "" {
				tc.want.GoVersion = got.GoVersion
			}
			if got != tc.want {
				t.Errorf("buildVersion = %+v, want %+v", got, tc.want)
			}
		})
	}

	h := newHarness()
	out, _, code := h.run(t, "version")
	if code != exitHealthy || !strings.HasPrefix(out, "doctor ") || !strings.Contains(out, "sdk: github.com/hamireg/hamireg ") {
		t.Errorf("version: exit %d\n%s", code, out)
	}
	out, _, code = h.run(t, "version", "-o", "json")
	var v struct {
		typeMeta
		versionInfo
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil || code != exitHealthy || v.APIVersion != apiVersion || v.Kind != "Version" || v.GoVersion == "" {
		t.Errorf("version -o json: exit %d %v %+v\n%s", code, err, v, out)
	}
}
