package register

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Failure reasons: the bounded values of the "reason" label of
// hamireg_register_failures_total.
const (
	reasonForbidden    = "forbidden"
	reasonNodeNotFound = "node_not_found"
	reasonAPI          = "api"
)

// metrics are the Writer's Prometheus counters. A nil *metrics records nothing.
type metrics struct {
	writes   prometheus.Counter
	heals    prometheus.Counter
	noops    prometheus.Counter
	failures *prometheus.CounterVec
}

// newMetrics registers the counters with reg, labelled with the vendor (a handful of values,
// never a node or a device). A nil reg gives nil: metrics are opt-in.
func newMetrics(reg prometheus.Registerer, vendor string) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	labels := prometheus.Labels{"vendor": vendor}
	m := &metrics{
		writes: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "hamireg_register_writes_total",
			Help:        "Merge patches of the register annotation that the API server accepted.",
			ConstLabels: labels,
		}),
		heals: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "hamireg_register_heals_total",
			Help:        "Writes that restored a register annotation edited or deleted by someone else (included in writes).",
			ConstLabels: labels,
		}),
		noops: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "hamireg_register_noops_total",
			Help:        "Syncs that found the register annotation already right and sent nothing.",
			ConstLabels: labels,
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "hamireg_register_failures_total",
			Help:        "Failed syncs by reason: forbidden, node_not_found, device_source, api.",
			ConstLabels: labels,
		}, []string{"reason"}),
	}
	for _, r := range []string{reasonForbidden, reasonNodeNotFound, reasonAPI} {
		m.failures.WithLabelValues(r) // export every reason at 0
	}
	collectors := []prometheus.Collector{m.writes, m.heals, m.noops, m.failures}
	for i, c := range collectors {
		if err := reg.Register(c); err != nil {
			for _, done := range collectors[:i] {
				reg.Unregister(done)
			}
			if _, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
				return nil, fmt.Errorf("register metrics for vendor %s: %w (one Writer per vendor and Registerer)", vendor, err)
			}
			return nil, fmt.Errorf("register metrics for vendor %s: %w", vendor, err)
		}
	}
	return m, nil
}

func (m *metrics) write(heal bool) {
	if m == nil {
		return
	}
	m.writes.Inc()
	if heal {
		m.heals.Inc()
	}
}

func (m *metrics) noop() {
	if m != nil {
		m.noops.Inc()
	}
}

func (m *metrics) failure(reason string) {
	if m != nil {
		m.failures.WithLabelValues(reason).Inc()
	}
}
