package nvmlsim_test

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hamireg/hamireg/nvmlscan/nvmlsim"
)

// Example_usage sets what a simulated node's GPUs answer to a node monitor's queries.
func Example_usage() {
	run := func() error {
		node, err := nvmlsim.New("dgxh100")
		if err != nil {
			return err
		}
		// snippet: doc
		node.SetUtilization(0, 87, 41)                                                // GPU 0: 87 % busy, memory controller 41 %
		node.SetProcesses(0, []nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 3 << 30}}) // memory used follows: 3 GiB
		node.SetMemoryUsed(1, 10<<30)                                                 // GPU 1: 10 GiB used, whatever its processes
		if err := node.SetReturn(2, nvmlsim.QueryMemoryInfo, nvml.ERROR_NOT_SUPPORTED); err != nil {
			return err // errors.Is(err, nvmlsim.ErrUnknownQuery)
		}
		// end snippet
		for i := range 3 {
			d := node.Device(i)
			mem, memRet := d.GetMemoryInfo()
			util, utilRet := d.GetUtilizationRates()
			procs, procRet := d.GetComputeRunningProcesses()
			fmt.Println(i, mem.Used>>30, memRet, util.Gpu, util.Memory, utilRet, len(procs), procRet)
		}
		return nil
	}
	if err := run(); err != nil {
		fmt.Println(err)
	}
	// Output:
	// 0 3 SUCCESS 87 41 SUCCESS 1 SUCCESS
	// 1 10 SUCCESS 0 0 SUCCESS 0 SUCCESS
	// 2 0 ERROR_NOT_SUPPORTED 0 0 SUCCESS 0 SUCCESS
}
