package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hamireg/hamireg/diagnose"
)

func TestNodeUsageErrors(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	tests := map[string]struct {
		args []string
		want string
	}{
		"no name":            {args: []string{"node"}, want: "no node name given"},
		"two names":          {args: []string{"node", "a", "b"}, want: "unexpected arguments"},
		"bad output":         {args: []string{"node", "a", "-o", "wide"}, want: `unknown output format "wide"`},
		"bad vendor":         {args: []string{"nodes", "--vendor", "Foo"}, want: `unknown vendor "Foo"`},
		"bad version":        {args: []string{"nodes", "--hami-version", "v1"}, want: "unknown --hami-version"},
		"missing kubeconfig": {args: []string{"node", "a", "--kubeconfig", missing}, want: "give --kubeconfig"},
		"unknown flag":       {args: []string{"nodes", "--bogus"}, want: "unknown flag: --bogus"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var out, errb bytes.Buffer
			if code := run(tc.args, strings.NewReader(""), &out, &errb); code != exitError {
				t.Errorf("exit %d, want %d", code, exitError)
			}
			if !strings.Contains(errb.String(), tc.want) {
				t.Errorf("stderr %q lacks %q", errb.String(), tc.want)
			}
		})
	}
}

func TestPrintReport(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-7", Labels: map[string]string{"gpu": "on"}}})
	r, err := diagnose.Node(t.Context(), client, "gpu-7", diagnose.Options{LogTail: -1})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	printReport(&out, r)
	for _, want := range []string{
		"Node gpu-7: case 1: device plugin not scheduled on the node",
		"plugin     broken",
		"DaemonSet not found, no Pod on the node",
		"hami.io/node-nvidia-register absent",
		"[error] case 1 DaemonSetNotFound",
		"fix:      kubectl get daemonsets -A -l app.kubernetes.io/component=hami-device-plugin",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	printNodes(&out, "doctor", []diagnose.Report{*r}, diagnose.Options{})
	if !strings.Contains(out.String(), "gpu-7") || !strings.Contains(out.String(), "case 1") || !strings.Contains(out.String(), "NODE") {
		t.Errorf("nodes output:\n%s", out.String())
	}
	out.Reset()
	printNodes(&out, "doctor", nil, diagnose.Options{})
	if !strings.Contains(out.String(), "kubectl label node <node> gpu=on") {
		t.Errorf("empty nodes output:\n%s", out.String())
	}
}
