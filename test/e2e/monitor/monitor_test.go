package monitor_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// diffFamilies compares the container families of fams with want and returns the first
// difference, "" when there is none.
func diffFamilies(fams map[string]*dto.MetricFamily, want map[string]series) string {
	for _, f := range containerFamilies {
		if d := cmp.Diff(want[f], got(fams, f)); d != "" {
			return fmt.Sprintf("%s (-want +got):\n%s", f, d)
		}
	}
	return ""
}

// TestMonitorServesRegions: three pods admitted through the kubelet (two GPU containers;
// an init container and a container; one container) get their folders from the plugin's
// Allocate; once each container's region is written, /metrics serves HAMi v2.10.0's
// per-container families with exactly the values of HAMi's rule for every container, the
// init container included (the SDK's rule), the last-kernel family for each, the host
// families for the 8 GPUs, and hamireg_monitor_regions{state="ok"} 5.
func TestMonitorServesRegions(t *testing.T) {
	n := startNode(t)
	var cs []*ctrRegion
	cs = append(cs, n.schedule(t, "two-gpu", []harness.Ctr{{Name: "trainer", GPUs: 1}, {Name: "evaluator", GPUs: 2}},
		allocation.PodDevices{{n.Share(0, 3000, 30)}, {n.Share(1, 2000, 20), n.Share(2, 4000, 20)}}, 50, 17)...)
	cs = append(cs, n.schedule(t, "with-init", []harness.Ctr{{Name: "warmup", Init: true, GPUs: 1}, {Name: "main", GPUs: 1}},
		allocation.PodDevices{{n.Share(3, 1000, 10)}, {n.Share(4, 8000, 40)}}, 25, 33)...)
	cs = append(cs, n.schedule(t, "plain", []harness.Ctr{{Name: "cuda", GPUs: 1}},
		allocation.PodDevices{{n.Share(5, 20000, 100)}}, 90, 99)...)
	if len(cs) != 5 {
		t.Fatalf("%d GPU containers, want 5", len(cs))
	}
	for _, c := range cs {
		c.write(t, n.root)
	}
	want := expected(cs)
	if len(want[famUsed]) != 6 {
		t.Fatalf("%d container devices expected, want 6", len(want[famUsed]))
	}
	var fams map[string]*dto.MetricFamily
	poll(t, "the regions on /metrics", func() string {
		code, f, err := scrape(t.Context(), n.url)
		if err != nil {
			return fmt.Sprintf("scrape: %d %v", code, err)
		}
		fams = f
		return diffFamilies(f, want)
	})
	// Last kernel 3 s ago: one series per container device, a non-negative age.
	lk := got(fams, famLastKernel)
	for _, c := range cs {
		for i := range c.gpus {
			v, ok := lk[key(ctrLabels(c, i))]
			if !ok || v < 0 {
				t.Errorf("%s of %s/%s device %d = %v (present %v), want a non-negative age", famLastKernel, c.pod.Name, c.name, i, v, ok)
			}
		}
	}
	if len(lk) != len(want[famUsed]) {
		t.Errorf("%s has %d series, want %d", famLastKernel, len(lk), len(want[famUsed]))
	}
	for _, f := range hostFamilies {
		uuids := map[string]bool{}
		for _, m := range fams[f].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "device_uuid" {
					uuids[l.GetValue()] = true
				}
				if l.GetName() == "node" && l.GetValue() != n.Name {
					t.Errorf("%s: node=%q, want %q", f, l.GetValue(), n.Name)
				}
			}
		}
		for _, d := range n.GPUs {
			if !uuids[d.ID] {
				t.Errorf("%s: no series of GPU %s", f, d.ID)
			}
		}
		if len(fams[f].GetMetric()) != harness.SimulatedGPUs {
			t.Errorf("%s has %d series, want %d", f, len(fams[f].GetMetric()), harness.SimulatedGPUs)
		}
	}
	if st := regionStates(fams); st["ok"] != 5 {
		t.Errorf("%s = %v, want ok 5", famRegions, st)
	}
	if !n.Plugin.Running() {
		t.Fatalf("deviceplugin exited: %v", n.Plugin.ExitError())
	}
}

// TestMonitorSurvivesBadRegions: with five containers adopted, three rounds of damage while
// /metrics is scraped without pause: one region truncated to 4096 bytes, another replaced
// by random bytes, a third's folder deleted. Every scrape answers 200 with the two
// untouched containers' series exactly right; once the monitor's next scan has seen the
// damage, hamireg_monitor_regions is ok 2, unknown_layout 1 (the truncated file) and
// not_initialized 1 (the garbage), the damaged containers serve no
// series at all (never stale values); rewriting the three regions brings all five back;
// the plugin keeps running (and exits 0 at the end).
func TestMonitorSurvivesBadRegions(t *testing.T) {
	n := startNode(t)
	var cs []*ctrRegion
	for i := range 5 {
		cs = append(cs, n.schedule(t, fmt.Sprintf("victim-%d", i), []harness.Ctr{{Name: "cuda", GPUs: 1}},
			allocation.PodDevices{{n.Share(uint(i), 4000, 40)}}, uint64(10+10*i), uint64(5*i))...)
	}
	paths := make([]string, len(cs))
	for i, c := range cs {
		paths[i] = c.write(t, n.root)
	}
	all := expected(cs)
	poll(t, "the five regions on /metrics", func() string {
		code, f, err := scrape(t.Context(), n.url)
		if err != nil {
			return fmt.Sprintf("scrape: %d %v", code, err)
		}
		return diffFamilies(f, all)
	})

	// The scraper checks every answer against the untouched containers (3 and 4).
	untouched := expected(cs[3:])
	stop := make(chan struct{})
	var (
		wg              sync.WaitGroup
		scrapes, faults atomic.Int64
		badSeen         sync.Map // the non-ok states of hamireg_monitor_regions seen
	)
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			code, f, err := scrape(t.Context(), n.url)
			scrapes.Add(1)
			if err != nil || code != http.StatusOK {
				faults.Add(1)
				t.Errorf("scrape during damage: %d %v", code, err)
				continue
			}
			for st, v := range regionStates(f) {
				if st != "ok" && v > 0 {
					badSeen.Store(st, true)
				}
			}
			for _, fam := range containerFamilies {
				g := got(f, fam)
				for k, v := range untouched[fam] {
					if gv, ok := g[k]; !ok || gv != v {
						faults.Add(1)
						t.Errorf("scrape during damage: %s{%s} = %v (present %v), want %v", fam, k, gv, ok, v)
					}
				}
			}
		}
	})
	var once sync.Once
	halt := func() {
		once.Do(func() { close(stop) })
		wg.Wait()
	}
	defer halt()

	garbage := make([]byte, 1<<20)
	for round := range 3 {
		if err := os.Truncate(paths[0], 4096); err != nil {
			t.Fatal(err)
		}
		for i := range garbage {
			garbage[i] = byte(rand.Uint32())
		}
		garbage[0] ^= 0xff // never HAMi-core's magic by chance
		if err := os.WriteFile(paths[1]+".tmp", garbage, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(paths[1]+".tmp", paths[1]); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(cs[2].folder(n.root)); err != nil {
			t.Fatal(err)
		}
		// Once the monitor's next scan has seen the damage, only the two untouched regions are
		// read: the damaged containers serve no series (no stale values), the others theirs.
		poll(t, fmt.Sprintf("round %d: the damage on /metrics", round), func() string {
			code, f, err := scrape(t.Context(), n.url)
			if err != nil {
				return fmt.Sprintf("scrape: %d %v", code, err)
			}
			// The truncated file (4096 bytes) matches no layout, the garbage has no magic;
			// the deleted folder is gone.
			if st := regionStates(f); st["ok"] != 2 || st["unknown_layout"] != 1 || st["not_initialized"] != 1 {
				return fmt.Sprintf("%s = %v, want ok 2, unknown_layout 1, not_initialized 1", famRegions, st)
			}
			return diffFamilies(f, untouched)
		})
		for i := range 3 {
			paths[i] = cs[i].write(t, n.root)
		}
		poll(t, fmt.Sprintf("round %d: the rewritten regions on /metrics", round), func() string {
			code, f, err := scrape(t.Context(), n.url)
			if err != nil {
				return fmt.Sprintf("scrape: %d %v", code, err)
			}
			if st := regionStates(f); st["ok"] != 5 {
				return fmt.Sprintf("%s = %v, want ok 5", famRegions, st)
			}
			return diffFamilies(f, all)
		})
		if !n.Plugin.Running() {
			t.Fatalf("deviceplugin exited: %v", n.Plugin.ExitError())
		}
	}
	halt()
	if scrapes.Load() < 10 {
		t.Errorf("only %d scrapes ran during the damage", scrapes.Load())
	}
	var seen []string
	badSeen.Range(func(k, _ any) bool { seen = append(seen, k.(string)); return true })
	t.Logf("%d scrapes during the damage, %d faults; non-ok region states seen: %v", scrapes.Load(), faults.Load(), seen)
}
