package main

import (
	"bytes"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
)

// sdkPath is the root module's path; every module of the repository is it or below it.
const sdkPath = "github.com/hamireg/hamireg"

// ErrNotReleasable is wrapped when the tree cannot be released at a version: a version that
// is not canonical semver, or nested modules that disagree on which version of the SDK's
// modules they require.
var ErrNotReleasable = errors.New("tree not releasable")

// devOnly are the folders of modules that are developed here but never released: the tests
// against real peers and the tools under hack/ (this one included).
var devOnly = []string{"test/", "hack/"}

// Module is one module of the repository.
type Module struct {
	// Dir is its folder relative to the repository root, "." for the root module.
	Dir string
	// Path is its module path.
	Path string
	// Requires are the SDK modules its go.mod requires, by path.
	Requires []string
	// Kubernetes is set when its build needs k8s.io/kubernetes (directly or through an SDK
	// module it requires), so that a consumer's go.mod needs the replace block of
	// envtest/cmd/replaces.
	Kubernetes bool
	// Replaces is set when its go.mod has replace directives ("go install M@V" refuses it).
	Replaces bool
	// Programs are its main packages, relative to Dir ("." for the module's root).
	Programs []string
	// files are its tracked files, slash paths relative to Dir.
	files []string
}

// Tag is the git tag of the module at version v: "v0.1.0" for the root, "envtest/v0.1.0"
// for envtest.
func (m Module) Tag(v string) string {
	if m.Dir == "." {
		return v
	}
	return m.Dir + "/" + v
}

// Modules returns the released modules of the repository at root, in an order in which every
// module comes after the SDK modules it requires. A module's files are the files git tracks
// in its folder, minus those of modules nested in it and the workspace files.
func Modules(root string) ([]Module, error) {
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		return nil, fmt.Errorf("list the files of %s: %w", root, err)
	}
	var tracked []string
	for f := range strings.SplitSeq(string(out), "\x00") {
		if f != "" {
			tracked = append(tracked, f)
		}
	}
	var dirs []string
	for _, f := range tracked {
		if path.Base(f) == "go.mod" {
			dirs = append(dirs, path.Dir(f))
		}
	}
	// owner returns the module folder a file belongs to: the longest folder that holds it.
	owner := func(f string) string {
		best := "."
		for _, d := range dirs {
			if d != "." && strings.HasPrefix(f, d+"/") && len(d) > len(best) {
				best = d
			}
		}
		return best
	}
	byDir := map[string]*Module{}
	for _, d := range dirs {
		if slices.ContainsFunc(devOnly, func(p string) bool { return strings.HasPrefix(d+"/", p) }) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(d), "go.mod"))
		if err != nil {
			return nil, fmt.Errorf("read the go.mod of %s: %w", d, err)
		}
		mf, err := modfile.Parse(d+"/go.mod", data, nil)
		if err != nil {
			return nil, fmt.Errorf("parse the go.mod of %s: %w", d, err)
		}
		if mf.Module == nil {
			return nil, fmt.Errorf("go.mod of %s has no module line: %w", d, ErrNotReleasable)
		}
		m := &Module{Dir: d, Path: mf.Module.Mod.Path, Replaces: len(mf.Replace) > 0}
		if want := path.Join(sdkPath, d); d != "." && m.Path != want || d == "." && m.Path != sdkPath {
			return nil, fmt.Errorf("module in %s is %s, want %s (the tag %s would not name it): %w", d, m.Path, path.Join(sdkPath, d), m.Tag("vX.Y.Z"), ErrNotReleasable)
		}
		for _, r := range mf.Require {
			switch {
			case isSDK(r.Mod.Path):
				m.Requires = append(m.Requires, r.Mod.Path)
			case r.Mod.Path == "k8s.io/kubernetes":
				m.Kubernetes = true
			}
		}
		byDir[d] = m
	}
	for _, f := range tracked {
		m, ok := byDir[owner(f)]
		if !ok {
			continue
		}
		rel := f
		if m.Dir != "." {
			rel = strings.TrimPrefix(f, m.Dir+"/")
		}
		if rel == "go.work" || rel == "go.work.sum" {
			continue
		}
		if _, err := os.Lstat(filepath.Join(root, filepath.FromSlash(f))); errors.Is(err, os.ErrNotExist) {
			continue // deleted in the work tree, not yet in the index
		}
		m.files = append(m.files, rel)
		if strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go") && !slices.Contains(m.Programs, path.Dir(rel)) {
			pf, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, filepath.FromSlash(f)), nil, parser.PackageClauseOnly)
			if err == nil && pf.Name.Name == "main" {
				m.Programs = append(m.Programs, path.Dir(rel))
			}
		}
	}
	// Dependency order; a module needs k8s.io/kubernetes if one it requires does.
	byPath := map[string]*Module{}
	for _, m := range byDir {
		byPath[m.Path] = m
	}
	var ordered []Module
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(m *Module) error
	visit = func(m *Module) error {
		switch state[m.Path] {
		case 1:
			return fmt.Errorf("modules %s: require cycle: %w", m.Path, ErrNotReleasable)
		case 2:
			return nil
		}
		state[m.Path] = 1
		for _, r := range m.Requires {
			dep, ok := byPath[r]
			if !ok {
				return fmt.Errorf("%s requires %s, which is not a released module of this repository: %w", m.Path, r, ErrNotReleasable)
			}
			if err := visit(dep); err != nil {
				return err
			}
			m.Kubernetes = m.Kubernetes || dep.Kubernetes
		}
		state[m.Path] = 2
		ordered = append(ordered, *m)
		return nil
	}
	keys := make([]string, 0, len(byDir))
	for d := range byDir {
		keys = append(keys, d)
	}
	slices.Sort(keys)
	for _, d := range keys {
		if err := visit(byDir[d]); err != nil {
			return nil, err
		}
	}
	return ordered, nil
}

func isSDK(p string) bool { return p == sdkPath || strings.HasPrefix(p, sdkPath+"/") }

// RequiredVersion returns the one version at which the nested modules require the SDK's
// modules (the release they ship with), or an error naming the modules that disagree.
func RequiredVersion(root string, mods []Module) (string, error) {
	seen := map[string][]string{}
	for _, m := range mods {
		mf, err := readModFile(root, m)
		if err != nil {
			return "", err
		}
		for _, r := range mf.Require {
			if isSDK(r.Mod.Path) {
				seen[r.Mod.Version] = append(seen[r.Mod.Version], m.Dir+" requires "+r.Mod.Path+"@"+r.Mod.Version)
			}
		}
	}
	if len(seen) != 1 {
		var all []string
		for _, s := range seen {
			all = append(all, s...)
		}
		slices.Sort(all)
		return "", fmt.Errorf("the SDK's modules must be required at one version, found %d: %s: %w", len(seen), strings.Join(all, "; "), ErrNotReleasable)
	}
	var v string
	for k := range seen {
		v = k
	}
	if err := checkVersion(v); err != nil {
		return "", fmt.Errorf("the SDK's modules are required at %s, which cannot be a release: %w", v, err)
	}
	return v, nil
}

func readModFile(root string, m Module) (*modfile.File, error) {
	name := filepath.Join(root, filepath.FromSlash(m.Dir), "go.mod")
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	mf, err := modfile.Parse(name, data, nil)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", name, err)
	}
	return mf, nil
}

// versionedModFile returns m's go.mod with every SDK module required at version v.
func versionedModFile(root string, m Module, v string) ([]byte, error) {
	mf, err := readModFile(root, m)
	if err != nil {
		return nil, err
	}
	for _, r := range mf.Require {
		if isSDK(r.Mod.Path) {
			if err := mf.AddRequire(r.Mod.Path, v); err != nil {
				return nil, fmt.Errorf("require %s@%s in %s: %w", r.Mod.Path, v, m.Dir, err)
			}
		}
	}
	mf.Cleanup()
	return mf.Format()
}

// checkVersion refuses a version that cannot be a tag.
func checkVersion(v string) error {
	if !semver.IsValid(v) || semver.Canonical(v) != v || semver.Build(v) != "" {
		return fmt.Errorf("version %q is not a canonical semantic version such as v0.1.0: %w", v, ErrNotReleasable)
	}
	if err := module.Check(sdkPath, v); err != nil {
		return fmt.Errorf("version %q: %w: %w", v, err, ErrNotReleasable)
	}
	return nil
}

// withSums returns the go.sum text sum with the lines of sums (module -> its two lines)
// for every SDK module in reqs, replacing older lines of those modules at any version.
func withSums(sum []byte, lines map[string][]string, reqs []string) []byte {
	var kept []string
	for l := range strings.SplitSeq(string(sum), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || len(f) >= 1 && slices.Contains(reqs, f[0]) {
			continue
		}
		kept = append(kept, l)
	}
	for _, r := range reqs {
		kept = append(kept, lines[r]...)
	}
	slices.Sort(kept)
	var b bytes.Buffer
	for _, l := range kept {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// closure returns the SDK modules m needs, directly or through others, in mods' order.
func closure(m Module, mods []Module) []string {
	need := map[string]bool{}
	var add func(p string)
	add = func(p string) {
		if need[p] {
			return
		}
		need[p] = true
		for _, o := range mods {
			if o.Path == p {
				for _, r := range o.Requires {
					add(r)
				}
			}
		}
	}
	for _, r := range m.Requires {
		add(r)
	}
	var out []string
	for _, o := range mods {
		if need[o.Path] {
			out = append(out, o.Path)
		}
	}
	return out
}
