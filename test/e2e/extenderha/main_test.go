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
	"path/filepath"
	"testing"

	"github.com/hamireg/hamireg/envtest"
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
	harness.Main(m, envtest.Options{APIServerFlags: []string{"--request-timeout=5s"}}, func(c *harness.ControlPlane) {
		cp = c
		extenderBin, errExtenderBuild = harness.BuildProgram(filepath.Join(c.Dir(), "extender"), "./examples/extender", race)
	})
}
