// Package schedcache_test runs package schedcache against a real kube-apiserver and etcd:
// nodes registering as an agent writes, changes visible without the tick, bad annotations,
// handshake cleanup, leader-gated writes with two replicas, kube-scheduler's Lease followed
// with an exact identity, the RBAC the cache needs, and the visibility latency benchmark.
package schedcache_test

import (
	"testing"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// cp is the control plane shared by every test of this binary.
var cp *harness.ControlPlane

func TestMain(m *testing.M) {
	harness.Main(m, envtest.Options{}, func(c *harness.ControlPlane) { cp = c })
}
