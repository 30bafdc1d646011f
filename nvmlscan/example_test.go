package nvmlscan_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing/fstest"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/nvmlscan"
)

// Example scans go-nvml's simulated DGX H100 (no GPU needed) with a memory scaling of 1.5 and
// a core scaling of 0.29, and one GPU whose memory query fails.
func Example() {
	srv := dgxh100.New() // on a node: nvml.New()
	srv.Devices[7].(*server.Device).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		return nvml.Memory{}, nvml.ERROR_UNKNOWN
	}
	memScaling, coreScaling := 1.5, 0.29
	s, err := nvmlscan.New(srv, nvmlscan.Options{
		MemoryScaling: &memScaling,
		CoreScaling:   &coreScaling,
		Sysfs:         fstest.MapFS{}, // the simulated GPUs have no PCI bus id: NUMA node 0
	})
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
	for _, d := range res.Devices {
		fmt.Println(d.Index, d.Type, d.Count, d.Devmem, d.Devcore, d.Numa, d.Mode, d.Health)
	}
	for _, f := range res.Failed {
		fmt.Println("skipped GPU", f.Index, f.Op, errors.Is(f, nvml.ERROR_UNKNOWN))
	}
	value := annotation.Encode(res.Devices) // merge-patch under annotation.KeyNVIDIARegister
	fmt.Println(len(value) > 0)
	// Output:
	// 0 NVIDIA H100 80GB HBM3 10 122880 28 0 hami-core true
	// 1 NVIDIA H100 80GB HBM3 10 122880 28 0 hami-core true
	// 2 NVIDIA H100 80GB HBM3 10 122880 28 0 hami-core true
	// 3 NVIDIA H100 80GB HBM3 10 122880 28 0 hami-core true
	// 4 NVIDIA H100 80GB HBM3 10 122880 28 0 hami-core true
	// 5 NVIDIA H100 80GB HBM3 10 122880 28 0 hami-core true
	// 6 NVIDIA H100 80GB HBM3 10 122880 28 0 hami-core true
	// skipped GPU 7 get memory true
	// true
}

// ExampleNew_noDriver shows the error New returns in a container that did not get the NVIDIA
// driver, simulated here by a library whose Init fails as nvml.New() does there.
func ExampleNew_noDriver() {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	_, err := nvmlscan.New(lib, nvmlscan.Options{})
	fmt.Println(errors.Is(err, nvmlscan.ErrInit), errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND))
	fmt.Println(err)
	// Output:
	// true true
	// nvml Init err: ERROR_LIBRARY_NOT_FOUND: libnvidia-ml.so.1 is not in the container, so the container did not get the NVIDIA driver: make nvidia the default runtime of the node's container runtime (containerd, CRI-O, Docker), or give the device plugin pod a RuntimeClass (runtimeClassName: nvidia)
}

// The package documentation's usage snippet, compiled.
func ExampleScanner() {
	run := func(ctx context.Context, cancel context.CancelCauseFunc) error {
		var wg sync.WaitGroup // wg and cancel as the caller has them
		defer wg.Wait()
		// snippet: doc
		s, err := nvmlscan.New(nvml.New(), nvmlscan.Options{}) // chart defaults
		if err != nil {
			return err // errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND): the pod did not get the driver
		}
		defer s.Close()                      //nolint:errcheck // as in the package documentation
		wg.Go(func() { cancel(s.Run(ctx)) }) // XID health watch; Close stops it and waits for it
		res, err := s.Scan(ctx)
		if err != nil {
			return err
		}
		value := annotation.Encode(res.Devices) // hami.io/node-nvidia-register
		// end snippet
		_ = value
		return nil
	}
	_ = run
}
