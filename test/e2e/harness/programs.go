package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildProgram builds the program pkg of the SDK's root module (e.g. "./examples/extender")
// into out and returns out. race builds it with the race detector, which a test binary run
// with -race passes so that a race in the program fails the test (exit 66). It must be called
// from a package folder of this module (test/e2e/<pkg>, as go test runs it). cgo programs get
// go-nvml's CGO_CFLAGS unless the environment sets them.
func BuildProgram(out, pkg string, race bool) (string, error) {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		return "", err
	}
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = root
	cmd.Env = os.Environ()
	if os.Getenv("CGO_CFLAGS") == "" { // go-nvml's header trips deprecation warnings
		cmd.Env = append(cmd.Env, "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s in %s: %w\n%s", pkg, root, err, b)
	}
	return out, nil
}
