package region_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/hamireg/hamireg/hamicore/region"
)

// The package documentation's snippet, compiled.
func ExampleReadFile() {
	_ = func(path string) error {
		// snippet: doc
		reg, err := region.ReadFile(path) // <Root>/containers/<pod UID>_<container>/<uuid>.cache
		if err != nil {
			return err // errors.Is(err, region.ErrNotInitialized): not written yet, try later
		}
		for i := range reg.Devices {
			mem, sm := reg.Usage(i)
			fmt.Println(reg.Devices[i].UUID(), mem.Total, reg.Devices[i].MemoryLimit, sm)
		}
		// end snippet
		return nil
	}
}

// A region written as HAMi-core writes it, then read back as a monitor reads it.
func Example() {
	dir, err := os.MkdirTemp("", "region")
	if err != nil {
		panic(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	path := filepath.Join(dir, "0f7e6d5c.cache")

	gpu := region.Device{MemoryLimit: 4 << 30, SMLimit: 30}
	if err := gpu.SetUUID("GPU-aa000000-1111-2222-3333-444455556666"); err != nil {
		panic(err)
	}
	proc := region.Slot{Index: 0, PID: 12, HostPID: 40012, Status: 1}
	proc.Used[0] = region.Memory{Context: 300 << 20, Data: 1 << 30, Total: 1<<30 + 300<<20}
	proc.Util[0].SM = 35
	w := &region.Region{Layout: region.LayoutV1, DeviceCount: 1, Devices: []region.Device{gpu},
		ProcNum: 1, Slots: []region.Slot{proc}, UtilizationSwitch: 1, RecentKernel: 2, Priority: 1}
	if err := region.WriteFile(path, w); err != nil {
		panic(err)
	}

	reg, err := region.ReadFile(path)
	if err != nil {
		panic(err)
	}
	for i := range reg.Devices {
		mem, sm := reg.Usage(i)
		fmt.Printf("%s %v %d.%d: %d MiB of %d MiB, SM %d%%\n", reg.Devices[i].UUID(), reg.Layout, reg.Major, reg.Minor,
			mem.Total>>20, reg.Devices[i].MemoryLimit>>20, sm)
	}
	// Output:
	// GPU-aa000000-1111-2222-3333-444455556666 v1 1.2: 1324 MiB of 4096 MiB, SM 35%
}
