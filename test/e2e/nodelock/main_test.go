// Package nodelock_test runs package nodelock against a real kube-apiserver and etcd: two
// contenders with their own ServiceAccounts racing for one node's lock while another writer
// patches the same Node, takeovers of expired, ownerless, legacy and unreadable locks, the
// minimal ClusterRole, a Forbidden answer, and the latency of a lock cycle.
package nodelock_test

import (
	"testing"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// cp is the control plane shared by every test and benchmark of this binary.
var cp *harness.ControlPlane

func TestMain(m *testing.M) {
	harness.Main(m, envtest.Options{}, func(c *harness.ControlPlane) { cp = c })
}
