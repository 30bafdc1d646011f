// Package extenderha_test runs examples/extender, the scheduler program on package extender, as
// processes against real peers: kube-apiserver and etcd (harness) and kube-scheduler. The
// API server calls the extender's mutating webhook over TLS, configured from the example's
// deploy/webhook.yaml, and fails open on a certificate its caBundle does not trust; two
// kube-scheduler and extender pairs, configured from deploy/scheduler-config.yaml and
// deploy/deployment.yaml, each pair with a host name of its own as the two pods of the
// Deployment with 2 replicas have, follow kube-scheduler's Lease: only the leader's extender
// writes handshakes, and after the leader pair is killed with SIGKILL the other pair writes a
// handshake and answers the filter within the lease duration plus one second, and binds. The extenders run under the
// ServiceAccount and roles of deploy/rbac.yaml.
package extenderha_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/hamireg/hamireg/test/e2e/harness"
)

var (
	// cp is the control plane shared by every test of this binary.
	cp *harness.ControlPlane
	// extenderBin is the examples/extender binary, built into cp.Dir() (removed with it);
	// errExtenderBuild says why it is missing.
	extenderBin      string
	errExtenderBuild error
)

// TestMain starts the control plane and builds the extender once. --request-timeout bounds
// kube-apiserver's graceful shutdown, which waits for the extenders' open watches.
func TestMain(m *testing.M) {
	harness.Main(m, harness.Options{APIServerFlags: []string{"--request-timeout=5s"}}, func(c *harness.ControlPlane) {
		cp = c
		extenderBin, errExtenderBuild = buildExtender(filepath.Join(c.Dir(), "extender"))
	})
}

// buildExtender builds examples/extender into out, with the race detector when the test binary
// has it (go test -race), so that a race in the extender fails the test (exit 66).
func buildExtender(out string) (string, error) {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		return "", err
	}
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./examples/extender")...)
	cmd.Dir = root
	cmd.Env = os.Environ()
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./examples/extender in %s: %w\n%s", root, err, b)
	}
	return out, nil
}
