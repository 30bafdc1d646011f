package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/mod/modfile"
)

// replaceLines returns the k8s.io replace directives of a go.mod as "old => new version".
func replaceLines(t *testing.T, data []byte) []string {
	t.Helper()
	f, err := modfile.Parse("go.mod", data, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range f.Replace {
		if strings.HasPrefix(r.Old.Path, "k8s.io/") {
			got = append(got, r.Old.String()+" => "+r.New.String())
		}
	}
	return got
}

// The embedded block is kubeletpeer's: regen.sh writes both, this keeps them together.
// envtest's go.mod has none (envtest does not require k8s.io/kubernetes).
func TestBlockIsKubeletpeersReplaceBlock(t *testing.T) {
	t.Parallel()
	kubeletpeer, err := os.ReadFile(filepath.Join("..", "..", "kubeletpeer", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(kubeletpeer, []byte(block)) {
		t.Errorf("envtest/kubeletpeer/go.mod does not contain block.txt verbatim; run hack/k8sbins/regen.sh")
	}
	want := replaceLines(t, kubeletpeer)
	got := replaceLines(t, []byte("module block\n\n"+block))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("block.txt vs envtest/kubeletpeer/go.mod k8s.io replaces (-kubeletpeer +block):\n%s", diff)
	}
	if len(got) < 20 {
		t.Errorf("block has %d replace lines, want the whole staging list", len(got))
	}
	envtest, err := os.ReadFile(filepath.Join("..", "..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if r := replaceLines(t, envtest); len(r) != 0 {
		t.Errorf("envtest/go.mod has k8s.io replaces %v; its users must need none", r)
	}
}

func TestApply(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"no replaces": "module example.com/consumer\n\ngo 1.26.0\n\nrequire k8s.io/api v0.37.2\n",
		"old block and single lines": "module example.com/consumer\n\ngo 1.26.0\n\n" +
			"replace example.com/other => ../other\n\n" +
			"replace k8s.io/api => k8s.io/api v0.30.0\n\n" +
			"// Staging modules that k8s.io/kubernetes@v1.30.0 requires at v0.0.0 (written by regen.sh).\n" +
			"replace (\n\tk8s.io/client-go => k8s.io/client-go v0.30.0\n\tk8s.io/kubelet v0.0.0 => k8s.io/kubelet v0.30.0\n)\n",
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out, n, err := apply("go.mod", []byte(in))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(string(out), "\n\n"+block) {
				t.Errorf("output does not end with the block:\n%s", out)
			}
			if got := replaceLines(t, out); len(got) != n {
				t.Errorf("%d k8s.io replace lines, want only the block's %d:\n%s", len(got), n, out)
			}
			if strings.Contains(string(out), "v0.30.0") {
				t.Errorf("old replace lines left:\n%s", out)
			}
			if strings.Contains(in, "example.com/other") && !strings.Contains(string(out), "replace example.com/other => ../other") {
				t.Errorf("unrelated replace dropped:\n%s", out)
			}
			again, _, err := apply("go.mod", out)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(string(out), string(again)); diff != "" {
				t.Errorf("second run changed the file (-first +second):\n%s", diff)
			}
		})
	}
}

func TestRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "go.mod")
	if err := os.WriteFile(path, []byte("module example.com/consumer\n\ngo 1.26.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run(nil, &stdout, &stderr); code != 0 || stdout.String() != block {
		t.Errorf("run() = %d, stdout %q, stderr %q; want 0 and the block", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	if code := run([]string{"-w", "-modfile", path}, &stdout, &stderr); code != 0 {
		t.Fatalf("run -w = %d, stderr %q", code, stderr.String())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(b), block) || stdout.Len() != 0 {
		t.Errorf("go.mod after -w:\n%s\nstdout %q", b, stdout.String())
	}
	if code := run([]string{"extra"}, &stdout, &stderr); code != 2 {
		t.Errorf("run(extra) = %d, want 2", code)
	}
	stderr.Reset()
	if code := run([]string{"-h"}, &stdout, &stderr); code != 0 || !strings.Contains(stderr.String(), "envtest/kubeletpeer") {
		t.Errorf("run(-h) = %d, stderr %q; want 0 and a usage that names kubeletpeer", code, stderr.String())
	}
}
