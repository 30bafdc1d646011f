package nvmlscan_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/go-cmp/cmp"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlscantest"
	"github.com/hamireg/hamireg/nvmlscan/nvmlsim"
)

func ptr[T any](v T) *T { return &v }

// TestScanDGX scans each of go-nvml's simulated DGX servers with the chart defaults.
func TestScanDGX(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		srv    func() *server.Server
		devmem int32
		typ    string
	}{
		"dgxa100": {dgxa100.New, 40960, "NVIDIA-Mock NVIDIA A100-SXM4-40GB"},
		"dgxh100": {dgxh100.New, 81920, "NVIDIA H100 80GB HBM3"},
		"dgxh200": {dgxh200.New, 144384, "NVIDIA H200 141GB HBM3e"},
		"dgxb200": {dgxb200.New, 184320, "NVIDIA B200 180GB HBM3e"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			n := nvmlscantest.NewNode(t, tc.srv())
			s := newScanner(t, n, nvmlscan.Options{})
			res := scan(testContext(t), t, s)
			var want []annotation.Device
			for i := range 8 {
				want = append(want, annotation.Device{
					ID: n.UUID(i), Index: uint(i), Count: 10, Devmem: tc.devmem, Devcore: 100,
					Type: tc.typ, Numa: i / 4, Mode: "hami-core", Health: true,
				})
			}
			if diff := cmp.Diff(want, res.Devices); diff != "" {
				t.Errorf("devices (-want +got):\n%s", diff)
			}
			if len(res.Failed) != 0 || res.Excluded != 0 || res.Err() != nil {
				t.Errorf("failed %v excluded %d", res.Failed, res.Excluded)
			}
		})
	}
}

// TestScanOptions checks the formulas end to end through a simulated H100 whose memory is
// not a whole number of MiB.
func TestScanOptions(t *testing.T) {
	t.Parallel()
	const total = 81559<<20 + 12345 // 81559 whole MiB
	tests := map[string]struct {
		opts    nvmlscan.Options
		count   int32
		devmem  int32
		devcore int32
		mode    string
	}{
		"defaults":            {opts: nvmlscan.Options{}, count: 10, devmem: 81559, devcore: 100, mode: "hami-core"},
		"split count 4":       {opts: nvmlscan.Options{SplitCount: 4}, count: 4, devmem: 81559, devcore: 100, mode: "hami-core"},
		"memory scaling 1.8":  {opts: nvmlscan.Options{MemoryScaling: ptr(1.8)}, count: 10, devmem: 146806, devcore: 100, mode: "hami-core"},
		"core scaling 0.29":   {opts: nvmlscan.Options{CoreScaling: ptr(0.29)}, count: 10, devmem: 81559, devcore: 28, mode: "hami-core"},
		"core scaling 2.3":    {opts: nvmlscan.Options{CoreScaling: ptr(2.3)}, count: 10, devmem: 81559, devcore: 229, mode: "hami-core"},
		"mps mode scales":     {opts: nvmlscan.Options{Mode: nvmlscan.ModeMPS, MemoryScaling: ptr(0.5), CoreScaling: ptr(0.57)}, count: 10, devmem: 40779, devcore: 56, mode: "mps"},
		"mig mode no scaling": {opts: nvmlscan.Options{Mode: nvmlscan.ModeMIG, MemoryScaling: ptr(1.8), CoreScaling: ptr(0.29), SplitCount: 7}, count: 7, devmem: 81559, devcore: 100, mode: "mig"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := dgxh100.New()
			for _, d := range srv.Devices {
				d.(*server.Device).MemoryInfo.Total = total
			}
			n := nvmlscantest.NewNode(t, srv)
			res := scan(testContext(t), t, newScanner(t, n, tc.opts))
			if len(res.Devices) != 8 {
				t.Fatalf("got %d devices, want 8", len(res.Devices))
			}
			for _, d := range res.Devices {
				if d.Count != tc.count || d.Devmem != tc.devmem || d.Devcore != tc.devcore || d.Mode != tc.mode {
					t.Errorf("device %d: count %d devmem %d devcore %d mode %q; want %d %d %d %q",
						d.Index, d.Count, d.Devmem, d.Devcore, d.Mode, tc.count, tc.devmem, tc.devcore, tc.mode)
				}
			}
		})
	}
}

// TestScanMixedServer uses the configurable server package with two GPU models.
func TestScanMixedServer(t *testing.T) {
	t.Parallel()
	srv, err := server.New(server.WithGPUs(gpus.A100_PCIE_80GB, gpus.A30_PCIE_24GB))
	if err != nil {
		t.Fatal(err)
	}
	n := nvmlscantest.NewNode(t, srv)
	res := scan(testContext(t), t, newScanner(t, n, nvmlscan.Options{}))
	want := []annotation.Device{
		{ID: n.UUID(0), Index: 0, Count: 10, Devmem: int32(gpus.A100_PCIE_80GB.MemoryMB), Devcore: 100, Type: deviceTypeOf(gpus.A100_PCIE_80GB.Name), Mode: "hami-core", Health: true},
		{ID: n.UUID(1), Index: 1, Count: 10, Devmem: int32(gpus.A30_PCIE_24GB.MemoryMB), Devcore: 100, Type: deviceTypeOf(gpus.A30_PCIE_24GB.Name), Mode: "hami-core", Health: true},
	}
	if diff := cmp.Diff(want, res.Devices); diff != "" {
		t.Errorf("devices (-want +got):\n%s", diff)
	}
}

func deviceTypeOf(model string) string {
	if strings.HasPrefix(model, "NVIDIA") {
		return model
	}
	return "NVIDIA-" + model
}

// TestScanDeviceFailure: one GPU whose query fails is skipped and reported; the other seven
// still register.
func TestScanDeviceFailure(t *testing.T) {
	t.Parallel()
	const bad = 3
	tests := map[string]struct {
		opts      nvmlscan.Options
		breakGPU  func(srv *server.Server, d *server.Device)
		op        nvmlscan.Op
		is        []error
		text      string
		hasUUID   bool
		preconfig int32 // when >0, the GPU registers with this devmem instead of failing
	}{
		"handle": {
			breakGPU: func(srv *server.Server, _ *server.Device) {
				get := srv.DeviceGetHandleByIndexFunc
				srv.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
					if i == bad {
						return nil, nvml.ERROR_UNKNOWN
					}
					return get(i)
				}
			},
			op: nvmlscan.OpHandle, is: []error{nvml.ERROR_UNKNOWN}, text: "nvml new device by index error: gpu 3: ERROR_UNKNOWN",
		},
		"uuid": {
			breakGPU: func(_ *server.Server, d *server.Device) {
				d.GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
			},
			op: nvmlscan.OpUUID, is: []error{nvml.ERROR_GPU_IS_LOST}, text: "nvml get uuid error: gpu 3: ERROR_GPU_IS_LOST",
		},
		"index": {
			breakGPU: func(_ *server.Server, d *server.Device) {
				d.GetIndexFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
			},
			op: nvmlscan.OpIndex, is: []error{nvml.ERROR_UNKNOWN}, text: "nvml get index error", hasUUID: true,
		},
		"memory": {
			breakGPU: func(_ *server.Server, d *server.Device) {
				d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_UNKNOWN }
			},
			op: nvmlscan.OpMemory, is: []error{nvml.ERROR_UNKNOWN}, text: "nvml get memory error", hasUUID: true,
		},
		"name": {
			breakGPU: func(_ *server.Server, d *server.Device) {
				d.GetNameFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
			},
			op: nvmlscan.OpName, is: []error{nvml.ERROR_UNKNOWN}, text: "nvml get name error", hasUUID: true,
		},
		"memory not supported, nothing pre-configured": {
			breakGPU: func(_ *server.Server, d *server.Device) {
				d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_NOT_SUPPORTED }
			},
			op: nvmlscan.OpMemory, is: []error{nvmlscan.ErrMemoryNotSupported, nvml.ERROR_NOT_SUPPORTED}, text: "nvml get memory error", hasUUID: true,
		},
		"memory not supported, pre-configured and scaled": {
			opts: nvmlscan.Options{PreConfiguredMemory: 16384, MemoryScaling: ptr(1.5)},
			breakGPU: func(_ *server.Server, d *server.Device) {
				d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_NOT_SUPPORTED }
			},
			preconfig: 24576,
		},
		"scaled memory out of range": {
			opts: nvmlscan.Options{MemoryScaling: ptr(1e6)},
			breakGPU: func(_ *server.Server, d *server.Device) {
				d.MemoryInfo.Total = 1 << 40
			},
			op: nvmlscan.OpMemory, is: []error{nvmlscan.ErrOutOfRange}, text: "nvml get memory error", hasUUID: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := dgxh100.New()
			if tc.opts.MemoryScaling != nil {
				// Keep the seven good GPUs within range: 1 MiB × scaling.
				for _, d := range srv.Devices {
					d.(*server.Device).MemoryInfo.Total = 1 << 20
				}
			}
			n := nvmlscantest.NewNode(t, srv)
			tc.breakGPU(srv, n.Device(bad))
			res := scan(testContext(t), t, newScanner(t, n, tc.opts))

			if tc.preconfig > 0 {
				if len(res.Devices) != 8 || len(res.Failed) != 0 {
					t.Fatalf("got %d devices, %d failed; want 8, 0", len(res.Devices), len(res.Failed))
				}
				if got := res.Devices[bad].Devmem; got != tc.preconfig {
					t.Errorf("devmem of GPU %d = %d, want %d", bad, got, tc.preconfig)
				}
				return
			}
			if len(res.Devices) != 7 {
				t.Errorf("got %d devices, want the 7 good ones", len(res.Devices))
			}
			for _, d := range res.Devices {
				if d.Index == bad {
					t.Errorf("GPU %d registered despite its failure", bad)
				}
			}
			if len(res.Failed) != 1 {
				t.Fatalf("failed = %v, want one", res.Failed)
			}
			f := res.Failed[0]
			if f.Op != tc.op || f.Index != bad {
				t.Errorf("failure op %q index %d, want %q %d", f.Op, f.Index, tc.op, bad)
			}
			if tc.hasUUID != (f.UUID == n.UUID(bad)) {
				t.Errorf("failure UUID %q, has UUID want %v", f.UUID, tc.hasUUID)
			}
			for _, target := range tc.is {
				if !errors.Is(f, target) || !errors.Is(res.Err(), target) {
					t.Errorf("%v is not %v", f, target)
				}
			}
			var de *nvmlscan.DeviceError
			if !errors.As(res.Err(), &de) || de != f {
				t.Errorf("Result.Err() does not carry the *DeviceError")
			}
			if !strings.Contains(f.Error(), tc.text) {
				t.Errorf("error %q does not contain %q", f.Error(), tc.text)
			}
		})
	}
}

// TestScanAllGPUsFail: a node whose every GPU fails registers nothing but does not fail the
// scan.
func TestScanAllGPUsFail(t *testing.T) {
	t.Parallel()
	srv := dgxh100.New()
	n := nvmlscantest.NewNode(t, srv)
	for i := range 8 {
		n.SetLost(i, true)
	}
	res := scan(testContext(t), t, newScanner(t, n, nvmlscan.Options{}))
	if len(res.Devices) != 0 || len(res.Failed) != 8 {
		t.Errorf("got %d devices, %d failed; want 0, 8", len(res.Devices), len(res.Failed))
	}
	if value := annotation.Encode(res.Devices); value != "[]" {
		t.Errorf("encoded %q", value)
	}
}

func TestScanExclude(t *testing.T) {
	t.Parallel()
	n := nvmlscantest.NewNode(t, dgxh100.New())
	s := newScanner(t, n, nvmlscan.Options{ExcludeUUIDs: []string{n.UUID(1), "GPU-not-there"}, ExcludeIndexes: []uint{5, 7, 42}})
	res := scan(testContext(t), t, s)
	var got []uint
	for _, d := range res.Devices {
		got = append(got, d.Index)
	}
	if diff := cmp.Diff([]uint{0, 2, 3, 4, 6}, got); diff != "" {
		t.Errorf("indexes (-want +got):\n%s", diff)
	}
	if res.Excluded != 3 {
		t.Errorf("excluded %d, want 3", res.Excluded)
	}
}

func TestScanCountFailure(t *testing.T) {
	t.Parallel()
	srv := dgxh100.New()
	srv.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	s := newScanner(t, nvmlscantest.NewNode(t, srv), nvmlscan.Options{})
	_, err := s.Scan(testContext(t))
	if !errors.Is(err, nvml.ERROR_UNKNOWN) || !strings.HasPrefix(err.Error(), "count devices: ") {
		t.Errorf("Scan error = %v", err)
	}
}

func TestScanCanceled(t *testing.T) {
	t.Parallel()
	s := newScanner(t, nvmlscantest.NewNode(t, dgxh100.New()), nvmlscan.Options{})
	ctx, cancel := context.WithCancelCause(testContext(t))
	cause := errors.New("shutting down")
	cancel(cause)
	if _, err := s.Scan(ctx); !errors.Is(err, cause) {
		t.Errorf("Scan error = %v, want the cancel cause", err)
	}
}

// TestInitOncePerLifetime: NVML is initialised by New, never by a scan, and shut down once by
// Close.
func TestInitOncePerLifetime(t *testing.T) {
	t.Parallel()
	srv := dgxh100.New()
	n := nvmlscantest.NewNode(t, srv)
	s, err := nvmlscan.New(srv, nvmlscan.Options{Sysfs: n.Sysfs})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	for range 3 {
		scan(ctx, t, s)
	}
	if inits, shutdowns := len(srv.InitCalls()), len(srv.ShutdownCalls()); inits != 1 || shutdowns != 0 {
		t.Errorf("after 3 scans: %d Init, %d Shutdown; want 1, 0", inits, shutdowns)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if shutdowns := len(srv.ShutdownCalls()); shutdowns != 1 {
		t.Errorf("%d Shutdown after two Close, want 1", shutdowns)
	}
	if _, err := s.Scan(ctx); !errors.Is(err, nvmlscan.ErrClosed) {
		t.Errorf("Scan after Close: %v", err)
	}
	if err := s.Run(ctx); !errors.Is(err, nvmlscan.ErrClosed) {
		t.Errorf("Run after Close: %v", err)
	}
}

func TestCloseShutdownError(t *testing.T) {
	t.Parallel()
	srv := dgxh100.New()
	srv.ShutdownFunc = func() nvml.Return { return nvml.ERROR_UNKNOWN }
	s, err := nvmlscan.New(srv, nvmlscan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Errorf("Close error = %v", err)
	}
}

// TestInitFailure: a failed Init is classified, carries HAMi's wording and the fix, and nothing
// else is called (a bare mock panics on any call whose Func is nil).
func TestInitFailure(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		ret  nvml.Return
		text []string
	}{
		"library not found": {nvml.ERROR_LIBRARY_NOT_FOUND, []string{"nvml Init err: ERROR_LIBRARY_NOT_FOUND", "default runtime", "RuntimeClass"}},
		"driver not loaded": {nvml.ERROR_DRIVER_NOT_LOADED, []string{"nvml Init err: ERROR_DRIVER_NOT_LOADED", "kernel driver"}},
		"version mismatch":  {nvml.ERROR_LIB_RM_VERSION_MISMATCH, []string{"nvml Init err: ERROR_LIB_RM_VERSION_MISMATCH", "does not match"}},
		"no permission":     {nvml.ERROR_NO_PERMISSION, []string{"nvml Init err: ERROR_NO_PERMISSION", "privileged"}},
		"other":             {nvml.ERROR_UNKNOWN, []string{"nvml Init err: ERROR_UNKNOWN"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			lib := &mock.Interface{InitFunc: func() nvml.Return { return tc.ret }}
			s, err := nvmlscan.New(lib, nvmlscan.Options{})
			if s != nil {
				t.Error("New returned a scanner")
			}
			if !errors.Is(err, nvmlscan.ErrInit) || !errors.Is(err, tc.ret) {
				t.Errorf("error %v is not ErrInit and %v", err, tc.ret)
			}
			var ie *nvmlscan.InitError
			if !errors.As(err, &ie) || ie.Return != tc.ret {
				t.Errorf("error %v is not an *InitError with %v", err, tc.ret)
			}
			for _, text := range tc.text {
				if !strings.Contains(err.Error(), text) {
					t.Errorf("error %q does not contain %q", err, text)
				}
			}
			if calls := len(lib.InitCalls()); calls != 1 {
				t.Errorf("%d Init calls, want 1", calls)
			}
		})
	}
}

// TestInvalidOptionsBeforeInit: invalid options are rejected before NVML is touched.
func TestInvalidOptionsBeforeInit(t *testing.T) {
	t.Parallel()
	lib := &mock.Interface{}
	if _, err := nvmlscan.New(lib, nvmlscan.Options{Mode: "bogus"}); !errors.Is(err, nvmlscan.ErrInvalidOptions) {
		t.Errorf("error = %v", err)
	}
	if _, err := nvmlscan.New(nil, nvmlscan.Options{}); !errors.Is(err, nvmlscan.ErrInvalidOptions) {
		t.Errorf("nil lib: error = %v", err)
	}
}

// TestRealLibrary runs the real go-nvml library. Without a driver (this machine) Init fails
// with ERROR_LIBRARY_NOT_FOUND and the scanner must not crash the process, which any further
// NVML call would do. With a driver it scans the real GPUs.
func TestRealLibrary(t *testing.T) {
	t.Parallel()
	s, err := nvmlscan.New(nvml.New(), nvmlscan.Options{})
	if err == nil {
		defer func() {
			if err := s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}()
		res := scan(testContext(t), t, s)
		t.Logf("NVML present: %d GPU(s), %d failed: %s", len(res.Devices), len(res.Failed), annotation.Encode(res.Devices))
		return
	}
	if !errors.Is(err, nvmlscan.ErrInit) {
		t.Fatalf("error %v is not ErrInit", err)
	}
	t.Logf("no NVML: %v", err)
	if errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND) {
		if !strings.Contains(err.Error(), "nvml Init err: ERROR_LIBRARY_NOT_FOUND") || !strings.Contains(err.Error(), "RuntimeClass") {
			t.Errorf("error %q lacks HAMi's wording or the fix", err)
		}
	}
}

// TestPCIBusIDs: the scan records each registered GPU's PCI bus ID in the form of sysfs and
// DRA's pciBusID attribute (lower-case, 4-digit domain); excluded GPUs have none.
func TestPCIBusIDs(t *testing.T) {
	t.Parallel()
	n := nvmlscantest.NewNode(t, dgxh100.New())
	s := newScanner(t, n, nvmlscan.Options{ExcludeIndexes: []uint{3}})
	if got := s.PCIBusIDs(); len(got) != 0 {
		t.Errorf("bus IDs before the first scan: %v, want none", got)
	}
	scan(testContext(t), t, s)
	want := map[string]string{}
	for i, bus := range nvmlsim.BusNumbers() {
		if i != 3 {
			want[n.UUID(i)] = fmt.Sprintf("0000:%02x:00.0", bus)
		}
	}
	got := s.PCIBusIDs()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PCI bus IDs (-want +got):\n%s", diff)
	}
	got[n.UUID(0)] = "changed"
	if s.PCIBusIDs()[n.UUID(0)] == "changed" {
		t.Error("PCIBusIDs returned the scanner's own map")
	}
}
