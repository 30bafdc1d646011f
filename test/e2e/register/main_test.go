// Package register_test runs package register's Writer against a real kube-apiserver and
// etcd: patch semantics, the watch of one Node, RBAC with the minimal ClusterRole, an
// apiserver restart, and the request counts behind the steady-state and healing figures.
package register_test

import (
	"testing"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// cp is the control plane shared by every test and benchmark of this binary.
var cp *harness.ControlPlane

// TestMain starts the control plane. --request-timeout also bounds how long kube-apiserver's
// graceful shutdown waits for open watch streams (the Writer always has one) before it
// exits; the default 60 s would make TestRegisterRecoversFromAPIServerRestart slow.
func TestMain(m *testing.M) {
	harness.Main(m, envtest.Options{APIServerFlags: []string{"--request-timeout=5s"}}, func(c *harness.ControlPlane) { cp = c })
}
