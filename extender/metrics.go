package extender

import (
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	"k8s.io/utils/clock"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/schedcache"
	"github.com/hamireg/hamireg/usage"
)

// HAMi's scheduler families live in package usage, beside the tracker they read; the extender
// registers them ([usage.NewHAMiCollector]). These names stay for the extender's users.
const (
	// MetricsZone is usage.MetricsZone.
	MetricsZone = usage.MetricsZone
	// DefaultMetricsBindAddress is HAMi's --metrics-bind-address.
	DefaultMetricsBindAddress = ":9395"
	// MetricsPrefix starts the name of every operational metric of the SDK's own, which are not
	// HAMi's: hamireg_extender_*.
	MetricsPrefix = "hamireg_"
)

// BuildInfo labels hami_build_info (usage.BuildInfo).
type BuildInfo = usage.BuildInfo

// QuotaUsage is one entry of HAMi's quota gauges (usage.QuotaUsage).
type QuotaUsage = usage.QuotaUsage

// DefaultBuildInfo is usage.DefaultBuildInfo: the SDK's build as the running binary records it.
func DefaultBuildInfo() BuildInfo { return usage.DefaultBuildInfo() }

// registeredNodes is the node source of HAMi's families: the nodes c has registered for vendor.
func registeredNodes(c *schedcache.Cache, vendor string) usage.Registered {
	return func() iter.Seq2[string, []annotation.Device] { return c.Snapshot().Registered(vendor) }
}

// Filter results, the values of the result label of hamireg_extender_filter_duration_seconds.
const (
	filterPlaced        = "placed"
	filterUnschedulable = "unschedulable"
	filterNoGPU         = "no_gpu"
	filterError         = "error"
	// filterSimulated is a simulation (ExtenderArgs.Nodes) that found request Nodes that fit
	// (one that found none is unschedulable).
	filterSimulated = "simulated"
)

// metrics are the extender's collectors: HAMi's families and its own operational ones. A nil
// *metrics records nothing.
type metrics struct {
	clock          clock.PassiveClock // measures the durations
	hami           prometheus.Collector
	filterDuration *prometheus.HistogramVec
	bindDuration   *prometheus.HistogramVec
	filterLockWait prometheus.Histogram
	nodeLockWait   prometheus.Histogram
	decodeFailures prometheus.Counter
}

// newMetrics registers HAMi's families, hami_build_info and the operational metrics with
// reg; a nil reg gives nil.
func newMetrics(reg prometheus.Registerer, e *Extender) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	o := e.opts
	m := &metrics{
		clock: o.Clock,
		hami: usage.NewHAMiCollector(e.usage.Tracker, registeredNodes(e.cache, o.Vendor.Name),
			usage.MetricsOptions{Vendor: o.Vendor.Name, Config: o.Config, Legacy: o.LegacyMetrics}),
		filterDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "hamireg", Subsystem: "extender", Name: "filter_duration_seconds",
			Help:    "Time a filter call took, by result: placed, unschedulable (no candidate fits), no_gpu (the pod asks for none), error (the pod patch failed), simulated (whole Nodes in the request, some fit, nothing placed).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"result"}),
		bindDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "hamireg", Subsystem: "extender", Name: "bind_duration_seconds",
			Help:    "Time a bind call took, node lock wait included, by result: ok, error.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{"result"}),
		filterLockWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "hamireg", Subsystem: "extender", Name: "filter_lock_wait_seconds",
			Help:    "Time a filter waited for the other filters in flight (decisions are serialised so that two never choose the same capacity).",
			Buckets: prometheus.ExponentialBuckets(0.00001, 4, 10),
		}),
		nodeLockWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "hamireg", Subsystem: "extender", Name: "node_lock_wait_seconds",
			Help:    "Time a bind took to get the node lock (waiting for the binds of other pods to the same node and their Allocate), successful or not.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
		decodeFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "hamireg", Subsystem: "extender", Name: "annotation_decode_failures_total",
			Help: "Pod device annotations (hami.io/vgpu-devices-allocated) that did not decode: the pod's usage is not counted.",
		}),
	}
	for _, r := range []string{filterPlaced, filterUnschedulable, filterNoGPU, filterError, filterSimulated} {
		m.filterDuration.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "error"} {
		m.bindDuration.WithLabelValues(r)
	}
	build := o.BuildInfo
	if build == (BuildInfo{}) {
		build = DefaultBuildInfo()
	}
	pods := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "hamireg", Subsystem: "extender", Name: "pods",
		Help: "Pods whose GPUs count against a node (from the informer, or assumed at filter before it caught up).",
	}, func() float64 { return float64(e.Stats().Pods) })
	collectors := []prometheus.Collector{m.hami, usage.NewBuildInfoCollector(build), m.filterDuration, m.bindDuration, m.filterLockWait,
		m.nodeLockWait, m.decodeFailures, pods}
	for i, c := range collectors {
		if err := reg.Register(c); err != nil {
			for _, done := range collectors[:i] {
				reg.Unregister(done)
			}
			if _, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
				return nil, fmt.Errorf("register metrics: %w: %w (one extender per Registerer)", ErrInvalidOptions, err)
			}
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	e.usage.decodeFailed = m.decodeFailures.Inc
	return m, nil
}

// filtered records a filter call for pod that started at start.
func (m *metrics) filtered(start time.Time, pod *corev1.Pod, cfg allocation.Config, res *extenderv1.ExtenderFilterResult) {
	if m == nil {
		return
	}
	result := filterPlaced
	switch {
	case res == nil || res.Error != "":
		result = filterError
	case !allocation.Requests(pod, cfg).Any():
		result = filterNoGPU
	case res.Nodes != nil: // only a simulation answers Nodes for a GPU pod
		result = filterSimulated
	case res.NodeNames == nil && res.Nodes == nil:
		result = filterUnschedulable
	}
	m.filterDuration.WithLabelValues(result).Observe(m.clock.Since(start).Seconds())
}

func (m *metrics) bound(start time.Time, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.bindDuration.WithLabelValues(result).Observe(m.clock.Since(start).Seconds())
}

func (m *metrics) filterLockWaited(start time.Time) {
	if m != nil {
		m.filterLockWait.Observe(m.clock.Since(start).Seconds())
	}
}

func (m *metrics) nodeLockWaited(start time.Time) {
	if m != nil {
		m.nodeLockWait.Observe(m.clock.Since(start).Seconds())
	}
}
