// Package dradoctor_test runs the doctor against claim-based pods on real peers:
// kube-apiserver and kube-scheduler v1.37 without feature gates, the kubelet's own DRA
// manager in-process (kubeletpeer.StartDRAManager) and the node agent in-process
// (nodeagent.New with Options.DRA) on go-nvml's simulated DGX A100. The doctor's cordon
// writes a DeviceTaintRule that kube-scheduler honours; its pod diagnosis tells each stage
// of a claim-based pod. A test plays the kubelet: it prepares the pods kube-scheduler bound
// and writes their status. kube-controller-manager does not run, so tests release claims
// themselves (harness.ReleaseClaim).
package dradoctor_test

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
