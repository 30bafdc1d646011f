package harness

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// DoctorName is the file name of the built doctor: the name kubectl runs it by as the plugin
// "kubectl hami-doctor".
const DoctorName = "kubectl-hami_doctor"

var doctorBin struct {
	once sync.Once
	path string
	err  error
}

// BuildDoctor builds cmd/kubectl-hami_doctor (a module of its own) once per test binary as
// DoctorName into dir (the control plane's folder, removed with it) and returns its path. It
// builds without cgo (the doctor needs none), so the packages come from the build cache of
// `make unit`'s CGO_ENABLED=0 build. It must be called from a package folder of the test
// module (test/e2e/<pkg>, as go test runs it); a failed build fails tb, and every later call.
func BuildDoctor(tb testing.TB, dir string) string {
	tb.Helper()
	doctorBin.once.Do(func() {
		root, err := filepath.Abs(filepath.Join("..", "..", ".."))
		if err != nil {
			doctorBin.err = err
			return
		}
		doctorBin.path = filepath.Join(dir, DoctorName)
		cmd := exec.Command("go", "build", "-o", doctorBin.path, ".")
		cmd.Dir = filepath.Join(root, "cmd", "kubectl-hami_doctor")
		// Its go.work puts the tree's SDK in place of the release its go.mod requires, even
		// where the environment turns workspaces off.
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK="+filepath.Join(cmd.Dir, "go.work"))
		if out, err := cmd.CombinedOutput(); err != nil {
			doctorBin.err = errors.New("go build in cmd/kubectl-hami_doctor: " + err.Error() + "\n" + string(out))
		}
	})
	if doctorBin.err != nil {
		tb.Fatal(doctorBin.err)
	}
	return doctorBin.path
}

// DoctorRun is what one run of the doctor printed and its exit status (0 healthy or done,
// 1 a case applies, 2 errors).
type DoctorRun struct {
	Stdout, Stderr string
	Code           int
}

// RunDoctor runs the doctor bin (BuildDoctor) with args and --kubeconfig kubeconfig, as a
// user runs the kubectl plugin, until it exits or tb's context ends. When tb fails, it logs
// the command line, the exit status and both outputs.
func RunDoctor(tb testing.TB, bin, kubeconfig string, args ...string) DoctorRun {
	tb.Helper()
	args = append(args, "--kubeconfig", kubeconfig)
	cmd := exec.CommandContext(tb.Context(), bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	var r DoctorRun
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.Code = exit.ExitCode()
	case err != nil:
		tb.Fatalf("run %s %v: %v", DoctorName, args, err)
	}
	r.Stdout, r.Stderr = out.String(), errb.String()
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("%s %s: exit %d\nstdout:\n%s\nstderr:\n%s", DoctorName, strings.Join(args, " "), r.Code, r.Stdout, r.Stderr)
		}
	})
	return r
}
