package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// metrics is step 4: examples/extender's /metrics scraped, HAMi's gauges for the demo pod's
// GPUs, its containers and the quota of step 3; then the node monitor's usage of the demo
// container on the device plugin's /metrics.
func (q *quickstart) metrics(ctx context.Context) error {
	q.out.step(4, time.Since(q.start), "the extender's /metrics and the node monitor's: HAMi's gauges (its Grafana dashboard, HAMi-WebUI)")
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	if err := q.extenderMetrics(ctx, hc); err != nil {
		return err
	}
	return q.nodeMonitor(ctx, hc)
}

// extenderMetrics is step 4's scrape of the extender.
func (q *quickstart) extenderMetrics(ctx context.Context, hc *http.Client) error {
	if q.metricsURL == "" {
		q.out.item("metrics", "none: the Deployment sets --metrics-bind-address empty")
		return nil
	}
	var lines []string
	var total int
	var lastErr error
	err := q.poll(ctx, func() bool {
		body, err := scrape(ctx, hc, q.metricsURL)
		if err != nil {
			lastErr = err
			return false
		}
		var gpu, vgpu, quota []string
		gpu, vgpu, quota, total = hamiLines(body, q.demoGPUs, demoNamespace, demoPod, quotaNamespace)
		lines = slices.Concat(gpu, vgpu, quota)
		lastErr = fmt.Errorf("%d hami_gpu_memory_allocated_bytes, %d hami_vgpu_memory_allocated_bytes, %d hami_resource_quota_used of the samples wanted", len(gpu), len(vgpu), len(quota))
		return len(gpu) == len(q.demoGPUs) && len(vgpu) == len(q.demoGPUs) && len(quota) > 0
	})
	if err != nil {
		return failed(fmt.Errorf("scrape %s: %w (last: %w)", q.metricsURL, err, lastErr), "extender", q.extender)
	}
	q.out.item("scrape", "GET %s: %d samples of HAMi's families; those of pod %s/%s's GPUs and of namespace %s:", q.metricsURL, total, demoNamespace, demoPod, quotaNamespace)
	for _, l := range lines {
		q.out.item("", "%s", l)
	}
	return nil
}

// scrape returns the body of a GET of url.
func scrape(ctx context.Context, hc *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", resp.Status, b)
	}
	return string(b), nil
}

// hamiLines picks from a Prometheus text exposition the samples of hami_gpu_memory_allocated_bytes
// for the GPUs given, of hami_vgpu_memory_allocated_bytes for the pod, and of
// hami_resource_quota_used for quotaNS, each sorted; it also returns how many hami_ samples
// there are in all.
func hamiLines(body string, gpus []string, namespace, pod, quotaNS string) (gpu, vgpu, quota []string, total int) {
	for line := range strings.SplitSeq(body, "\n") {
		if !strings.HasPrefix(line, "hami_") {
			continue
		}
		total++
		name, labels, _ := strings.Cut(line, "{")
		switch name {
		case "hami_gpu_memory_allocated_bytes":
			if slices.ContainsFunc(gpus, func(id string) bool { return strings.Contains(labels, `device_uuid="`+id+`"`) }) {
				gpu = append(gpu, line)
			}
		case "hami_vgpu_memory_allocated_bytes":
			if strings.Contains(labels, `namespace="`+namespace+`"`) && strings.Contains(labels, `pod="`+pod+`"`) {
				vgpu = append(vgpu, line)
			}
		case "hami_resource_quota_used":
			if strings.Contains(labels, `namespace="`+quotaNS+`"`) {
				quota = append(quota, line)
			}
		}
	}
	slices.Sort(gpu)
	slices.Sort(vgpu)
	slices.Sort(quota)
	return gpu, vgpu, quota, total
}
