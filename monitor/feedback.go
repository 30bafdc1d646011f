package monitor

import "context"

// feedback runs one round of HAMi's priority feedback over cs.
func (m *Monitor) feedback(ctx context.Context, cs []Container) {}
