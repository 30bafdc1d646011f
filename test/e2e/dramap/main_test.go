// Package dramap_test runs the extended-resource mapping (KEP-5004) against real peers:
// kube-apiserver and kube-scheduler v1.37 without feature gates, with examples/extender as
// kube-scheduler's extender; a device-plugin node (the node agent in-process on a simulated
// DGX A100, the kubelet's device manager in a child process) and a DRA node (the agent with
// nodedra owning every GPU, the kubelet's DRA manager in-process, and the device manager,
// which counts 0 GPUs there); and the SDK's DeviceClass with extendedResourceName
// nvidia.com/gpu. kube-controller-manager does not run: the tests run the Deployment and
// ReplicaSet controllers in-process (k8s.io/kubernetes/pkg/controller/...). A test plays the
// kubelet: Allocate through the device manager on the device-plugin node, Prepare through the
// DRA manager on the DRA node.
//
// The tests run one after the other: each starts kube-scheduler's hami-scheduler profile
// with its own extender, and two such schedulers would take each other's pods.
package dramap_test

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
	// cp is the control plane shared by every test of this binary.
	cp *harness.ControlPlane
	// extenderBin is the examples/extender binary; errExtenderBuild says why it is missing.
	extenderBin      string
	errExtenderBuild error
)

// TestMain starts the control plane and builds examples/extender.
func TestMain(m *testing.M) {
	if code, child := kubeletpeer.RunIfChild(context.Background()); child {
		os.Exit(code) // the kubelet device manager's child ends here
	}
	harness.Main(m, envtest.Options{APIServerFlags: []string{"--request-timeout=5s"}}, func(c *harness.ControlPlane) {
		cp = c
		extenderBin, errExtenderBuild = harness.BuildProgram(filepath.Join(c.Dir(), "extender"), "./examples/extender", race)
	})
}
