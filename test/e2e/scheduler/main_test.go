// Package scheduler_test proves that kube-scheduler, started by the harness against the
// same apiserver, schedules like a cluster's: it binds Pods to Nodes by their allocatable
// resources (including a device-plugin resource published by the kubelet's device
// manager), leaves Pods that fit nowhere Pending with a FailedScheduling event, and calls
// the extenders given in its KubeSchedulerConfiguration.
package scheduler_test

import (
	"context"
	"os"
	"testing"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

var cp *harness.ControlPlane

func TestMain(m *testing.M) {
	if code, child := kubeletpeer.RunIfChild(context.Background()); child {
		os.Exit(code) // the kubelet device manager's child ends here
	}
	harness.Main(m, envtest.Options{}, func(c *harness.ControlPlane) { cp = c })
}
