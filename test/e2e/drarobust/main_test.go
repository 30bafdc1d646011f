// Package drarobust_test proves the DRA driver's robustness against real peers:
// kube-apiserver and kube-scheduler v1.37 without feature gates, the kubelet's own DRA manager
// in-process (kubeletpeer.StartDRAManager), and the node agent with its DRA world (nodeagent +
// nodedra) in-process on go-nvml's simulated DGX A100, or the DRA plugin alone in a child
// process that a test can SIGKILL. A test plays the kubelet: it prepares the pods
// kube-scheduler bound and unprepares them. kube-controller-manager does not run, so tests
// release claims themselves (harness.ReleaseClaim).
//
// What it shows: 1,000 claim churns leave no claim, checkpoint entry, CDI spec or state folder
// behind; a claim deleted on the API side without Unprepare is cleaned up and its GPU is
// usable again; a corrupted checkpoint is recovered with nothing lost; an agent killed
// mid-prepare recovers and the kubelet's retry prepares.
package drarobust_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

var (
	// cp is the control plane shared by every test of this binary; kube-scheduler (default
	// profile) runs against it.
	cp *harness.ControlPlane
	// errScheduler says why kube-scheduler is not running; every test fails on it.
	errScheduler error
)

// TestMain starts the control plane and kube-scheduler once; started as a child plugin
// (pluginChildEnv) it runs the DRA plugin instead.
func TestMain(m *testing.M) {
	if os.Getenv(pluginChildEnv) != "" {
		os.Exit(runPluginChild())
	}
	harness.Main(m, envtest.Options{APIServerFlags: []string{"--request-timeout=5s"}}, func(c *harness.ControlPlane) {
		cp = c
		if _, err := c.StartScheduler(context.Background(), envtest.SchedulerOptions{}); err != nil {
			errScheduler = fmt.Errorf("start kube-scheduler: %w", err)
		}
	})
}
