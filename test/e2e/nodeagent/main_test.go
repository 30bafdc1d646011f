// Package nodeagent_test runs examples/deviceplugin, the node program on package nodeagent,
// as a process against real peers: kube-apiserver and etcd (harness) and the kubelet's own
// device manager (kubeletpeer). The binary runs on go-nvml's simulated DGX A100
// (--simulate dgxa100) with a ServiceAccount bound to nodeagent.ClusterRoleRules(); a test
// plays HAMi's scheduler (allocationtest: filter annotations, node lock, Binding) and the
// kubelet's admission (ManagerImpl.Allocate per container), and checks both node channels,
// HAMi's Allocate protocol, its failure paths, an apiserver outage and the deploy manifests'
// RBAC.
package nodeagent_test

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
	// cp is the control plane shared by every test and benchmark of this binary.
	cp *harness.ControlPlane
	// agentBin is the examples/deviceplugin binary, built into cp.Dir() (removed with it);
	// errAgentBuild says why it is missing.
	agentBin      string
	errAgentBuild error
	// extenderBin is the examples/extender binary, for the full loop.
	extenderBin      string
	errExtenderBuild error
)

// TestMain starts the control plane and builds the plugin once. --request-timeout bounds
// kube-apiserver's graceful shutdown, which waits for the agent's open watches.
func TestMain(m *testing.M) {
	if code, child := kubeletpeer.RunIfChild(context.Background()); child {
		os.Exit(code) // the kubelet device manager's child ends here
	}
	harness.Main(m, envtest.Options{APIServerFlags: []string{"--request-timeout=5s"}}, func(c *harness.ControlPlane) {
		cp = c
		agentBin, errAgentBuild = harness.BuildProgram(filepath.Join(c.Dir(), "deviceplugin"), "./examples/deviceplugin", race)
		extenderBin, errExtenderBuild = harness.BuildProgram(filepath.Join(c.Dir(), "extender"), "./examples/extender", race)
	})
}
