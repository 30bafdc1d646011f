package monitor

import "github.com/prometheus/client_golang/prometheus"

// Register registers the monitor's collector with reg.
func (m *Monitor) Register(reg prometheus.Registerer) error {
	return nil
}
