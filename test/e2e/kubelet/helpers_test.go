package kubelet_test

import (
	"context"
	"os"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/hamireg/hamireg/test/e2e/internal/testplugin"
	"github.com/hamireg/hamireg/test/e2e/kubeletpeer"
)

const resource = "vendor.example.com/gpu"

// shortTempDir is a folder whose unix socket paths stay far below 108 bytes (t.TempDir
// embeds the test name).
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kl-") //nolint:usetesting // t.TempDir embeds the test name; socket paths must stay < 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

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
	dm, err := kubeletpeer.StartDeviceManager(t.Context(), kubeletpeer.DeviceManagerOptions{})
	if err != nil {
		t.Fatalf("start the kubelet device manager: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("device manager log:\n%s", dm.LogTail(40))
		}
		if err := dm.Stop(); err != nil {
			t.Errorf("stop device manager: %v", err)
		}
	})
	return dm
}

// waitForResources polls the device manager until resource reads capacity/allocatable.
func waitForResources(t *testing.T, dm *kubeletpeer.DeviceManager, capacity, allocatable int64) {
	t.Helper()
	var last kubeletpeer.Resources
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 15*time.Second, true, func(ctx context.Context) (bool, error) {
		r, err := dm.Capacity(ctx)
		if err != nil {
			return false, err
		}
		last = r
		return r.Capacity[resource] == capacity && r.Allocatable[resource] == allocatable, nil
	})
	if err != nil {
		t.Fatalf("%s: want capacity %d allocatable %d, last read %+v: %v", resource, capacity, allocatable, last, err)
	}
}
