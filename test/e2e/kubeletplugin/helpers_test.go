package kubeletplugin_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/test/e2e/kubeletpeer"
)

const (
	resource = "nvidia.com/gpu"
	split    = 4
)

// gpus returns GPUs with the given health; each is published as split virtual devices.
func gpus(healthy ...bool) []annotation.Device {
	out := make([]annotation.Device, len(healthy))
	for i, h := range healthy {
		out[i] = annotation.Device{
			ID: fmt.Sprintf("GPU-%08d-303d-558d-435e-99a160631fe4", i), Index: uint(i), Count: split, Numa: i % 2, Health: h,
		}
	}
	return out
}

// shortTempDir keeps unix socket paths far below 108 bytes (t.TempDir embeds the test name).
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kp") //nolint:usetesting // t.TempDir embeds the test name; socket paths must stay < 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func startDeviceManager(t testing.TB) *kubeletpeer.DeviceManager {
	t.Helper()
	dm, err := kubeletpeer.StartDeviceManager(t.Context(), kubeletpeer.DeviceManagerOptions{})
	if err != nil {
		t.Fatalf("start the kubelet device manager: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("device manager log:\n%s", dm.LogTail(60))
		}
		if err := dm.Stop(); err != nil {
			t.Errorf("stop device manager: %v", err)
		}
	})
	return dm
}

// running is a Plugin whose Run goroutine the test controls.
type running struct {
	*kubeletplugin.Plugin
	cancel context.CancelFunc
	done   chan error
	err    error
	ended  bool
}

// stop cancels Run and returns its error.
func (r *running) stop() error {
	if !r.ended {
		r.cancel()
		r.err = <-r.done
		r.ended = true
	}
	return r.err
}

// wait returns Run's error once Run returned on its own, or fails after timeout.
func (r *running) wait(t testing.TB, timeout time.Duration) error {
	t.Helper()
	select {
	case r.err = <-r.done:
		r.ended = true
		return r.err
	case <-time.After(timeout):
		t.Fatalf("Run did not return within %v", timeout)
		return nil
	}
}

func startPlugin(t testing.TB, opts kubeletplugin.Options, devices []annotation.Device) *running {
	t.Helper()
	if opts.SplitCount == 0 {
		opts.SplitCount = split
	}
	p, err := kubeletplugin.New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	p.SetDevices(devices)
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	r := &running{Plugin: p, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- p.Run(ctx) }()
	t.Cleanup(func() {
		if r.ended { // the test read Run's error with wait
			return
		}
		if err := r.stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

// waitForResources polls the device manager until the resource reads capacity/allocatable.
func waitForResources(t testing.TB, dm *kubeletpeer.DeviceManager, capacity, allocatable int64) {
	t.Helper()
	var last kubeletpeer.Resources
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
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

func waitForEvent(t testing.TB, srv *kubeletpeer.RegistrationServer, what string, match func(kubeletpeer.Event) bool) kubeletpeer.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	ev, err := srv.WaitFor(ctx, match)
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
	return ev
}
