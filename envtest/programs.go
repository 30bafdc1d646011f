package envtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildProgram builds the program pkg (e.g. "./examples/extender") of the module in folder
// moduleDir into out and returns out, for a test to run it as a process. A pkg whose folder
// is a nested module (it has its own go.mod, as cmd/kubectl-hami_doctor) is built from that folder,
// with its own requirements. race builds it with
// the race detector, which a test binary run with -race passes so that a race in the program
// fails the test (exit 66). cgo programs get go-nvml's CGO_CFLAGS unless the environment sets
// them. It runs the go command from $PATH.
func BuildProgram(out, moduleDir, pkg string, race bool) (string, error) {
	root, err := filepath.Abs(moduleDir)
	if err != nil {
		return "", err
	}
	dir := root
	if _, err := os.Stat(filepath.Join(root, pkg, "go.mod")); err == nil {
		dir, pkg = filepath.Join(root, pkg), "."
	}
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = dir
	cmd.Env = os.Environ()
	if os.Getenv("CGO_CFLAGS") == "" { // go-nvml's header trips deprecation warnings
		cmd.Env = append(cmd.Env, "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s in %s: %w\n%s", pkg, dir, err, b)
	}
	return out, nil
}
