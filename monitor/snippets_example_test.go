package monitor_test

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hamireg/hamireg/monitor"
)

// The package documentation's snippet and docs/monitor.md's, compiled (not run: Run would
// wait for its context).
func Example() {
	_ = func(ctx context.Context, pods monitor.Pods, nodeName string) error {
		// snippet: doc
		m, err := monitor.New(pods, monitor.Options{NodeName: nodeName})
		if err != nil {
			return err
		}
		go func() { _ = m.Run(ctx) }()
		for _, c := range m.Containers(ctx) {
			if c.Err != nil {
				continue // this region changed under the read; the others are fine
			}
			for i := range c.Region.Devices {
				mem, sm := c.Region.Usage(i)
				fmt.Println(c.Pod, c.Name, c.Region.Devices[i].UUID(), mem.Total, sm)
			}
		}
		// end snippet
		return nil
	}
	_ = func(ctx context.Context, pods monitor.Pods, node string, host monitor.Host, legacy bool, registry prometheus.Registerer) error {
		// snippet: README
		m, err := monitor.New(pods, monitor.Options{NodeName: node, Host: host, LegacyMetrics: legacy})
		if err != nil {
			return err
		}
		if err := m.Register(registry); err != nil {
			return err
		}
		go func() { _ = m.Run(ctx) }()
		// end snippet
		return nil
	}
}
