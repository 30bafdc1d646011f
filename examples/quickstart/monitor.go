package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hamireg/hamireg/monitor/monitortest"
)

const (
	// pluginMetricsBind is the device plugin's --metrics-bind-address here: a free loopback
	// port, learnt from its log.
	pluginMetricsBind = "127.0.0.1:0"
	// monitorPeriod is the device plugin's --monitor-period here (HAMi's 5s).
	monitorPeriod = 200 * time.Millisecond
	// demoCtr is the demo pod's container.
	demoCtr = "cuda"
)

// demoUsage is what HAMi-core would write into the demo container's region after its first
// CUDA calls: memory used and SM utilisation (%) per GPU, in the container's order.
var demoUsage = []struct{ usedMiB, sm uint64 }{{3072, 25}, {1024, 10}}

// servingRE is the device plugin's log line naming its metrics address.
var servingRE = regexp.MustCompile(`"Serving metrics and probes" address="(http://[^"]+)"`)

// pluginMetrics returns the running device plugin's /metrics URL, read from its log.
func (q *quickstart) pluginMetrics(ctx context.Context) (string, error) {
	if q.pluginMetricsURL != "" {
		return q.pluginMetricsURL, nil
	}
	err := q.poll(ctx, func() bool {
		b, err := os.ReadFile(q.plugin.LogPath())
		if err != nil {
			return false
		}
		if m := servingRE.FindSubmatch(b); m != nil {
			q.pluginMetricsURL = string(m[1]) + "/metrics"
			return true
		}
		return false
	})
	if err != nil {
		return "", failed(fmt.Errorf("the device plugin logged no \"Serving metrics and probes\": %w", err), "deviceplugin", q.plugin)
	}
	return q.pluginMetricsURL, nil
}

// nodeMonitor is the second half of step 4: the demo container's HAMi-core region written
// where the device plugin's Allocate made its folder (as HAMi-core does at the container's
// first CUDA call; no container runs here), and the node monitor's families for it on the
// device plugin's /metrics.
func (q *quickstart) nodeMonitor(ctx context.Context, hc *http.Client) error {
	if len(q.demoGPUs) != len(demoUsage) {
		return fmt.Errorf("pod %s/%s has %d GPUs, want %d", demoNamespace, demoPod, len(q.demoGPUs), len(demoUsage))
	}
	cacheID := strings.TrimSuffix(path.Base(q.demoEnv["CUDA_DEVICE_MEMORY_SHARED_CACHE"]), ".cache")
	if cacheID == "" || cacheID == "." || cacheID == "/" {
		return fmt.Errorf("pod %s/%s: Allocate returned no CUDA_DEVICE_MEMORY_SHARED_CACHE", demoNamespace, demoPod)
	}
	gpus := make([]monitortest.GPU, len(q.demoGPUs))
	for i, id := range q.demoGPUs {
		gpus[i] = monitortest.GPU{UUID: id, Limit: demoMemMiB << 20, Used: demoUsage[i].usedMiB << 20, SMUtil: demoUsage[i].sm, SMLimit: demoCores}
	}
	root := filepath.Join(q.hook, "vgpu")
	file, err := monitortest.WriteContainer(root, q.demoUID, demoCtr, cacheID, monitortest.Region(int32(os.Getpid()), gpus...))
	if err != nil {
		return fmt.Errorf("write the region of %s/%s container %s: %w", demoNamespace, demoPod, demoCtr, err)
	}
	url, err := q.pluginMetrics(ctx)
	if err != nil {
		return err
	}
	t := time.Now()
	var lines []string
	lastErr := errors.New("not scraped yet")
	err = q.poll(ctx, func() bool {
		body, err := scrape(ctx, hc, url)
		if err != nil {
			lastErr = err
			return false
		}
		lines, lastErr = usageLines(body, demoNamespace, demoPod, demoCtr, q.demoGPUs)
		return lastErr == nil
	})
	if err != nil {
		return failed(fmt.Errorf("scrape %s: %w (last: %w)", url, err, lastErr), "deviceplugin", q.plugin)
	}
	q.out.item("region", "container %s's HAMi-core region, written here as HAMi-core writes it at the container's first CUDA call (no container runs): %s", demoCtr, file)
	q.out.item("monitor", "GET %s: the device plugin's node monitor (HAMi's vGPUmonitor) adopted it in %v; hami_vgpu_memory_used_bytes, hami_vgpu_memory_limit_bytes, hami_container_device_utilization_ratio:", url, round(time.Since(t)))
	for _, l := range lines {
		q.out.item("usage", "%s", l)
	}
	return nil
}

// usageLines reads from a Prometheus text exposition the node monitor's memory used, memory
// limit and SM utilisation of container ctr of pod namespace/name on each of gpus, one line
// per GPU in that order; an error names what is missing.
func usageLines(body, namespace, pod, ctr string, gpus []string) ([]string, error) {
	type usage struct{ used, limit, sm float64 }
	have := map[string]*usage{}
	seen := map[string]int{}
	for line := range strings.SplitSeq(body, "\n") {
		name, rest, ok := strings.Cut(line, "{")
		if !ok || !slices.Contains([]string{"hami_vgpu_memory_used_bytes", "hami_vgpu_memory_limit_bytes", "hami_container_device_utilization_ratio"}, name) {
			continue
		}
		labelText, valueText, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		labels := parseLabels(labelText)
		if labels["namespace"] != namespace || labels["pod"] != pod || labels["container"] != ctr {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(valueText), 64)
		if err != nil {
			continue
		}
		id := labels["device_uuid"]
		u := have[id]
		if u == nil {
			u = &usage{}
			have[id] = u
		}
		switch name {
		case "hami_vgpu_memory_used_bytes":
			u.used = v
		case "hami_vgpu_memory_limit_bytes":
			u.limit = v
		default:
			u.sm = v
		}
		seen[id]++
	}
	var lines []string
	for _, id := range gpus {
		u := have[id]
		if u == nil || seen[id] < 3 {
			return nil, fmt.Errorf("%s/%s container %s on %s: %d of the 3 families", namespace, pod, ctr, id, seen[id])
		}
		lines = append(lines, fmt.Sprintf("%s/%s %s %s: %.0f MiB of %.0f MiB, SM %.0f %%", namespace, pod, ctr, id, u.used/(1<<20), u.limit/(1<<20), u.sm))
	}
	return lines, nil
}

// parseLabels reads a sample's label pairs (a="x",b="y"), unescaping their values.
func parseLabels(s string) map[string]string {
	out := map[string]string{}
	for s != "" {
		name, rest, ok := strings.Cut(s, `="`)
		if !ok {
			break
		}
		var b strings.Builder
		i := 0
		for ; i < len(rest) && rest[i] != '"'; i++ {
			if rest[i] == '\\' && i+1 < len(rest) {
				i++
				if rest[i] == 'n' {
					b.WriteByte('\n')
					continue
				}
			}
			b.WriteByte(rest[i])
		}
		out[strings.TrimSpace(name)] = b.String()
		if i >= len(rest) {
			break
		}
		s = strings.TrimPrefix(rest[i+1:], ",")
	}
	return out
}
