package main

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestModulesOfThisRepository(t *testing.T) {
	t.Parallel()
	mods, err := Modules(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, m := range mods {
		pos[m.Path] = i
		if strings.HasPrefix(m.Dir, "test/") || strings.HasPrefix(m.Dir, "hack/") {
			t.Errorf("%s is development-only and must not be released", m.Dir)
		}
		if slices.Contains(m.files, "go.work") {
			t.Errorf("%s: its zip would carry go.work", m.Dir)
		}
	}
	if mods[0].Path != sdkPath || mods[0].Tag("v1.2.3") != "v1.2.3" {
		t.Errorf("first module %s (tag %s), want the root module, tagged v1.2.3", mods[0].Path, mods[0].Tag("v1.2.3"))
	}
	for _, m := range mods {
		for _, r := range m.Requires {
			if pos[r] >= pos[m.Path] {
				t.Errorf("%s comes before %s, which it requires", m.Path, r)
			}
		}
		if m.Dir != "." && m.Tag("v1.2.3") != m.Dir+"/v1.2.3" {
			t.Errorf("tag of %s = %s", m.Dir, m.Tag("v1.2.3"))
		}
		for _, f := range m.files {
			for _, o := range mods {
				if o.Dir != m.Dir && o.Dir != "." && strings.HasPrefix(m.Dir+"/"+f, o.Dir+"/") && len(o.Dir) > len(m.Dir) {
					t.Errorf("%s's zip would carry %s, a file of module %s", m.Dir, f, o.Dir)
				}
			}
		}
	}
	// examples/scheduler (kube-scheduler with the plugin) is released like the quickstart:
	// its program needs k8s.io/kubernetes and so the consumer's replace block.
	i := slices.IndexFunc(mods, func(m Module) bool { return m.Dir == "examples/scheduler" })
	if i < 0 {
		t.Fatal("examples/scheduler is not released")
	}
	if s := mods[i]; !s.Kubernetes || !slices.Contains(s.Programs, ".") || !slices.Contains(s.Requires, sdkPath+"/schedplugin") {
		t.Errorf("examples/scheduler: Kubernetes %v, programs %v, requires %v; want k8s.io/kubernetes, the program . and the plugin module", s.Kubernetes, s.Programs, s.Requires)
	}
	v, err := RequiredVersion(repoRoot, mods)
	if err != nil {
		t.Fatal(err)
	}
	if checkVersion(v) != nil {
		t.Errorf("the tree requires %s, which is not a release version", v)
	}
}

func TestCheckVersion(t *testing.T) {
	t.Parallel()
	for v, ok := range map[string]bool{
		"v0.1.0": true, "v1.2.3-rc.1": true, "v0.1.0-rehearsal.0123abcd": true,
		"0.1.0": false, "v0.1": false, "v0.1.0+build": false, "": false, "v01.2.3": false,
	} {
		err := checkVersion(v)
		if (err == nil) != ok || err != nil && !errors.Is(err, ErrNotReleasable) {
			t.Errorf("checkVersion(%q) = %v, want ok=%v (errors wrap ErrNotReleasable)", v, err, ok)
		}
	}
}

func TestWithSumsReplacesTheSDKsLines(t *testing.T) {
	t.Parallel()
	sum := "example.com/a v1.0.0 h1:aaa=\n" + sdkPath + " v0.0.9 h1:old=\n" + sdkPath + " v0.0.9/go.mod h1:oldmod=\n"
	lines := map[string][]string{sdkPath: {sdkPath + " v0.1.0 h1:new=", sdkPath + " v0.1.0/go.mod h1:newmod="}}
	got := string(withSums([]byte(sum), lines, []string{sdkPath}))
	want := "example.com/a v1.0.0 h1:aaa=\n" + sdkPath + " v0.1.0 h1:new=\n" + sdkPath + " v0.1.0/go.mod h1:newmod=\n"
	if got != want {
		t.Errorf("withSums:\n%s\nwant:\n%s", got, want)
	}
}
