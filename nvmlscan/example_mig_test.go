package nvmlscan_test

import (
	"context"
	"fmt"
	"strings"
	"testing/fstest"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/nvmlscan"
)

// ExampleScanner_Scan_mig scans go-nvml's simulated DGX A100 in MIG mode with the SDK's
// defaults (mig.DefaultAllowlist, word-bounded model match, HAMi's base-slice discovery): each
// GPU publishes its MIG profiles, with memory, cores and placements from NVML.
func ExampleScanner_Scan_mig() {
	s, err := nvmlscan.New(dgxa100.New(), nvmlscan.Options{Mode: nvmlscan.ModeMIG, Sysfs: fstest.MapFS{}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() {
		if err := s.Close(); err != nil {
			fmt.Println(err)
		}
	}()
	res, err := s.Scan(context.Background())
	if err != nil {
		fmt.Println(err)
		return
	}
	d := res.Devices[0]
	fmt.Println(d.Type, d.Mode, "count", d.Count, "devmem", d.Devmem, "devcore", d.Devcore)
	for _, p := range d.MIGProfiles {
		fmt.Println(p.Name, p.MemoryMB, "MiB", p.Core, "%", p.SliceCount, "slices", len(p.Placements), "placements")
	}
	value := annotation.Encode(res.Devices[:1]) // hami.io/node-nvidia-register, HAMi master's shape
	_, profiles, _ := strings.Cut(value, `"type":"NVIDIA-Mock NVIDIA A100-SXM4-40GB",`)
	fmt.Println(profiles[:120])
	// Output:
	// NVIDIA-Mock NVIDIA A100-SXM4-40GB mig count 7 devmem 40960 devcore 100
	// 1g.5gb 4864 MiB 15 % 1 slices 7 placements
	// 2g.10gb 9856 MiB 29 % 2 slices 3 placements
	// 3g.20gb 19968 MiB 43 % 3 slices 2 placements
	// 7g.40gb 40192 MiB 100 % 7 slices 1 placements
	// "mode":"mig","migProfiles":[{"name":"1g.5gb","memoryMB":4864,"core":15,"sliceCount":1,"placements":[{"start":0,"size":1}
}
