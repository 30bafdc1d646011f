// Package acmeplugin_test runs examples/acmeplugin, the device plugin of a made-up, non-NVIDIA
// accelerator on package nodeagent, as a process against real peers: kube-apiserver and etcd
// (harness) and the kubelet's own device manager (kubeletpeer). The plugin simulates its NPUs
// (--simulate: device nodes in a folder it creates) and runs as a ServiceAccount bound to the
// ClusterRole of its deploy/rbac.yaml; a test plays HAMi's scheduler (allocationtest, with
// the ACME vendor's keys) and the kubelet's admission (ManagerImpl.Allocate), and checks the
// device nodes and environment the kubelet receives and the end of HAMi's protocol.
package acmeplugin_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

var (
	// cp is the control plane shared by the tests of this binary.
	cp *harness.ControlPlane
	// pluginBin is the examples/acmeplugin binary, built into cp.Dir() (removed with it);
	// errBuild says why it is missing.
	pluginBin string
	errBuild  error
)

// TestMain starts the control plane and builds the plugin once. --request-timeout bounds
// kube-apiserver's graceful shutdown, which waits for the plugin's open watches.
func TestMain(m *testing.M) {
	if code, child := kubeletpeer.RunIfChild(context.Background()); child {
		os.Exit(code) // the kubelet device manager's child ends here
	}
	harness.Main(m, envtest.Options{APIServerFlags: []string{"--request-timeout=5s"}}, func(c *harness.ControlPlane) {
		cp = c
		pluginBin, errBuild = harness.BuildProgram(filepath.Join(c.Dir(), "acmeplugin"), "./examples/acmeplugin", race)
	})
}
