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
	"testing"

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

// TestMain starts the control plane and builds the two programs once.
func TestMain(m *testing.M) {
	harness.MainWithPrograms(m, race, func(c *harness.ControlPlane, p harness.Programs) {
		cp = c
		agentBin, errAgentBuild = p.DevicePlugin, p.DevicePluginErr
		extenderBin, errExtenderBuild = p.Extender, p.ExtenderErr
	})
}
