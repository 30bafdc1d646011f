package nodeagent_test

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/hamireg/hamireg/monitor"
	"github.com/hamireg/hamireg/nodeagent"
)

// A node agent that also runs HAMi's node monitor (docs/monitor.md), compiled.
func ExampleOptions_monitor() {
	_ = func(clientset kubernetes.Interface, nodeName string, scanner nodeagent.Source, registry prometheus.Registerer, host monitor.Host) error {
		// snippet: README
		agent, err := nodeagent.New(clientset, nodeName, scanner, nodeagent.Options{
			Registerer: registry,
			Monitor:    &monitor.Options{Root: "/usr/local/vgpu", Host: host},
		})
		// end snippet
		_ = agent
		return err
	}
}
