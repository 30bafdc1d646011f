package monitor_test

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/monitor"
)

// The monitor's metrics join the registry the node agent serves on /metrics.
func ExampleMonitor_Register() {
	pods := monitor.PodsFunc(func() ([]*corev1.Pod, error) { return nil, nil }) // the node agent's pod informer
	m, err := monitor.New(pods, monitor.Options{NodeName: "node1"})
	if err != nil {
		fmt.Println(err)
		return
	}
	reg := prometheus.NewRegistry()
	if err := m.Register(reg); err != nil {
		fmt.Println(err)
		return
	}
	mfs, err := reg.Gather()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, mf := range mfs {
		fmt.Println(mf.GetName())
	}
	// Output:
	// hami_build_info
	// hamireg_monitor_regions
}
