package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/handshake"
)

func TestRunUsage(t *testing.T) {
	for _, args := range [][]string{{"--no-such-flag"}, {"extra"}, {"--timeout", "0s"}, {"--repo", t.TempDir()}} {
		var out, errs bytes.Buffer
		if code := run(context.Background(), args, &out, &errs); code != exitUsage {
			t.Errorf("run %q = %d, want %d (stderr %q)", args, code, exitUsage, errs.String())
		}
		if errs.Len() == 0 {
			t.Errorf("run %q printed no reason", args)
		}
		if out.Len() != 0 {
			t.Errorf("run %q started: %q", args, out.String())
		}
	}
}

func TestRunHelp(t *testing.T) {
	var out, errs bytes.Buffer
	if code := run(context.Background(), []string{"--help"}, &out, &errs); code != exitOK {
		t.Errorf("run --help = %d, want 0", code)
	}
	if !strings.Contains(errs.String(), "-keep") {
		t.Errorf("--help printed %q, want the flags", errs.String())
	}
}

func TestFindRepo(t *testing.T) {
	root, err := findRepo("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "examples", "quickstart", "main.go")); err != nil {
		t.Errorf("findRepo(../..) = %s: %v", root, err)
	}
	// From here (the quickstart's own module, whose go.mod is not the SDK's) it walks up.
	got, err := findRepo("")
	if err != nil || got != root {
		t.Errorf("findRepo(\"\") = %q, %v; want %q", got, err, root)
	}
	if _, err := findRepo("."); err == nil || !strings.Contains(err.Error(), "no go.mod of module github.com/hamireg/hamireg") {
		t.Errorf("findRepo(.) = %v, want the module error", err)
	}
	if got := firstModuleLine([]byte("// c\nmodule \"github.com/hamireg/hamireg\"\n\ngo 1.26\n")); got != modulePath {
		t.Errorf("firstModuleLine = %q", got)
	}
}

func TestExplain(t *testing.T) {
	err := fmt.Errorf("start the kubelet's device manager: %w: clone(CLONE_NEWNS) refused", kubeletpeer.ErrNamespace)
	got := explain(err)
	for _, want := range []string{err.Error(), "sudo -E", "unprivileged_userns_clone", "--privileged", "cd cmd/kubectl-hami_doctor && go run . explain"} {
		if !strings.Contains(got, want) {
			t.Errorf("explain(namespace) has no %q:\n%s", want, got)
		}
	}
	if got := explain(envtest.ErrBinariesMissing); !strings.Contains(got, "make quickstart") {
		t.Errorf("explain(binaries) = %q, want the command", got)
	}
	if got := explain(fmt.Errorf("other")); got != "other" {
		t.Errorf("explain(other) = %q", got)
	}
}

func TestChannelStates(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.Local)
	devs := make([]annotation.Device, simulatedGPUs)
	for i := range devs {
		devs[i] = annotation.Device{ID: fmt.Sprintf("GPU-%d", i), Index: uint(i), Count: 10, Devmem: 40960, Devcore: 100, Type: "NVIDIA-A100", Mode: "hami-core", Health: true}
	}
	node := func(register, hs string, gpus int64) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{}}}
		if register != "" {
			n.Annotations[annotation.KeyNVIDIARegister] = register
		}
		if hs != "" {
			n.Annotations[annotation.KeyNVIDIAHandshake] = hs
		}
		n.Status.Allocatable = corev1.ResourceList{annotation.ResourceNVIDIAGPU: *resource.NewQuantity(gpus, resource.DecimalSI)}
		return n
	}
	fresh := handshake.Requesting(now.Add(-time.Second), time.Local)
	scored := func(n *corev1.Node, value string) *corev1.Node {
		n.Annotations[annotation.KeyNVIDIAScore] = value
		return n
	}
	for _, tc := range []struct {
		name   string
		n      *corev1.Node
		scores bool // the device plugin publishes topology scores
		want   [3]bool
	}{
		{"healthy", node(annotation.Encode(devs), fresh, 80), false, [3]bool{true, true, true}},
		{"no annotation", node("", fresh, 80), false, [3]bool{false, false, true}},
		{"malformed", node("[{", fresh, 80), false, [3]bool{false, false, true}},
		{"seven GPUs", node(annotation.Encode(devs[:7]), fresh, 70), false, [3]bool{false, true, true}},
		// The handshake as HAMi's health check reads it: fresh counts before the device count,
		// an expired one while allocatable is present ("skipping NodeCleanUp").
		{"count not yet", node(annotation.Encode(devs), fresh, 0), false, [3]bool{true, false, true}},
		{"count short", node(annotation.Encode(devs), fresh, 70), false, [3]bool{true, false, true}},
		{"no handshake", node(annotation.Encode(devs), "", 80), false, [3]bool{true, true, false}},
		{"stale handshake", node(annotation.Encode(devs), handshake.Requesting(now.Add(-time.Hour), time.Local), 80), false, [3]bool{true, true, true}},
		{"stale handshake, no count", node(annotation.Encode(devs), handshake.Requesting(now.Add(-time.Hour), time.Local), 0), false, [3]bool{true, false, false}},
		{"deleted handshake", node(annotation.Encode(devs), "Deleted_2026-12-01 11:00:00", 80), false, [3]bool{true, true, false}},
		// With scores published, the spec channel wants them too (they come in the same patch).
		{"scores", scored(node(annotation.Encode(devs), fresh, 80), annotation.EncodePairScores(scoresOf(devs))), true, [3]bool{true, true, true}},
		{"scores missing", node(annotation.Encode(devs), fresh, 80), true, [3]bool{false, true, true}},
		// HAMi's scheduler drops a node whose score annotation does not decode (annotation.Check).
		{"scores malformed", scored(node(annotation.Encode(devs), fresh, 80), "[{"), true, [3]bool{false, false, true}},
		{"scores of other GPUs", scored(node(annotation.Encode(devs), fresh, 80), `[{"uuid":"GPU-x","score":{}}]`), true, [3]bool{false, true, true}},
		{"scores not wanted", node(annotation.Encode(devs), fresh, 80), false, [3]bool{true, true, true}},
	} {
		got := channelStates(tc.n, now, tc.scores)
		for i, c := range got {
			if c.healthy != tc.want[i] {
				t.Errorf("%s: %s healthy = %v, want %v (%s)", tc.name, c.name, c.healthy, tc.want[i], c.detail)
			}
			if c.detail == "" {
				t.Errorf("%s: %s has no detail", tc.name, c.name)
			}
		}
	}
}
