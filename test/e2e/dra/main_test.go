// Package dra_test runs the node agent's DRA output against real peers: kube-apiserver and
// kube-scheduler v1.37 without feature gates, the kubelet's own DRA manager with its plugin
// manager in-process (kubeletpeer.StartDRAManager), and the agent in-process
// (nodeagent.New with Options.DRA) on go-nvml's simulated DGX A100. A test plays the
// kubelet: it prepares the pods kube-scheduler bound, reads the CDI specs the plugin wrote
// and unprepares them. kube-controller-manager does not run, so tests release claims
// themselves (harness.ReleaseClaim). One test runs a GPU pod through kube-scheduler and
// examples/extender on the same node, with the kubelet's device manager in a child process.
package dra_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

var (
	// cp is the control plane shared by every test of this binary; kube-scheduler (default
	// profile, no extender) runs against it.
	cp *harness.ControlPlane
	// extenderBin is the examples/extender binary; errExtenderBuild says why it is missing.
	extenderBin      string
	errExtenderBuild error
	// errScheduler says why kube-scheduler is not running; every test fails on it.
	errScheduler error
)

// TestMain starts the control plane and kube-scheduler once and builds examples/extender.
func TestMain(m *testing.M) {
	if code, child := kubeletpeer.RunIfChild(context.Background()); child {
		os.Exit(code) // the kubelet device manager's child ends here
	}
	harness.Main(m, envtest.Options{APIServerFlags: []string{"--request-timeout=5s"}}, func(c *harness.ControlPlane) {
		cp = c
		if _, err := c.StartScheduler(context.Background(), envtest.SchedulerOptions{}); err != nil {
			errScheduler = fmt.Errorf("start kube-scheduler: %w", err)
		}
		extenderBin, errExtenderBuild = harness.BuildProgram(filepath.Join(c.Dir(), "extender"), "./examples/extender", race)
	})
}
