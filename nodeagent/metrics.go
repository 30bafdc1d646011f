package nodeagent

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// allocateKinds are the values of the kind label of hamireg_nodeagent_allocate_errors_total,
// one per Allocate class.
var allocateKinds = []struct {
	err  error
	name string
}{
	{ErrNoBindingPod, "no_binding_pod"}, {ErrPodGone, "pod_gone"}, {ErrNoPendingEntry, "no_pending_entry"},
	{ErrDeviceCountMismatch, "device_count_mismatch"}, {ErrMalformed, "malformed"}, {ErrAPI, "api"},
	{ErrHost, "host"}, {ErrAllocator, "allocator"}, {ErrMIG, "mig"}, {ErrOwnership, "ownership"},
}

// kindOf names the Allocate class of err; "other" for an error of none.
func kindOf(err error) string {
	for _, k := range allocateKinds {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	return "other"
}

// metrics are the agent's Prometheus collectors; a nil *metrics records nothing.
type metrics struct {
	allocations    prometheus.Counter
	allocateErrors *prometheus.CounterVec
	scans          *prometheus.CounterVec
	deviceFailures prometheus.Counter
	decodeFailures prometheus.Counter
}

// newMetrics registers the agent's collectors with reg, labelled with the vendor; a nil reg
// gives nil.
func newMetrics(reg prometheus.Registerer, vendor string) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	labels := prometheus.Labels{"vendor": vendor}
	m := &metrics{
		allocations: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "hamireg", Subsystem: "nodeagent", Name: "allocations_total", ConstLabels: labels,
			Help: "Containers whose devices Allocate handed to the kubelet.",
		}),
		allocateErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "hamireg", Subsystem: "nodeagent", Name: "allocate_errors_total", ConstLabels: labels,
			Help: "Containers Allocate refused, by kind: no_binding_pod, pod_gone, no_pending_entry, device_count_mismatch, malformed, api, host, allocator, mig.",
		}, []string{"kind"}),
		scans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "hamireg", Subsystem: "nodeagent", Name: "scans_total", ConstLabels: labels,
			Help: "Scans of the device source, by result: ok, error.",
		}, []string{"result"}),
		deviceFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "hamireg", Subsystem: "nodeagent", Name: "device_failures_total", ConstLabels: labels,
			Help: "Devices left out of a scan because they could not be read.",
		}),
		decodeFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "hamireg", Subsystem: "nodeagent", Name: "annotation_decode_failures_total", ConstLabels: labels,
			Help: "Pod device annotations (the scheduler's devices to allocate) that did not decode at Allocate.",
		}),
	}
	for _, k := range allocateKinds {
		m.allocateErrors.WithLabelValues(k.name) // export every kind at 0
	}
	m.scans.WithLabelValues("ok")
	m.scans.WithLabelValues("error")
	collectors := []prometheus.Collector{m.allocations, m.allocateErrors, m.scans, m.deviceFailures, m.decodeFailures}
	for i, c := range collectors {
		if err := reg.Register(c); err != nil {
			for _, done := range collectors[:i] {
				reg.Unregister(done)
			}
			if _, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
				return nil, fmt.Errorf("register metrics for vendor %s: %w: %w (one agent per vendor and Registerer)", vendor, ErrInvalidOptions, err)
			}
			return nil, fmt.Errorf("register metrics for vendor %s: %w", vendor, err)
		}
	}
	return m, nil
}

func (m *metrics) allocated() {
	if m != nil {
		m.allocations.Inc()
	}
}

func (m *metrics) allocateFailed(err error) {
	if m != nil {
		m.allocateErrors.WithLabelValues(kindOf(err)).Inc()
	}
}

func (m *metrics) scanned(err error, failedDevices int) {
	if m == nil {
		return
	}
	if err != nil {
		m.scans.WithLabelValues("error").Inc()
		return
	}
	m.scans.WithLabelValues("ok").Inc()
	m.deviceFailures.Add(float64(failedDevices))
}

func (m *metrics) decodeFailed() {
	if m != nil {
		m.decodeFailures.Inc()
	}
}
