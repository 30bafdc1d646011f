package monitor

import "context"

// Containers returns a fresh read of every adopted region, tied to its pod and container.
func (m *Monitor) Containers(ctx context.Context) []Container {
	return nil
}
