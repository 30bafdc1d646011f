// Package monitor_test runs the node monitor of examples/deviceplugin (package monitor, on by
// default with --prepare-state-dir) against real peers: kube-apiserver and etcd (harness) and
// the kubelet's own device manager (kubeletpeer), on go-nvml's simulated DGX A100. The test
// admits pods through the kubelet, writes each container's HAMi-core region where the plugin's
// Allocate made its folder (monitortest, as HAMi-core does), and proves that /metrics serves
// HAMi's per-container families with the values HAMi's rule gives, init containers included,
// and that truncated, garbage and vanished regions never fail a scrape nor the other series.
package monitor_test

import (
	"testing"

	"github.com/hamireg/hamireg/test/e2e/harness"
)

var (
	// cp is the control plane shared by every test of this binary.
	cp *harness.ControlPlane
	// pluginBin is the examples/deviceplugin binary; errPluginBuild says why it is missing.
	pluginBin      string
	errPluginBuild error
)

// TestMain starts the control plane and builds examples/deviceplugin once.
func TestMain(m *testing.M) {
	harness.MainWithPrograms(m, race, func(c *harness.ControlPlane, p harness.Programs) {
		cp = c
		pluginBin, errPluginBuild = p.DevicePlugin, p.DevicePluginErr
	})
}
