package nvmlscantest_test

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"

	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlscantest"
)

// Example scans a simulated DGX H100 whose GPU 6 reports XID 79 to the running health watch.
func Example() {
	node, err := nvmlscantest.Wire(dgxh100.New()) // in a test: nvmlscantest.NewNode(t, dgxh100.New())
	if err != nil {
		fmt.Println(err)
		return
	}
	s, err := nvmlscan.New(node.Server, nvmlscan.Options{Sysfs: node.Sysfs})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()

	changed := s.Changed() // closed at the next health change
	node.XID(6, 79)
	<-changed
	res, err := s.Scan(ctx)
	if err != nil {
		fmt.Println(err)
	}
	for _, d := range res.Devices {
		fmt.Println(d.Index, d.Numa, d.Health)
	}
	cancel()
	fmt.Println(<-done, s.Close(), node.Freed())
	// Output:
	// 0 0 true
	// 1 0 true
	// 2 0 true
	// 3 0 true
	// 4 1 true
	// 5 1 true
	// 6 1 false
	// 7 1 true
	// <nil> <nil> 1
}
