// Package doctor_test reproduces, against real peers, the cases that stop a GPU pod (spec
// gpu-pod-doctor.md §2) and diagnoses each with diagnose.Pod, as `doctor pod` does: the
// kube-apiserver and etcd (harness), kube-scheduler (a plain default-scheduler profile, or
// examples/extender's configuration with a scheduler name of the test's own), the
// examples/extender process, and a GPU node (harness.GPUNode: the kubelet's device manager
// and examples/deviceplugin --simulate dgxa100). The test plays the kubelet's admission
// (Allocate per GPU container, and the pod status the kubelet writes when it fails). Each
// scenario asserts the case code, an evidence line and the fix, applies the fix as the
// client-go call its kubectl command means, and checks that the pod reaches S3 (bind-phase
// success): P1 (placed by the default scheduler, no webhook), P2 (extender down), P3
// (memory short with the holder named, a GPU type selector, a ResourceQuota); and the
// support bundle (diagnose.WriteBundle) with read-only RBAC. Three tests also run the
// doctor's plugin binary (cmd/kubectl-hami_doctor built as kubectl-hami_doctor, harness.BuildDoctor)
// with --kubeconfig, as a user does: unlock (dry run, then --yes as the fix) in P4, pod and
// pods in P3's quota case, and bundle as the read-only ServiceAccount.
package doctor_test

import (
	"testing"

	"github.com/hamireg/hamireg/test/e2e/harness"
)

var (
	// cp is the control plane shared by every test of this binary.
	cp *harness.ControlPlane
	// pluginBin is the examples/deviceplugin binary, extenderBin examples/extender's, built
	// into cp.Dir() (removed with it); the errors say why one is missing.
	pluginBin, extenderBin      string
	errPluginBuild, errExtBuild error
)

// TestMain starts the control plane and builds the two programs once.
func TestMain(m *testing.M) {
	harness.MainWithPrograms(m, race, func(c *harness.ControlPlane, p harness.Programs) {
		cp = c
		pluginBin, errPluginBuild = p.DevicePlugin, p.DevicePluginErr
		extenderBin, errExtBuild = p.Extender, p.ExtenderErr
	})
}
