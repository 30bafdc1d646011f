// Package drahealth_test proves that a GPU's health reaches the pod's status
// (KEP-4680, the kubelet's ResourceHealthStatus, beta and on in 1.37) on real peers:
// kube-apiserver and kube-scheduler v1.37.2 without feature gates, the kubelet's DRA manager
// in-process and its device manager in a child process (kubeletpeer), each followed by the
// kubelet's pod status sync for device health (SyncPodStatus), and the node agent in-process
// with its DRA world (nodedra) on go-nvml's simulated DGX A100: GPUs 0–5 are DRA's, 6 and 7
// the device plugin's. An XID injected on a simulated GPU must turn the device of the pod
// that holds it Unhealthy in status.containerStatuses[].allocatedResourcesStatus, through
// the DRA driver's health stream or the device plugin's ListAndWatch, leave the other pods'
// devices Healthy, and turn it Healthy again when the scan recovers the GPU.
package drahealth_test

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
	// profile) runs against it.
	cp *harness.ControlPlane
	// errScheduler says why kube-scheduler is not running; every test fails on it.
	errScheduler error
)

// TestMain starts the control plane and kube-scheduler once.
func TestMain(m *testing.M) {
	if code, child := kubeletpeer.RunIfChild(context.Background()); child {
		os.Exit(code) // the kubelet device manager's child ends here
	}
	harness.Main(m, envtest.Options{APIServerFlags: []string{"--request-timeout=5s"}}, func(c *harness.ControlPlane) {
		cp = c
		if _, err := c.StartScheduler(context.Background(), envtest.SchedulerOptions{}); err != nil {
			errScheduler = fmt.Errorf("start kube-scheduler: %w", err)
		}
	})
}
