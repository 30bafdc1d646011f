package monitor

import (
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// feedbackCollector serves the SDK's priority-feedback families (Options.FeedbackMetrics)
// from the last round's state.
type feedbackCollector struct {
	s                                    *feedbackState
	priority, blocked, limitOn, mismatch *prometheus.Desc
	mismatches, writeErrors              *prometheus.Desc
}

var _ prometheus.Collector = (*feedbackCollector)(nil)

// feedbackCollector returns the collector of the FeedbackMetrics families, read from the
// last feedback round (no container series before the first round). The families:
//
//	hamireg_monitor_container_priority{namespace,pod,container,source}   source "region" or "spec"
//	hamireg_monitor_container_blocked{namespace,pod,container}           1: recent_kernel < 0
//	hamireg_monitor_container_utilization_switch{namespace,pod,container}
//	hamireg_monitor_priority_mismatch{namespace,pod,container,region,spec}  1 per mismatch
//	hamireg_monitor_priority_mismatches_total, hamireg_monitor_feedback_write_errors_total
func (m *Monitor) feedbackCollector() prometheus.Collector {
	ctr := []string{"namespace", "pod", "container"}
	return &feedbackCollector{
		s: &m.fb,
		priority: prometheus.NewDesc("hamireg_monitor_container_priority",
			`Priority of the container's HAMi-core region (source="region") and of its pod spec (source="spec"); 0 is high.`,
			append(slices.Clone(ctr), "source"), nil),
		blocked: prometheus.NewDesc("hamireg_monitor_container_blocked",
			"1 when the priority feedback blocks the container (recent_kernel -1: a higher-priority container was active on one of its GPUs).",
			ctr, nil),
		limitOn: prometheus.NewDesc("hamireg_monitor_container_utilization_switch",
			"The region's utilization_switch after the priority feedback: 1 when HAMi-core enforces the container's core limit.",
			ctr, nil),
		mismatch: prometheus.NewDesc("hamireg_monitor_priority_mismatch",
			"1 for a container whose region's priority differs from its pod spec's (nvidia.com/priority, else CUDA_TASK_PRIORITY, else 1).",
			append(slices.Clone(ctr), "region", "spec"), nil),
		mismatches: prometheus.NewDesc("hamireg_monitor_priority_mismatches_total",
			"Priority mismatches reported, one per container per change of either value.", nil, nil),
		writeErrors: prometheus.NewDesc("hamireg_monitor_feedback_write_errors_total",
			"Priority feedback writes that failed (the region changed or could not be written); the container sat the round out.", nil, nil),
	}
}

// Describe sends the families' descriptors.
func (c *feedbackCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.priority, c.blocked, c.limitOn, c.mismatch, c.mismatches, c.writeErrors} {
		ch <- d
	}
}

// fbSeries is one container's series: several regions of one container (a container that
// uses two claims) are merged, blocked and switch when any of them is, the highest region
// priority (the lowest number).
type fbSeries struct {
	regionPriority   int32
	specPriority     int32
	specKnown        bool
	blocked, limitOn bool
	mismatch         []int32 // the region priorities that differ from the spec's
}

// Collect sends the last round's series.
func (c *feedbackCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	s.mu.Lock()
	type id struct{ ns, pod, ctr string }
	series := make(map[id]*fbSeries, len(s.rows))
	var order []id
	for i := range s.rows {
		r := &s.rows[i]
		k := id{r.pod.Namespace, r.pod.Name, r.name}
		e := series[k]
		if e == nil {
			e = &fbSeries{regionPriority: r.regionPriority, specPriority: r.specPriority, specKnown: r.specKnown}
			series[k] = e
			order = append(order, k)
		}
		e.regionPriority = min(e.regionPriority, r.regionPriority)
		e.blocked = e.blocked || r.recentKernel < 0
		e.limitOn = e.limitOn || r.utilizationSwitch != 0
		if r.specKnown && r.regionPriority != r.specPriority && !slices.Contains(e.mismatch, r.regionPriority) {
			e.mismatch = append(e.mismatch, r.regionPriority)
		}
	}
	mismatches, writeErrors := s.mismatches, s.writeErrors
	s.mu.Unlock()

	for _, k := range order {
		e := series[k]
		ch <- prometheus.MustNewConstMetric(c.priority, prometheus.GaugeValue, float64(e.regionPriority), k.ns, k.pod, k.ctr, "region")
		if e.specKnown {
			ch <- prometheus.MustNewConstMetric(c.priority, prometheus.GaugeValue, float64(e.specPriority), k.ns, k.pod, k.ctr, "spec")
		}
		ch <- prometheus.MustNewConstMetric(c.blocked, prometheus.GaugeValue, bool01(e.blocked), k.ns, k.pod, k.ctr)
		ch <- prometheus.MustNewConstMetric(c.limitOn, prometheus.GaugeValue, bool01(e.limitOn), k.ns, k.pod, k.ctr)
		for _, p := range e.mismatch {
			ch <- prometheus.MustNewConstMetric(c.mismatch, prometheus.GaugeValue, 1, k.ns, k.pod, k.ctr,
				strconv.FormatInt(int64(p), 10), strconv.FormatInt(int64(e.specPriority), 10))
		}
	}
	ch <- prometheus.MustNewConstMetric(c.mismatches, prometheus.CounterValue, float64(mismatches))
	ch <- prometheus.MustNewConstMetric(c.writeErrors, prometheus.CounterValue, float64(writeErrors))
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
