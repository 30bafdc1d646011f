package kubelet_test

import (
	"testing"

	"github.com/hamireg/hamireg/test/e2e/internal/testplugin"
)

// ManagerImpl turns the plugin's device list into capacity (all devices) and allocatable
// (healthy devices); when the plugin dies, allocatable drops to 0 at once while capacity
// is kept for the 5 minute grace period.
func TestDeviceManagerCapacityAndAllocatable(t *testing.T) {
	t.Parallel()
	dm := startDeviceManager(t)
	p := startPlugin(t, dm.Dir(), testplugin.Devices(2, 1))
	if err := p.Register(t.Context(), dm.SocketPath(), resource); err != nil {
		t.Fatalf("Register: %v", err)
	}
	waitForResources(t, dm, 3, 2)

	p.SetDevices(testplugin.Devices(4, 0))
	waitForResources(t, dm, 4, 4)

	p.Stop()
	waitForResources(t, dm, 4, 0)
	r, err := dm.Capacity(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Deleted) != 0 {
		t.Errorf("deleted = %v within the grace period, want none", r.Deleted)
	}
}

// A kubelet restart (new ManagerImpl on the same folder) deletes the plugin's socket; the
// resource reads 0 until the plugin serves again and re-registers.
func TestDeviceManagerKubeletRestart(t *testing.T) {
	t.Parallel()
	dm := startDeviceManager(t)
	p := startPlugin(t, dm.Dir(), testplugin.Devices(2, 0))
	if err := p.Register(t.Context(), dm.SocketPath(), resource); err != nil {
		t.Fatalf("Register: %v", err)
	}
	waitForResources(t, dm, 2, 2)

	if err := dm.Restart(t.Context()); err != nil {
		t.Fatalf("kubelet restart: %v", err)
	}
	waitForResources(t, dm, 0, 0)
	if err := p.Restart(); err != nil {
		t.Fatalf("plugin restart: %v", err)
	}
	if err := p.Register(t.Context(), dm.SocketPath(), resource); err != nil {
		t.Fatalf("re-Register after kubelet restart: %v", err)
	}
	waitForResources(t, dm, 2, 2)
}
