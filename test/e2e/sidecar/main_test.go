// Package sidecar_test runs the native-sidecar rule (allocation.AccountingKubernetes, the
// extender's default) through real peers: kube-apiserver and etcd (harness), a real
// kube-scheduler configured from examples/extender's deploy/scheduler-config.yaml calling the
// examples/extender process, GPU Nodes registered by register.Writer (no kubelet runs: bound
// pods never start), a ResourceQuota on GPU memory, and the extender's admission webhook over
// HTTP. A pod with a sidecar (an init container with restartPolicy Always) and an app
// container counts both on its GPU and against its namespace's quota, so a second pod that
// HAMi v2.10.0 (which counts the larger of the two) would place on the card or within the
// quota stays Pending with the fit's reason.
package sidecar_test

import (
	"path/filepath"
	"testing"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

var (
	// cp is the control plane shared by every test of this binary.
	cp *harness.ControlPlane
	// extenderBin is the examples/extender binary, built into cp.Dir(); errBuild says why it
	// is missing.
	extenderBin string
	errBuild    error
)

func TestMain(m *testing.M) {
	harness.Main(m, envtest.Options{APIServerFlags: []string{"--request-timeout=5s"}}, func(c *harness.ControlPlane) {
		cp = c
		extenderBin, errBuild = harness.BuildProgram(filepath.Join(c.Dir(), "extender"), "./examples/extender", race)
	})
}
