package kubeletplugin_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/test/e2e/harness"
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

func startDeviceManager(tb testing.TB) *kubeletpeer.DeviceManager {
	tb.Helper()
	return harness.StartDeviceManagerForTest(tb, kubeletpeer.DeviceManagerOptions{})
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
func (r *running) wait(tb testing.TB, timeout time.Duration) error {
	tb.Helper()
	select {
	case r.err = <-r.done:
		r.ended = true
		return r.err
	case <-time.After(timeout):
		tb.Fatalf("Run did not return within %v", timeout)
		return nil
	}
}

func startPlugin(tb testing.TB, opts kubeletplugin.Options, devices []annotation.Device) *running {
	tb.Helper()
	p, err := kubeletplugin.New(opts)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	p.SetDevices(devices)
	_, ctx := ktesting.NewTestContext(tb)
	ctx, cancel := context.WithCancel(ctx)
	r := &running{Plugin: p, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- p.Run(ctx) }()
	tb.Cleanup(func() {
		if r.ended { // the test read Run's error with wait
			return
		}
		if err := r.stop(); err != nil {
			tb.Errorf("Run: %v", err)
		}
	})
	return r
}

// waitForResources polls the device manager until the resource reads capacity/allocatable.
func waitForResources(tb testing.TB, dm *kubeletpeer.DeviceManager, capacity, allocatable int64) {
	tb.Helper()
	harness.WaitForResources(tb, dm, resource, capacity, allocatable)
}
