package nvmlsim_test

import (
	"context"
	"fmt"

	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlsim"
)

// Example scans a simulated DGX H100 whose GPU 0 reports XID 79 to the running health watch,
// as a device plugin's --simulate mode does.
func Example() {
	run := func(ctx context.Context) error {
		// snippet: doc
		node, err := nvmlsim.New("dgxh100") // nvmlsim.Servers() lists the names
		if err != nil {
			return err // errors.Is(err, nvmlsim.ErrUnknownServer)
		}
		scanner, err := nvmlscan.New(node.Server, nvmlscan.Options{Sysfs: node.Sysfs})
		if err != nil {
			return err
		}
		node.XID(0, 79) // GPU 0 reports XID 79 to a running Scanner.Run
		// end snippet
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan error)
		changed := scanner.Changed() // closed at the next health change
		go func() { done <- scanner.Run(ctx) }()
		<-changed
		res, err := scanner.Scan(ctx)
		if err != nil {
			fmt.Println(err)
		}
		for _, d := range res.Devices {
			fmt.Println(d.Index, d.Numa, d.Health)
		}
		cancel()
		fmt.Println(<-done, scanner.Close(), node.Freed())
		return nil
	}
	if err := run(context.Background()); err != nil {
		fmt.Println(err)
	}
	_, err := nvmlsim.New("dgx1")
	fmt.Println(err)
	fmt.Println(nvmlsim.Servers())
	// Output:
	// 0 0 false
	// 1 0 true
	// 2 0 true
	// 3 0 true
	// 4 1 true
	// 5 1 true
	// 6 1 true
	// 7 1 true
	// <nil> <nil> 1
	// unknown simulated server "dgx1" (dgxa100, dgxb200, dgxh100, dgxh200)
	// [dgxa100 dgxb200 dgxh100 dgxh200]
}
