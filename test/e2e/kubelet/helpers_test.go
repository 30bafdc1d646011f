package kubelet_test

import (
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/test/e2e/harness"
	"github.com/hamireg/hamireg/test/e2e/internal/testplugin"
)

const resource = "vendor.example.com/gpu"

func startPlugin(t *testing.T, dir string, devices []*pluginapi.Device) *testplugin.Plugin {
	t.Helper()
	p, err := testplugin.Start(dir, "vendor.sock", devices)
	if err != nil {
		t.Fatalf("start plugin: %v", err)
	}
	t.Cleanup(p.Stop)
	return p
}

func startDeviceManager(t *testing.T) *kubeletpeer.DeviceManager {
	t.Helper()
	return harness.StartDeviceManagerForTest(t, kubeletpeer.DeviceManagerOptions{})
}

// waitForResources polls the device manager until resource reads capacity/allocatable.
func waitForResources(t *testing.T, dm *kubeletpeer.DeviceManager, capacity, allocatable int64) {
	t.Helper()
	harness.WaitForResources(t, dm, resource, capacity, allocatable)
}
