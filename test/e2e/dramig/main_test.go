// Package dramig_test runs MIG through DRA against real peers: kube-apiserver and
// kube-scheduler v1.37 without feature gates (partitionable devices are beta and on,
// prioritized lists GA), the kubelet's own DRA manager in-process
// (kubeletpeer.StartDRAManager), and the node agent in-process (nodeagent.New with
// Options.DRA and Options.MIG) on go-nvml's simulated DGX A100, whose simulation
// (nvmlsim) refuses overlapping MIG placements and enumerates the instances it created.
//
// Each node has GPUs 0, 1 and 2 in MIG mode (profiles 1g.5gb, 1g.10gb, 2g.10gb, 3g.20gb
// and 7g.40gb) and GPUs 3 to 7 shared through HAMi-core; the DRA world owns GPUs 0, 1, 3
// and 4, the device plugin the others. A test plays the kubelet: it prepares the pods
// kube-scheduler bound, reads the CDI specs the plugin wrote and the simulation's
// instances, and unprepares them. kube-controller-manager does not run, so tests release
// claims themselves (harness.ReleaseClaim).
package dramig_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

var (
	// cp is the control plane shared by every test of this binary; kube-scheduler (default
	// profile, no extender) runs against it.
	cp *harness.ControlPlane
	// errScheduler says why kube-scheduler is not running; every test fails on it.
	errScheduler error
)

// TestMain starts the control plane and kube-scheduler once.
func TestMain(m *testing.M) {
	if code, child := kubeletpeer.RunIfChild(context.Background()); child {
		os.Exit(code)
	}
	harness.Main(m, envtest.Options{APIServerFlags: []string{"--request-timeout=5s"}}, func(c *harness.ControlPlane) {
		cp = c
		if _, err := c.StartScheduler(context.Background(), envtest.SchedulerOptions{}); err != nil {
			errScheduler = fmt.Errorf("start kube-scheduler: %w", err)
		}
	})
}
