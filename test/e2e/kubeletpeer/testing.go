package kubeletpeer

import (
	"context"
	"os"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// StartDeviceManagerForTest starts the device manager for one test or benchmark: it fails tb
// when the manager cannot start, stops it when tb ends, and logs the tail of its log when tb
// failed.
func StartDeviceManagerForTest(tb testing.TB, opts DeviceManagerOptions) *DeviceManager {
	tb.Helper()
	dm, err := StartDeviceManager(tb.Context(), opts)
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

// WaitForResources polls the manager until resource reads capacity and allocatable, and fails
// tb with the last values read if that does not happen within 20 s.
func (m *DeviceManager) WaitForResources(tb testing.TB, resource string, capacity, allocatable int64) {
	tb.Helper()
	var last Resources
	err := wait.PollUntilContextTimeout(tb.Context(), 10*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		r, err := m.Capacity(ctx)
		if err != nil {
			return false, err
		}
		last = r
		return r.Capacity[resource] == capacity && r.Allocatable[resource] == allocatable, nil
	})
	if err != nil {
		tb.Fatalf("%s: want capacity %d allocatable %d, last read %+v: %v", resource, capacity, allocatable, last, err)
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

// WaitForEvent reads Events until match returns true and returns that event; it fails tb,
// naming what it waited for, when that does not happen within 20 s.
func (s *RegistrationServer) WaitForEvent(tb testing.TB, what string, match func(Event) bool) Event {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), 20*time.Second)
	defer cancel()
	ev, err := s.WaitFor(ctx, match)
	if err != nil {
		tb.Fatalf("wait for %s: %v", what, err)
	}
	return ev
}
