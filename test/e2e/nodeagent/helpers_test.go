package nodeagent_test

import (
	"fmt"
	"testing"

	kubeschedulerconfigv1 "k8s.io/kube-scheduler/config/v1"

	"github.com/hamireg/hamireg/test/e2e/harness"
)

const (
	resourceName = harness.GPUResource
	// gpus and split are the simulated DGX A100's GPUs and the plugin's default split count.
	gpus  = harness.SimulatedGPUs
	split = harness.DefaultSplit
	// agentRole is the ClusterRole the agents run with: exactly nodeagent.ClusterRoleRules(),
	// the rules of deploy/rbac.yaml.
	agentRole = harness.DefaultAgentRole
	// updateLine is HAMi's log line before each write of the register annotation.
	updateLine = "Updating node annotations with 8 device(s)"
)

// newFixture starts a GPU node (harness.StartGPUNode) running this binary's plugin with the
// extra flags, in a namespace of its own.
func newFixture(tb testing.TB, extra ...string) *harness.GPUNode {
	tb.Helper()
	if errAgentBuild != nil {
		tb.Fatal(errAgentBuild)
	}
	return cp.StartGPUNode(tb, harness.GPUNodeOptions{Bin: agentBin, Args: extra, Namespace: harness.UniqueName("na"), Role: agentRole})
}

func describe(err error) string {
	if err == nil {
		return "no error"
	}
	return fmt.Sprintf("error %q", err)
}

// ownScheduler is the KubeSchedulerConfiguration of deploy/ with the extender at url, under a
// scheduler name of this test's own: the package's tests run in parallel, each with its own
// kube-scheduler, and a kube-scheduler takes every pending pod of its name (another test's
// scheduler would bind this test's pods through its own extender).
func ownScheduler(tb testing.TB, url string) (*kubeschedulerconfigv1.KubeSchedulerConfiguration, string) {
	tb.Helper()
	cfg := harness.ExtenderSchedulerConfig(tb, url)
	name := harness.UniqueName("hami-scheduler")
	for i := range cfg.Profiles {
		cfg.Profiles[i].SchedulerName = &name
	}
	return cfg, name
}
