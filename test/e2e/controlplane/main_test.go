// Package controlplane_test proves that the harness's etcd and kube-apiserver behave like a
// cluster's: patch semantics, RBAC, leases, scale, and an apiserver restart.
package controlplane_test

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
