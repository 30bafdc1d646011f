package schedcache

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics holds the cache's collectors; a nil *metrics records nothing.
type metrics struct {
	nodes          *prometheus.GaugeVec
	decodeFailures *prometheus.CounterVec
	writes         *prometheus.CounterVec
}

// newMetrics registers the collectors with reg; queueDepth reports the depth of a queue by name.
func newMetrics(reg prometheus.Registerer, queueDepth func(queue string) float64) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		nodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "hamireg", Subsystem: "schedcache", Name: "nodes",
			Help: "Nodes per vendor and registration state.",
		}, []string{"vendor", "state"}),
		decodeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "hamireg", Subsystem: "schedcache", Name: "decode_failures_total",
			Help: "Register annotations that did not decode, by vendor and state (malformed, invalid-element, no-devices).",
		}, []string{"vendor", "state"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "hamireg", Subsystem: "schedcache", Name: "handshake_writes_total",
			Help: "Handshake annotation writes by vendor, action (stamp, cleanup) and result (ok, error).",
		}, []string{"vendor", "action", "result"}),
	}
	depth := func(queue string) prometheus.GaugeFunc {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "hamireg", Subsystem: "schedcache", Name: "queue_depth",
			Help:        "Items waiting in the cache's work queues (events: node changes to apply; writes: handshake writes).",
			ConstLabels: prometheus.Labels{"queue": queue},
		}, func() float64 { return queueDepth(queue) })
	}
	for _, c := range []prometheus.Collector{m.nodes, m.decodeFailures, m.writes, depth("events"), depth("writes")} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("register metrics: %w: %w", ErrInvalidOptions, err)
			}
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) setNodes(vendor string, s State, n int) {
	if m != nil {
		m.nodes.WithLabelValues(vendor, s.String()).Set(float64(n))
	}
}

func (m *metrics) decodeFailure(vendor string, s State) {
	if m != nil {
		m.decodeFailures.WithLabelValues(vendor, s.String()).Inc()
	}
}

func (m *metrics) write(vendor, action string, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.writes.WithLabelValues(vendor, action, result).Inc()
}
