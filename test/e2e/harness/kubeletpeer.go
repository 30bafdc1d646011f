package harness

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/hamireg/hamireg/envtest/kubeletpeer"
)

// StartDeviceManagerForTest starts the kubelet's device manager (kubeletpeer) for one test
// or benchmark: it fails tb when the manager cannot start, stops it when tb ends, and logs
// the tail of its log when tb failed. The test binary's TestMain must call
// kubeletpeer.RunIfChild first.
func StartDeviceManagerForTest(tb testing.TB, opts kubeletpeer.DeviceManagerOptions) *kubeletpeer.DeviceManager {
	tb.Helper()
	dm, err := kubeletpeer.StartDeviceManager(tb.Context(), opts)
	if err != nil {
		tb.Fatalf("start the kubelet device manager: %v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("device manager log:\n%s", dm.LogTail(60))
		}
		if err := dm.Stop(); err != nil {
			tb.Errorf("stop device manager: %v", err)
		}
	})
	return dm
}

// WaitForResources waits until dm reports resource at capacity and allocatable, and fails tb
// with the last values read if that does not happen within 20 s.
func WaitForResources(tb testing.TB, dm *kubeletpeer.DeviceManager, resource string, capacity, allocatable int64) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), 20*time.Second)
	defer cancel()
	if _, err := dm.WaitForResources(ctx, resource, capacity, allocatable); err != nil {
		tb.Fatal(err)
	}
}

// ShortTempDir is a temporary folder, removed when tb ends, whose unix socket paths stay far
// below the 108-byte limit (tb.TempDir embeds the test's name).
func ShortTempDir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "kp-") //nolint:usetesting // tb.TempDir embeds the test name; socket paths must stay < 108 bytes
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// WaitForEvent reads srv's Events until match returns true and returns that event; it fails
// tb, naming what it waited for, when that does not happen within 20 s.
func WaitForEvent(tb testing.TB, srv *kubeletpeer.RegistrationServer, what string, match func(kubeletpeer.Event) bool) kubeletpeer.Event {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), 20*time.Second)
	defer cancel()
	ev, err := srv.WaitFor(ctx, match)
	if err != nil {
		tb.Fatalf("wait for %s: %v", what, err)
	}
	return ev
}
