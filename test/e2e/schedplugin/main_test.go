// Package schedplugin_test runs examples/scheduler, kube-scheduler built with the SDK's
// HAMiGPU framework plugin, as a process against real peers (harness.StartHAMiScheduler:
// kube-apiserver and etcd, the configuration of examples/scheduler/deploy, the example's
// ClusterRole), and checks that its placements are allocated by HAMi's node side: by
// examples/deviceplugin on the kubelet's device manager, by allocationtest's stand-in of
// HAMi's own device plugin, and, for a vendor other than NVIDIA, by examples/acmeplugin.
// With many pods under ResourceQuotas, no GPU is over-committed and no quota exceeded. The
// binary's webhook mode answers admission reviews from the API server's caches, and the
// example's rbac.yaml grants, by SubjectAccessReview, what the program uses and nothing more.
// Every test runs a scheduler of its own whose HAMiGPU profile has a name of its own, and pods
// restricted to the test's nodes, so that tests run in parallel on the shared control plane.
package schedplugin_test

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
	// cp is the control plane shared by the tests of this binary.
	cp *harness.ControlPlane
	// devicePluginBin and acmePluginBin are examples/deviceplugin and examples/acmeplugin,
	// built into cp.Dir() (removed with it); errDevicePlugin and errACME say why one is
	// missing. examples/scheduler is built by the harness on first use.
	devicePluginBin, acmePluginBin string
	errDevicePlugin, errACME       error
)

// TestMain starts the control plane and builds the node programs once. --request-timeout
// bounds kube-apiserver's graceful shutdown, which waits for the programs' open watches.
func TestMain(m *testing.M) {
	if code, child := kubeletpeer.RunIfChild(context.Background()); child {
		os.Exit(code) // the kubelet device manager's child ends here
	}
	harness.Main(m, envtest.Options{APIServerFlags: []string{"--request-timeout=5s"}}, func(c *harness.ControlPlane) {
		cp = c
		devicePluginBin, errDevicePlugin = harness.BuildProgram(filepath.Join(c.Dir(), "deviceplugin"), "./examples/deviceplugin", race)
		acmePluginBin, errACME = harness.BuildProgram(filepath.Join(c.Dir(), "acmeplugin"), "./examples/acmeplugin", race)
	})
}
