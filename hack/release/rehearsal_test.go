package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoRoot is the repository this module lives in.
const repoRoot = "../.."

// TestRehearsal releases the committed tree at a rehearsal version into a GOPROXY=file://
// folder, then does what a user outside the repository does, with that proxy first in
// GOPROXY and no workspace:
//
//   - check: every released module is fetched, built, and installed where it is a program,
//     exactly as "go run ./hack/release check" does before tags are pushed;
//   - consumer: a scratch module gets the SDK and envtest, runs the README's "Testing your
//     component" as written, installs the doctor under its kubectl name and runs the
//     replaces command.
//
// It fails if any step needs something that exists only inside the tree (a replace, a
// sibling folder, a file git does not track).
func TestRehearsal(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every module from a module proxy (minutes)")
	}
	base, version := rehearsalVersion(t)
	tmp := t.TempDir()
	proxy := filepath.Join(tmp, "proxy")
	r, err := Prepare(repoRoot, version, proxy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { forgetVersion(t, version) })
	t.Logf("released %d modules at %s (the tree requires %s) into %s", len(r.Modules), version, base, proxy)
	bin := filepath.Join(tmp, "bin")
	env := ConsumerEnv(proxy, bin)
	log := testWriter{t}

	t.Run("check", func(t *testing.T) {
		for _, m := range r.Modules {
			if err := CheckModule(t.Context(), env, filepath.Join(tmp, "check-"+strings.ReplaceAll(m.Dir, "/", "-")), m, version, log); err != nil {
				t.Error(err)
				continue
			}
			t.Logf("ok %s@%s (tag %s)", m.Path, version, m.Tag(base))
		}
	})

	t.Run("consumer", func(t *testing.T) {
		dir := filepath.Join(tmp, "consumer")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		src, err := readmeTest(filepath.Join(repoRoot, "README.md"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "agent_test.go"), src, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, step := range [][]string{
			{"mod", "init", "example.com/consumer"},
			{"get", sdkPath + "@" + version, sdkPath + "/envtest@" + version},
			{"mod", "tidy"},
			{"test", "-count=1", "./..."},
			{"install", sdkPath + "/cmd/kubectl-hami_doctor@" + version},
		} {
			if err := Go(t.Context(), env, dir, log, step...); err != nil {
				t.Fatal(err)
			}
		}
		gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(gomod, []byte("replace")) {
			t.Errorf("the consumer's go.mod needs replace directives:\n%s", gomod)
		}
		if bytes.Contains(gomod, []byte("k8s.io/kubernetes")) {
			t.Errorf("getting the SDK and envtest pulled in k8s.io/kubernetes (only envtest/kubeletpeer may):\n%s", gomod)
		}

		out, err := exec.CommandContext(t.Context(), filepath.Join(bin, "kubectl-hami_doctor"), "version").CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl-hami_doctor version: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), version) {
			t.Errorf("kubectl-hami_doctor version does not name %s:\n%s", version, out)
		}

		var block strings.Builder
		cmd := exec.CommandContext(t.Context(), "go", "run", sdkPath+"/envtest/cmd/replaces@"+version)
		cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, &block, log
		if err := cmd.Run(); err != nil {
			t.Fatalf("go run replaces@%s: %v", version, err)
		}
		if !regexp.MustCompile(`(?m)^\s*k8s\.io/api => k8s\.io/api v0\.\d+\.\d+$`).MatchString(block.String()) {
			t.Errorf("the replaces command printed no replace of k8s.io/api:\n%s", block.String())
		}
	})
}

// rehearsalVersion returns the version the tree's go.mod files require and a prerelease of
// it named after the tree's content ("v0.1.0-rehearsal.0123abcd4567"): a changed tree gets
// another version, so the module cache never serves a stale rehearsal.
func rehearsalVersion(t *testing.T) (base, version string) {
	t.Helper()
	mods, err := Modules(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	if base, err = RequiredVersion(repoRoot, mods); err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	for _, args := range [][]string{{"ls-files", "-s"}, {"diff", "HEAD"}} {
		out, err := exec.Command("git", append([]string{"-C", repoRoot}, args...)...).Output()
		if err != nil {
			t.Fatalf("git %v: %v", args, err)
		}
		h.Write(out)
	}
	return base, base + "-rehearsal." + hex.EncodeToString(h.Sum(nil))[:12]
}

// forgetVersion removes the rehearsal version's modules from the module cache, so that
// rehearsals do not pile up there.
func forgetVersion(t *testing.T, version string) {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Logf("go env GOMODCACHE: %v", err)
		return
	}
	cache := strings.TrimSpace(string(out))
	top := filepath.Join(cache, "github.com", "hamireg")
	dl := filepath.Join(cache, "cache", "download", "github.com", "hamireg")
	var doomed []string
	for _, base := range []string{top, dl} {
		_ = filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil //nolint:nilerr // nothing there to remove
			}
			if strings.Contains(d.Name(), version) {
				doomed = append(doomed, p)
				if d.IsDir() {
					return filepath.SkipDir
				}
			}
			return nil
		})
	}
	for _, p := range doomed {
		_ = filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				_ = os.Chmod(q, 0o755) //nolint:gosec // to remove it
			}
			return nil
		})
		if err := os.RemoveAll(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Logf("remove %s: %v", p, err)
		}
	}
}

// readmeTest returns the README's first Go block under "## Testing your component" as a
// _test.go file of package consumer_test: its leading import lines become the import block.
func readmeTest(readme string) ([]byte, error) {
	data, err := os.ReadFile(readme)
	if err != nil {
		return nil, err
	}
	text := string(data)
	i := strings.Index(text, "\n## Testing your component")
	if i < 0 {
		return nil, errors.New("README.md has no section \"## Testing your component\"")
	}
	text = text[i:]
	start := strings.Index(text, "\n```go\n")
	if start < 0 {
		return nil, errors.New("README.md's \"Testing your component\" has no ```go block")
	}
	text = text[start+len("\n```go\n"):]
	end := strings.Index(text, "\n```")
	if end < 0 {
		return nil, errors.New("README.md's Go block under \"Testing your component\" does not end")
	}
	var imports, code []string
	inImports := true
	for _, l := range strings.Split(text[:end], "\n") {
		if inImports && (strings.HasPrefix(l, "import ") || strings.TrimSpace(l) == "") {
			if p := strings.TrimPrefix(l, "import "); p != l {
				imports = append(imports, "\t"+p)
			}
			continue
		}
		inImports = false
		code = append(code, l)
	}
	var b bytes.Buffer
	b.WriteString("// Code from hamireg's README.md, \"Testing your component\".\n\npackage consumer_test\n\nimport (\n")
	b.WriteString(strings.Join(imports, "\n"))
	b.WriteString("\n)\n\n")
	b.WriteString(strings.Join(code, "\n"))
	b.WriteString("\n")
	return b.Bytes(), nil
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	if s := strings.TrimRight(string(p), "\n"); s != "" {
		w.t.Log(s)
	}
	return len(p), nil
}
