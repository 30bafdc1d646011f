package kubeletplugin_test

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/kubeletplugin"
)

// BenchmarkKubeletRestart restarts the kubelet's device manager (max(b.N, 20) times) and
// measures, for each restart, the time from the new kubelet.sock appearing (fsnotify CREATE)
// to the device manager reporting the plugin's devices as allocatable again. Goal: p99 < 1 s.
func BenchmarkKubeletRestart(b *testing.B) {
	dm := startDeviceManager(b)
	p := startPlugin(b, kubeletplugin.Options{PluginDir: dm.Dir()}, gpus(true, true))
	waitForResources(b, dm, 2*split, 2*split)

	w, err := fsnotify.NewWatcher()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = w.Close() }()
	if err := w.Add(dm.Dir()); err != nil {
		b.Fatal(err)
	}
	kubeletSock := filepath.Join(dm.Dir(), kubeletplugin.KubeletSocketName)

	restarts := max(b.N, 20)
	lat := make([]time.Duration, 0, restarts)
	b.ResetTimer()
	for range restarts {
		// Drain events of the previous round.
		for len(w.Events) > 0 {
			<-w.Events
		}
		if err := dm.Restart(b.Context()); err != nil {
			b.Fatalf("kubelet restart: %v", err)
		}
		var created time.Time
		for created.IsZero() {
			select {
			case ev := <-w.Events:
				if ev.Name == kubeletSock && ev.Has(fsnotify.Create) {
					created = time.Now()
				}
			case err := <-w.Errors:
				b.Fatal(err)
			case <-time.After(20 * time.Second):
				b.Fatal("no CREATE of kubelet.sock")
			}
		}
		seen := pollAllocatable(b, dm, 2*split)
		lat = append(lat, seen.Sub(created))
	}
	b.StopTimer()
	slices.Sort(lat)
	pct := func(q float64) float64 {
		i := int(q*float64(len(lat))+0.5) - 1
		return float64(lat[min(max(i, 0), len(lat)-1)].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "reregister-p50-ms")
	b.ReportMetric(pct(0.99), "reregister-p99-ms")
	b.ReportMetric(float64(len(lat)), "restarts")
	// The device manager sees the devices before Register returns to the plugin.
	deadline := time.Now().Add(10 * time.Second)
	for p.Stats().Registrations < uint64(restarts)+1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if st := p.Stats(); st.Registrations < uint64(restarts)+1 {
		b.Errorf("Registrations = %d, want >= %d", st.Registrations, restarts+1)
	}
}

// pollAllocatable returns when the device manager reports want allocatable devices.
func pollAllocatable(b *testing.B, dm *kubeletpeer.DeviceManager, want int64) time.Time {
	b.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		r, err := dm.Capacity(b.Context())
		if err != nil {
			b.Fatal(err)
		}
		if r.Allocatable[resource] == want {
			return time.Now()
		}
		time.Sleep(2 * time.Millisecond)
	}
	b.Fatalf("the device manager did not see the plugin again within 20 s; log:\n%s", dm.LogTail(40))
	return time.Time{}
}
