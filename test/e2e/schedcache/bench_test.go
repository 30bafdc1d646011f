package schedcache_test

import (
	"slices"
	"testing"
	"time"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/schedcache"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// BenchmarkVisibility measures how long a PATCH of the register annotation takes to show in
// the cache: from sending the PATCH to Cache.Node returning the new devices, through the real
// apiserver, watch and informer. The tick is an hour, so only the event path counts (HAMi:
// up to 15 s, or never in v2.9.0 when allocatable does not change).
func BenchmarkVisibility(b *testing.B) {
	test := harness.UniqueName("visibility")
	r := startReplica(b, cp.AdminClient(), test, schedcache.Options{Tick: time.Hour}, schedcache.HandshakerOptions{}, nil)
	name := test + "-n"
	createNode(b, test, name, map[string]string{annotation.KeyNVIDIARegister: annotation.Encode(gpus(8, name, 1000))}, 80)
	r.waitState(b, name, schedcache.StateRegistered)
	var samples []time.Duration
	mem := int32(1000)
	for b.Loop() {
		mem++
		value := annotation.Encode(gpus(8, name, mem))
		start := time.Now()
		agentPatch(b, name, map[string]*string{annotation.KeyNVIDIARegister: &value})
		for {
			n, _ := r.cache.Node(name)
			if d := n.Devices(annotation.NVIDIA()); len(d) == 8 && d[0].Devmem == mem {
				break
			}
			if time.Since(start) > 15*time.Second {
				b.Fatalf("devmem %d not visible after 15 s", mem)
			}
			time.Sleep(100 * time.Microsecond)
		}
		samples = append(samples, time.Since(start))
	}
	slices.Sort(samples)
	pct := func(p float64) float64 {
		i := int(p*float64(len(samples))+0.5) - 1
		i = max(0, min(i, len(samples)-1))
		return float64(samples[i].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "visible-p50-ms")
	b.ReportMetric(pct(0.99), "visible-p99-ms")
	b.ReportMetric(pct(1), "visible-max-ms")
}
