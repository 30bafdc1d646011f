// Command release prepares, checks and tags a release of every module of this repository
// together (docs/release.md is the procedure). From the repository root:
//
//	go run ./hack/release modules             # the released modules, in dependency order, with their tags
//	go run ./hack/release set-version v0.2.0  # the release commit: nested go.mod/go.sum at v0.2.0
//	go run ./hack/release check               # build every module at that version from a file proxy
//	go run ./hack/release tags                # the git tag commands of the version go.mod files require
//	go run ./hack/release proxy DIR [VERSION] # write the file proxy only (GOPROXY=file://DIR)
//
// check refuses a tag set that does not build: it zips every module as the go command would
// fetch it from the tags, serves the zips from a GOPROXY=file:// folder, and in a scratch
// module outside the repository gets, builds and (where a module has programs and no replace
// directive) installs each one, as a user would. The work tree is never changed except by
// set-version.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path"
	"path/filepath"
	"strings"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	fs.SetOutput(stderr)
	root := fs.String("root", ".", "the repository root")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: release [-root DIR] modules | set-version VERSION | check [VERSION] | tags [VERSION] | proxy DIR [VERSION]")
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	err := command(ctx, *root, fs.Arg(0), fs.Args()[1:], stdout, stderr)
	if errors.Is(err, errUsage) {
		fs.Usage()
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "release: %v\n", err)
		return 1
	}
	return 0
}

var errUsage = errors.New("usage")

func command(ctx context.Context, root, verb string, args []string, stdout, stderr io.Writer) error {
	mods, err := Modules(root)
	if err != nil {
		return err
	}
	// version is the argument, else the one the nested go.mod files require.
	version := func(i int) (string, error) {
		if len(args) > i {
			return args[i], checkVersion(args[i])
		}
		return RequiredVersion(root, mods)
	}
	switch verb {
	case "modules":
		for _, m := range mods {
			extra := ""
			if m.Kubernetes {
				extra += " (needs the k8s.io replace block)"
			}
			fmt.Fprintf(stdout, "%-50s %-30s tag %s%s\n", m.Path, m.Dir, m.Tag("vX.Y.Z"), extra)
		}
		return nil
	case "set-version":
		if len(args) != 1 {
			return errUsage
		}
		r, err := Prepare(root, args[0], "")
		if err != nil {
			return err
		}
		if err := SetVersion(root, r); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "every module now requires the SDK's modules at %s; commit, then: go run ./hack/release check && go run ./hack/release tags\n", r.Version)
		return nil
	case "tags":
		v, err := version(0)
		if err != nil {
			return err
		}
		for _, m := range mods {
			fmt.Fprintf(stdout, "git tag %s\n", m.Tag(v))
		}
		fmt.Fprintf(stdout, "git push origin %s\n", strings.Join(tagList(mods, v), " "))
		return nil
	case "proxy":
		if len(args) < 1 {
			return errUsage
		}
		v, err := version(1)
		if err != nil {
			return err
		}
		if _, err := Prepare(root, v, args[0]); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "GOPROXY=%s GONOSUMDB=%s\n", GoproxyEnv(absPath(args[0]), goEnv("GOPROXY")), sdkPath)
		return nil
	case "check":
		v, err := version(0)
		if err != nil {
			return err
		}
		dir, err := os.MkdirTemp("", "hamireg-release-check-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir) //nolint:errcheck // a temporary folder
		r, err := Prepare(root, v, filepath.Join(dir, "proxy"))
		if err != nil {
			return err
		}
		env := ConsumerEnv(filepath.Join(dir, "proxy"), filepath.Join(dir, "bin"))
		for _, m := range r.Modules {
			if err := CheckModule(ctx, env, filepath.Join(dir, "check-"+strings.ReplaceAll(m.Dir, "/", "-")), m, v, stderr); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "ok   %s@%s\n", m.Path, v)
		}
		return nil
	}
	return errUsage
}

func tagList(mods []Module, v string) []string {
	out := make([]string, 0, len(mods))
	for _, m := range mods {
		out = append(out, m.Tag(v))
	}
	return out
}

func absPath(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

func goEnv(name string) string {
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// ConsumerEnv is the environment of a user outside the repository whose GOPROXY serves the
// release from proxyDir first: no workspace, the SDK's modules not looked up in the checksum
// database (the proxy's zips are not published), programs installed into bin.
func ConsumerEnv(proxyDir, bin string) []string {
	var env []string
	for _, kv := range os.Environ() {
		switch strings.SplitN(kv, "=", 2)[0] {
		case "GOPROXY", "GONOSUMDB", "GOFLAGS", "GOWORK", "GOBIN", "GO111MODULE", "GOPRIVATE", "GONOPROXY":
			continue
		}
		env = append(env, kv)
	}
	return append(env,
		"GOPROXY="+GoproxyEnv(proxyDir, goEnv("GOPROXY")),
		"GONOSUMDB="+sdkPath,
		"GOWORK=off",
		"GOFLAGS=-modcacherw",
		"GOBIN="+bin,
	)
}

// Go runs the go command in dir with env; its output goes to log and, on failure, into the
// error.
func Go(ctx context.Context, env []string, dir string, log io.Writer, args ...string) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir, cmd.Env = dir, env
	var out strings.Builder
	cmd.Stdout = io.MultiWriter(&out, log)
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s (in %s): %w\n%s", strings.Join(args, " "), dir, err, out.String())
	}
	return nil
}

// CheckModule gets module m at version v into a fresh scratch module in dir and builds every
// package of it; a module with programs and no replace directive is also installed with
// "go install PATH/...@VERSION", as a user would install it. A module that needs
// k8s.io/kubernetes gets the replace block first, from envtest/cmd/replaces at v, and its
// programs are installed from the scratch module ("go install PATH", the version go get
// recorded), as a user of such a program does.
func CheckModule(ctx context.Context, env []string, dir string, m Module, v string, log io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	steps := [][]string{{"mod", "init", "example.com/releasecheck"}}
	if m.Kubernetes {
		steps = append(steps, []string{"run", sdkPath + "/envtest/cmd/replaces@" + v, "-w"})
	}
	steps = append(steps,
		[]string{"get", m.Path + "/...@" + v},
		[]string{"build", "-o", os.DevNull, m.Path + "/..."},
	)
	switch {
	case !m.Replaces && !m.Kubernetes:
		// The programs a user installs: go install refuses a module with replace directives.
		for _, p := range m.Programs {
			steps = append(steps, []string{"install", path.Join(m.Path, p) + "@" + v})
		}
	case m.Kubernetes:
		// go install PATH@VERSION cannot apply the k8s.io replace block: a user installs
		// such a program (examples/scheduler, kube-scheduler with the plugin) from a module
		// of their own that has it, as this scratch module does.
		for _, p := range m.Programs {
			steps = append(steps, []string{"install", path.Join(m.Path, p)})
		}
	}
	for _, s := range steps {
		if err := Go(ctx, env, dir, log, s...); err != nil {
			return fmt.Errorf("%s@%s does not build from its release: %w", m.Path, v, err)
		}
	}
	return nil
}
