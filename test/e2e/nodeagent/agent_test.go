package nodeagent_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// TestRegistersAndTracksHealth runs the built plugin on a simulated DGX A100: the kubelet's
// own ManagerImpl counts 8 GPUs x 10, the annotation is written once and before the kubelet
// registration; an XID on GPU 0 (SIGUSR1) takes its 10 devices out of allocatable and marks
// it unhealthy in the annotation, and after the quiet period both channels have it back;
// SIGTERM ends the process with status 0 (checked by the fixture's cleanup).
func TestRegistersAndTracksHealth(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "--health-quiet-period=3s")
	gpu0 := f.ByIndex[0]
	for _, d := range f.GPUs {
		if d.Count != split || !d.Health || d.Mode != "hami-core" || !strings.Contains(d.Type, "A100-SXM4-40GB") || d.Devmem != 40960 || d.Devcore != 100 {
			t.Errorf("registered device %+v: want count %d, healthy, hami-core, an A100 of 40960 MiB, devcore 100", d, split)
		}
	}
	// The kubelet counts the devices (ListAndWatch starts while Register is in flight) before
	// the plugin logs that Register returned: wait for that line.
	var log string
	harness.Eventually(t, "the plugin to log its kubelet registration", 10*time.Second, func() bool {
		log = f.Plugin.Log(t)
		return strings.Contains(log, "Registered device plugin with the kubelet")
	})
	// Both counts: the writes the plugin logged (HAMi's line, before every patch, changing
	// or not) and the changes a watch of the Node saw (its event may trail the GET).
	harness.Eventually(t, "the watch to see the annotation", 10*time.Second, func() bool { return f.RegisterChanges() >= 1 })
	if n, c := strings.Count(log, updateLine), f.RegisterChanges(); n != 1 || c != 1 {
		t.Errorf("%d annotation writes logged, %d changes seen; want 1 and 1:\n%s", n, c, log)
	}
	if w, r := strings.Index(log, updateLine), strings.Index(log, "Registered device plugin with the kubelet"); w < 0 || r < w {
		t.Errorf("the kubelet registration (at %d) did not follow the annotation write (at %d)", r, w)
	}

	healthOf := func(uuid string) (healthy, found bool) {
		for _, d := range f.Registered(t) {
			if d.ID == uuid {
				return d.Health, true
			}
		}
		return false, false
	}
	f.Plugin.Signal(t, syscall.SIGUSR1)
	took := harness.Eventually(t, "GPU 0 unhealthy in the annotation", 10*time.Second, func() bool {
		h, ok := healthOf(gpu0)
		return ok && !h
	})
	harness.WaitForResources(t, f.DM, resourceName, gpus*split, (gpus-1)*split)
	t.Logf("XID seen in the annotation after %v", took)
	for _, d := range f.Registered(t) {
		if d.ID != gpu0 && !d.Health {
			t.Errorf("GPU %s unhealthy too", d.ID)
		}
	}

	harness.Eventually(t, "GPU 0 healthy again in the annotation", 30*time.Second, func() bool {
		h, ok := healthOf(gpu0)
		return ok && h
	})
	harness.WaitForResources(t, f.DM, resourceName, gpus*split, gpus*split)
	if n := strings.Count(f.Plugin.Log(t), updateLine); n != 3 {
		t.Errorf("%d annotation writes logged, want 3 (registration, unhealthy, healthy again)", n)
	}
	harness.Eventually(t, "the watch to see 3 annotation values", 10*time.Second, func() bool { return f.RegisterChanges() >= 3 })
	if c := f.RegisterChanges(); c != 3 {
		t.Errorf("%d annotation changes seen, want 3", c)
	}
	if v := cp.GetNode(t, f.Name).Annotations[annotation.KeyNVIDIARegister]; v == "" {
		t.Error("annotation gone")
	}
	f.Plugin.Stop(t)
	if log := f.Plugin.Log(t); !strings.Contains(log, "Device plugin stopped") {
		t.Errorf("no clean stop in the log:\n%s", log)
	}
	// The plugin ended its ListAndWatch stream: the kubelet marks the devices unhealthy.
	harness.WaitForResources(t, f.DM, resourceName, gpus*split, 0)
}
