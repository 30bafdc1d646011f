package nvmlscan_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlsim"
)

// ExampleScanner_Usage reads the host GPUs' usage, as a node monitor does on every scrape, on
// a simulated node of three A100s: GPU 0 runs a process, GPU 1 has unified memory (its memory
// query is not supported), GPU 2's memory query fails.
func ExampleScanner_Usage() {
	srv := dgxa100.New()
	srv.Devices = srv.Devices[:3]
	node, err := nvmlsim.Wire(srv)
	if err != nil {
		fmt.Println(err)
		return
	}
	node.SetProcesses(0, []nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 3 << 30}})
	node.SetUtilization(0, 87, 41)
	node.SetUtilization(1, 12, 3)
	for _, set := range []error{
		node.SetReturn(1, nvmlsim.QueryMemoryInfo, nvml.ERROR_NOT_SUPPORTED),
		node.SetReturn(2, nvmlsim.QueryMemoryInfo, nvml.ERROR_UNKNOWN),
	} {
		if set != nil {
			fmt.Println(set)
		}
	}
	scanner, err := nvmlscan.New(node.Server, nvmlscan.Options{Sysfs: node.Sysfs})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = scanner.Close() }()

	run := func(ctx context.Context) error {
		// snippet: doc
		gpus, err := scanner.Usage(ctx) // NVML stays initialised: no Init/Shutdown per scrape
		if err != nil {
			return err // NVML cannot count the GPUs, ctx ended, or the scanner is closed
		}
		for _, g := range gpus {
			deviceType := "NVIDIA-" + g.Name // HAMi's device_type label
			if g.MemoryErr != nil && !errors.Is(g.MemoryErr, nvmlscan.ErrNotSupported) {
				fmt.Println(g.Index, "no host series:", errors.Is(g.MemoryErr, nvml.ERROR_UNKNOWN))
				continue // HAMi exports no host series of this GPU
			}
			if g.MemoryErr == nil { // else not supported (unified memory): no memory series
				fmt.Println(g.Index, deviceType, "memory used", g.MemoryUsed, "of", g.MemoryTotal)
			}
			if g.UtilErr == nil {
				fmt.Println(g.Index, deviceType, "utilization", g.UtilGPU, g.UtilMemory)
			}
			for _, p := range g.Processes {
				fmt.Println(g.Index, "host pid", p.PID, "uses", p.UsedMemory)
			}
		}
		// end snippet
		return nil
	}
	if err := run(context.Background()); err != nil {
		fmt.Println(err)
	}
	// Output:
	// 0 NVIDIA-Mock NVIDIA A100-SXM4-40GB memory used 3221225472 of 42949672960
	// 0 NVIDIA-Mock NVIDIA A100-SXM4-40GB utilization 87 41
	// 0 host pid 4242 uses 3221225472
	// 1 NVIDIA-Mock NVIDIA A100-SXM4-40GB utilization 12 3
	// 2 no host series: true
}
