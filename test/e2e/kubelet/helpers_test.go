package kubelet_test

import (
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/hamireg/hamireg/test/e2e/internal/testplugin"
	"github.com/hamireg/hamireg/test/e2e/kubeletpeer"
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
	return kubeletpeer.StartDeviceManagerForTest(t, kubeletpeer.DeviceManagerOptions{})
}

// waitForResources polls the device manager until resource reads capacity/allocatable.
func waitForResources(t *testing.T, dm *kubeletpeer.DeviceManager, capacity, allocatable int64) {
	t.Helper()
	dm.WaitForResources(t, resource, capacity, allocatable)
}
