package nvmlscan_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/hamireg/hamireg/internal/vectors"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlscantest"
	"github.com/hamireg/hamireg/nvmlscan/nvmlsim"
)

func usage(ctx context.Context, t *testing.T, s *nvmlscan.Scanner) []nvmlscan.GPUUsage {
	t.Helper()
	u, err := s.Usage(ctx)
	if err != nil {
		t.Fatalf("Usage: %v", err)
	}
	return u
}

// ignoreErrs compares GPUUsage values without their error fields, which tests check with
// errors.Is.
var ignoreErrs = cmpopts.IgnoreFields(nvmlscan.GPUUsage{}, "MemoryErr", "UtilErr", "ProcessesErr")

// TestUsageValues: every GPU of a DGX A100, in index order, with what the node answers: an idle
// GPU uses no memory, a GPU's used memory is its processes' unless set, utilisation as set.
func TestUsageValues(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	n := nvmlscantest.NewNode(t, dgxa100.New())
	s := newScanner(t, n, nvmlscan.Options{})
	const gib = uint64(1) << 30
	total := n.Device(0).MemoryInfo.Total
	if total != 40*gib {
		t.Fatalf("A100 preset memory %d, want 40 GiB", total)
	}
	n.SetProcesses(2, []nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 3 * gib}, {Pid: 17, UsedGpuMemory: gib, GpuInstanceId: 0xFFFFFFFF}})
	n.SetUtilization(2, 87, 41)
	n.SetMemoryUsed(5, 7*gib)
	n.SetUtilization(5, 100, 100)
	n.SetMemoryTotal(6, 80*gib)
	n.SetName(6, "NVIDIA A100-SXM4-80GB")

	var want []nvmlscan.GPUUsage
	for i := range 8 {
		want = append(want, nvmlscan.GPUUsage{Index: i, UUID: n.UUID(i), Name: n.Device(i).Config.Name, MemoryTotal: total,
			Processes: []nvmlscan.ProcessUsage{}})
	}
	want[2].MemoryUsed, want[2].UtilGPU, want[2].UtilMemory = 4*gib, 87, 41
	want[2].Processes = []nvmlscan.ProcessUsage{{PID: 4242, UsedMemory: 3 * gib}, {PID: 17, UsedMemory: gib}}
	want[5].MemoryUsed, want[5].UtilGPU, want[5].UtilMemory = 7*gib, 100, 100
	want[6].MemoryTotal, want[6].Name = 80*gib, "NVIDIA A100-SXM4-80GB"

	got := usage(ctx, t, s)
	if diff := cmp.Diff(want, got, ignoreErrs); diff != "" {
		t.Errorf("Usage (-want +got):\n%s", diff)
	}
	for _, u := range got {
		if u.MemoryErr != nil || u.UtilErr != nil || u.ProcessesErr != nil {
			t.Errorf("GPU %d: errors %v, %v, %v", u.Index, u.MemoryErr, u.UtilErr, u.ProcessesErr)
		}
	}

	// The values are live: the next call sees the change, and a registration scan still
	// sees the total memory.
	n.SetProcesses(2, nil)
	n.SetUtilization(2, 0, 0)
	if u := usage(ctx, t, s)[2]; u.MemoryUsed != 0 || u.UtilGPU != 0 || len(u.Processes) != 0 {
		t.Errorf("GPU 2 after its processes ended: %+v", u)
	}
	if res := scan(ctx, t, s); len(res.Devices) != 8 || res.Devices[2].Devmem != 40960 || res.Devices[6].Devmem != 81920 {
		t.Errorf("scan after usage changes: %+v", res.Devices)
	}
}

// TestUsageErrors: the three error classes of HAMi's host series (memory not supported,
// memory failing otherwise, utilisation not supported) and a failing process query land in
// the GPU's fields, classified, and leave the GPU's other values and the other GPUs alone.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	n := nvmlscantest.NewNode(t, dgxh100.New())
	s := newScanner(t, n, nvmlscan.Options{PreConfiguredMemory: 1024})
	for i := range 8 {
		n.SetUtilization(i, uint32(10*i), uint32(i))
		n.SetProcesses(i, []nvml.ProcessInfo{{Pid: uint32(100 + i), UsedGpuMemory: 1 << 20}})
	}
	nvmlscantest.SetReturn(t, n, 0, nvmlsim.QueryMemoryInfo, nvml.ERROR_NOT_SUPPORTED)
	nvmlscantest.SetReturn(t, n, 1, nvmlsim.QueryMemoryInfo, nvml.ERROR_UNKNOWN)
	nvmlscantest.SetReturn(t, n, 2, nvmlsim.QueryUtilizationRates, nvml.ERROR_NOT_SUPPORTED)
	nvmlscantest.SetReturn(t, n, 3, nvmlsim.QueryComputeRunningProcesses, nvml.ERROR_NO_PERMISSION)
	nvmlscantest.SetReturn(t, n, 4, nvmlsim.QueryUtilizationRates, nvml.ERROR_GPU_IS_LOST)

	got := usage(ctx, t, s)
	if len(got) != 8 {
		t.Fatalf("got %d GPUs, want 8", len(got))
	}
	check := func(i int, field string, err error, op nvmlscan.Op, ret nvml.Return, notSupported bool) {
		t.Helper()
		var de *nvmlscan.DeviceError
		switch {
		case err == nil && ret == nvml.SUCCESS:
			return
		case err == nil:
			t.Errorf("GPU %d %s: no error, want %v", i, field, ret)
			return
		case ret == nvml.SUCCESS:
			t.Errorf("GPU %d %s: unexpected error %v", i, field, err)
			return
		case !errors.As(err, &de) || de.Op != op || de.Index != i || de.UUID != n.UUID(i):
			t.Errorf("GPU %d %s: %#v is not a *DeviceError of %q with the GPU's identity", i, field, err, op)
		}
		if !errors.Is(err, ret) || errors.Is(err, nvmlscan.ErrNotSupported) != notSupported {
			t.Errorf("GPU %d %s: %v: errors.Is %v = %v, ErrNotSupported = %v, want true, %v", i, field, err, ret,
				errors.Is(err, ret), errors.Is(err, nvmlscan.ErrNotSupported), notSupported)
		}
		if !strings.HasPrefix(err.Error(), "nvml "+string(op)+" error: gpu "+strconv.Itoa(i)+" ("+n.UUID(i)+"): ") {
			t.Errorf("GPU %d %s: text %q", i, field, err)
		}
	}
	for i, u := range got {
		if u.Index != i || u.UUID != n.UUID(i) || u.Name != n.Device(i).Config.Name {
			t.Errorf("GPU %d: identity %d %s %q", i, u.Index, u.UUID, u.Name)
		}
		memRet, utilRet, procRet := nvml.SUCCESS, nvml.SUCCESS, nvml.SUCCESS
		switch i {
		case 0:
			memRet = nvml.ERROR_NOT_SUPPORTED
		case 1:
			memRet = nvml.ERROR_UNKNOWN
		case 2:
			utilRet = nvml.ERROR_NOT_SUPPORTED
		case 3:
			procRet = nvml.ERROR_NO_PERMISSION
		case 4:
			utilRet = nvml.ERROR_GPU_IS_LOST
		}
		check(i, "memory", u.MemoryErr, nvmlscan.OpMemory, memRet, memRet == nvml.ERROR_NOT_SUPPORTED)
		check(i, "utilization", u.UtilErr, nvmlscan.OpUtilization, utilRet, utilRet == nvml.ERROR_NOT_SUPPORTED)
		check(i, "processes", u.ProcessesErr, nvmlscan.OpProcesses, procRet, false)
		wantMem := [2]uint64{1 << 20, 80 << 30}
		if memRet != nvml.SUCCESS {
			wantMem = [2]uint64{}
		}
		if got := [2]uint64{u.MemoryUsed, u.MemoryTotal}; got != wantMem {
			t.Errorf("GPU %d memory %v, want %v", i, got, wantMem)
		}
		wantUtil := [2]uint32{uint32(10 * i), uint32(i)}
		if utilRet != nvml.SUCCESS {
			wantUtil = [2]uint32{}
		}
		if got := [2]uint32{u.UtilGPU, u.UtilMemory}; got != wantUtil {
			t.Errorf("GPU %d utilization %v, want %v", i, got, wantUtil)
		}
		wantProcs := []nvmlscan.ProcessUsage{{PID: uint32(100 + i), UsedMemory: 1 << 20}}
		if procRet != nvml.SUCCESS {
			wantProcs = nil
		}
		if diff := cmp.Diff(wantProcs, u.Processes); diff != "" {
			t.Errorf("GPU %d processes (-want +got):\n%s", i, diff)
		}
	}

	// nvml.SUCCESS lets the query answer again.
	nvmlscantest.SetReturn(t, n, 1, nvmlsim.QueryMemoryInfo, nvml.SUCCESS)
	if u := usage(ctx, t, s)[1]; u.MemoryErr != nil || u.MemoryTotal != 80<<30 {
		t.Errorf("GPU 1 after its memory answers again: %+v", u)
	}
}

// TestUsageSkipsGPU: a GPU whose handle, UUID or name cannot be read, or that stopped
// answering, is left out; the others are read.
func TestUsageSkipsGPU(t *testing.T) {
	t.Parallel()
	tests := map[string]func(n *nvmlscantest.Node){
		"lost": func(n *nvmlscantest.Node) { n.SetLost(3, true) },
		"uuid": func(n *nvmlscantest.Node) {
			_ = n.SetReturn(3, nvmlsim.QueryUUID, nvml.ERROR_UNKNOWN)
		},
		"name": func(n *nvmlscantest.Node) {
			_ = n.SetReturn(3, nvmlsim.QueryName, nvml.ERROR_INSUFFICIENT_SIZE)
		},
		"handle": func(n *nvmlscantest.Node) {
			get := n.Server.DeviceGetHandleByIndexFunc
			n.Server.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
				if i == 3 {
					return nil, nvml.ERROR_GPU_IS_LOST
				}
				return get(i)
			}
		},
		"nil handle answered as a success": func(n *nvmlscantest.Node) {
			get := n.Server.DeviceGetHandleByIndexFunc
			n.Server.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
				if i == 3 {
					return nil, nvml.SUCCESS
				}
				return get(i)
			}
		},
	}
	for name, breakGPU := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			n := nvmlscantest.NewNode(t, dgxh100.New())
			s := newScanner(t, n, nvmlscan.Options{})
			breakGPU(n)
			var got []int
			for _, u := range usage(ctx, t, s) {
				got = append(got, u.Index)
				if u.UUID != n.UUID(u.Index) {
					t.Errorf("GPU %d: UUID %s, want %s", u.Index, u.UUID, n.UUID(u.Index))
				}
			}
			if diff := cmp.Diff([]int{0, 1, 2, 4, 5, 6, 7}, got); diff != "" {
				t.Errorf("GPUs (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("comes back", func(t *testing.T) {
		t.Parallel()
		ctx := testContext(t)
		n := nvmlscantest.NewNode(t, dgxh100.New())
		s := newScanner(t, n, nvmlscan.Options{})
		n.SetLost(6, true)
		if got := len(usage(ctx, t, s)); got != 7 {
			t.Errorf("%d GPUs while GPU 6 is lost, want 7", got)
		}
		n.SetLost(6, false)
		if got := usage(ctx, t, s); len(got) != 8 || got[6].UUID != n.UUID(6) {
			t.Errorf("GPU 6 not back: %d GPUs", len(got))
		}
	})
}

// TestUsageFails: Usage fails as a whole only when the GPUs cannot be counted, ctx has
// ended, or the scanner is closed.
func TestUsageFails(t *testing.T) {
	t.Parallel()
	t.Run("count", func(t *testing.T) {
		t.Parallel()
		srv := dgxh100.New()
		n := nvmlscantest.NewNode(t, srv)
		srv.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNINITIALIZED }
		s := newScanner(t, n, nvmlscan.Options{})
		u, err := s.Usage(testContext(t))
		if u != nil || !errors.Is(err, nvml.ERROR_UNINITIALIZED) || !strings.HasPrefix(err.Error(), "count devices: ") {
			t.Errorf("Usage = %v, %v; want count devices: ERROR_UNINITIALIZED", u, err)
		}
	})
	t.Run("context", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancelCause(testContext(t))
		cause := errors.New("scrape timed out")
		cancel(cause)
		s := newScanner(t, nvmlscantest.NewNode(t, dgxh100.New()), nvmlscan.Options{})
		if u, err := s.Usage(ctx); u != nil || !errors.Is(err, cause) {
			t.Errorf("Usage = %v, %v; want the context's cause", u, err)
		}
	})
	t.Run("closed", func(t *testing.T) {
		t.Parallel()
		n := nvmlscantest.NewNode(t, dgxh100.New())
		s := newScanner(t, n, nvmlscan.Options{})
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		counted := len(n.Server.DeviceGetCountCalls())
		if u, err := s.Usage(testContext(t)); u != nil || !errors.Is(err, nvmlscan.ErrClosed) {
			t.Errorf("Usage after Close = %v, %v; want ErrClosed", u, err)
		}
		if got := len(n.Server.DeviceGetCountCalls()); got != counted {
			t.Error("Usage called NVML after Close")
		}
	})
	t.Run("no GPU", func(t *testing.T) {
		t.Parallel()
		srv := dgxh100.New()
		srv.Devices = nil
		s := newScanner(t, nvmlscantest.NewNode(t, srv), nvmlscan.Options{})
		if u, err := s.Usage(testContext(t)); err != nil || len(u) != 0 {
			t.Errorf("Usage of a node without GPUs = %v, %v", u, err)
		}
	})
}

// TestUsageOncePerScanner: Usage neither initialises nor shuts NVML down (HAMi's monitor does
// both on every scrape).
func TestUsageOncePerScanner(t *testing.T) {
	t.Parallel()
	n := nvmlscantest.NewNode(t, dgxh100.New())
	s := newScanner(t, n, nvmlscan.Options{})
	for range 3 {
		usage(testContext(t), t, s)
	}
	if inits, shutdowns := len(n.Server.InitCalls()), len(n.Server.ShutdownCalls()); inits != 1 || shutdowns != 0 {
		t.Errorf("%d Init and %d Shutdown calls after three Usage calls, want 1 and 0", inits, shutdowns)
	}
}

// TestUsageMIG: a GPU in MIG mode is reported as the parent GPU (HAMi's host series): its
// memory and processes as NVML gives them, its utilisation not supported, as NVML answers on a
// MIG-enabled GPU.
func TestUsageMIG(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	n := nvmlscantest.NewMIGNode(t, dgxa100.New())
	s := newScanner(t, n, nvmlscan.Options{Mode: nvmlscan.ModeMIG})
	mgr := s.MIG()
	if _, err := mgr.Create(ctx, n.UUID(1), "1g.5gb", mig.Placement{Start: 0, Size: 1}); err != nil {
		t.Fatal(err)
	}
	n.SetProcesses(1, []nvml.ProcessInfo{{Pid: 9, UsedGpuMemory: 1 << 30, GpuInstanceId: 1, ComputeInstanceId: 0}})
	got := usage(ctx, t, s)
	if len(got) != 8 {
		t.Fatalf("got %d GPUs, want the 8 parents", len(got))
	}
	for i, u := range got {
		if u.UUID != n.UUID(i) || !strings.HasPrefix(u.UUID, "GPU-") || u.Name != n.Device(i).Config.Name {
			t.Errorf("GPU %d: %s %q, want the parent GPU", i, u.UUID, u.Name)
		}
		if !errors.Is(u.UtilErr, nvmlscan.ErrNotSupported) || u.MemoryErr != nil || u.ProcessesErr != nil {
			t.Errorf("GPU %d: errors %v, %v, %v; want utilisation not supported only", i, u.MemoryErr, u.UtilErr, u.ProcessesErr)
		}
	}
	if diff := cmp.Diff([]nvmlscan.ProcessUsage{{PID: 9, UsedMemory: 1 << 30}}, got[1].Processes); diff != "" || got[1].MemoryUsed != 1<<30 {
		t.Errorf("GPU 1 used %d, processes (-want +got):\n%s", got[1].MemoryUsed, diff)
	}
}

// TestUsageOddAnswers: answers NVML should not give (a nil process list, NVML's
// VALUE_NOT_AVAILABLE, used beyond total, many processes, a negative count) are passed on or
// ignored, never a panic.
func TestUsageOddAnswers(t *testing.T) {
	t.Parallel()
	dev := &mock.Device{
		GetUUIDFunc: func() (string, nvml.Return) { return "GPU-odd", nvml.SUCCESS },
		GetNameFunc: func() (string, nvml.Return) { return "", nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: 1, Used: ^uint64(0)}, nvml.SUCCESS
		},
		GetUtilizationRatesFunc: func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: 4000000000, Memory: 101}, nvml.SUCCESS
		},
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS },
	}
	many := make([]nvml.ProcessInfo, 10000)
	for i := range many {
		many[i] = nvml.ProcessInfo{Pid: uint32(i), UsedGpuMemory: ^uint64(0)}
	}
	dev2 := &mock.Device{
		GetUUIDFunc:             dev.GetUUIDFunc,
		GetNameFunc:             dev.GetNameFunc,
		GetMemoryInfoFunc:       func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.Return(-5) },
		GetUtilizationRatesFunc: func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, nvml.Return(1 << 20) },
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			return many, nvml.SUCCESS
		},
	}
	count := 2
	lib := &mock.Interface{
		InitFunc:           func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return count, nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			return []nvml.Device{dev, dev2}[i], nvml.SUCCESS
		},
	}
	s, err := nvmlscan.New(lib, nvmlscan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	got := usage(testContext(t), t, s)
	if len(got) != 2 {
		t.Fatalf("got %d GPUs, want 2", len(got))
	}
	if u := got[0]; u.MemoryUsed != ^uint64(0) || u.MemoryTotal != 1 || u.UtilGPU != 4000000000 || u.Processes == nil || len(u.Processes) != 0 {
		t.Errorf("GPU 0: %+v", u)
	}
	if u := got[1]; !errors.Is(u.MemoryErr, nvml.Return(-5)) || !errors.Is(u.UtilErr, nvml.Return(1<<20)) || len(u.Processes) != len(many) ||
		u.Processes[9999] != (nvmlscan.ProcessUsage{PID: 9999, UsedMemory: ^uint64(0)}) {
		t.Errorf("GPU 1: errors %v, %v, %d processes", u.MemoryErr, u.UtilErr, len(u.Processes))
	}
	count = -1
	if got := usage(testContext(t), t, s); len(got) != 0 {
		t.Errorf("negative count: %d GPUs", len(got))
	}
}

// TestUsageConcurrent runs Usage from several goroutines while scans, the health watch and
// the node's setters run (go test -race).
func TestUsageConcurrent(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	n := nvmlscantest.NewNode(t, dgxh100.New())
	s := newScanner(t, n, nvmlscan.Options{Health: nvmlscan.HealthOptions{WaitTimeout: 5 * time.Millisecond}})
	stop := startRun(ctx, t, s)
	var wg sync.WaitGroup
	const rounds = 50
	for g := range 4 {
		wg.Go(func() {
			for range rounds {
				u, err := s.Usage(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				for _, gpu := range u {
					if gpu.UtilErr == nil && gpu.UtilGPU != gpu.UtilMemory {
						t.Errorf("goroutine %d: GPU %d torn utilisation %d/%d", g, gpu.Index, gpu.UtilGPU, gpu.UtilMemory)
					}
				}
			}
		})
	}
	wg.Go(func() {
		for r := range rounds {
			if _, err := s.Scan(ctx); err != nil {
				t.Error(err)
				return
			}
			n.XID(r%8, 79)
		}
	})
	wg.Go(func() {
		for r := range rounds * 4 {
			i := r % 8
			n.SetUtilization(i, uint32(r%101), uint32(r%101))
			n.SetProcesses(i, []nvml.ProcessInfo{{Pid: uint32(r), UsedGpuMemory: uint64(r) << 20}})
			n.SetMemoryUsed(i, uint64(r))
			n.SetLost(i, r%3 == 0)
			_ = n.SetReturn(i, nvmlsim.QueryUtilizationRates, []nvml.Return{nvml.SUCCESS, nvml.ERROR_NOT_SUPPORTED}[r%2])
		}
	})
	wg.Wait()
	if err := stop(); err != nil {
		t.Error(err)
	}
}

// TestUsageConformance drives Usage with the NVML of every monitor-metrics.json vector (the
// node's answers to HAMi's host queries) on a simulated node, and checks that HAMi's rule on
// the fields gives exactly the host series HAMi exposed: memory used when the memory query
// answered; core utilisation (and, master, memory-controller utilisation) when utilisation
// answered and memory answered or is not supported; nothing else. So a monitor that applies
// the rule to Usage serves HAMi's host families diff-free.
func TestUsageConformance(t *testing.T) {
	t.Parallel()
	type device struct {
		UUID         string `json:"uuid"`
		Name         string `json:"name"`
		MemoryUsed   uint64 `json:"memory_used"`
		MemoryTotal  uint64 `json:"memory_total"`
		MemoryReturn string `json:"memory_return"`
		UtilGPU      uint32 `json:"util_gpu"`
		UtilMemory   uint32 `json:"util_memory"`
		UtilReturn   string `json:"util_return"`
	}
	type vector struct {
		Name  string `json:"name"`
		Input struct {
			NVML struct {
				Devices []device `json:"devices"`
			} `json:"nvml"`
		} `json:"input"`
		WantText  string `json:"want_text"`
		WantPanic string `json:"want_panic"`
	}
	hostFamilies := []string{"hami_host_gpu_memory_used_bytes", "hami_host_gpu_utilization_ratio",
		"hami_host_gpu_memory_controller_utilization_ratio"}
	for _, f := range vectors.Folders(t) {
		var file struct {
			Vectors []vector `json:"vectors"`
		}
		if !f.Read(t, "monitor-metrics.json", &file) {
			continue
		}
		checked := 0
		for _, v := range file.Vectors {
			if v.WantPanic != "" || v.WantText == "" {
				continue
			}
			checked++
			t.Run(f.Name()+"/"+v.Name, func(t *testing.T) {
				devs := v.Input.NVML.Devices
				srv := dgxa100.New()
				if len(devs) > len(srv.Devices) {
					t.Fatalf("%d GPUs, the simulated node has %d", len(devs), len(srv.Devices))
				}
				srv.Devices = srv.Devices[:len(devs)]
				n := nvmlscantest.NewNode(t, srv)
				for i, d := range devs {
					n.Device(i).UUID = d.UUID
					n.SetName(i, d.Name)
					n.SetMemoryTotal(i, d.MemoryTotal)
					n.SetMemoryUsed(i, d.MemoryUsed)
					n.SetUtilization(i, d.UtilGPU, d.UtilMemory)
					nvmlscantest.SetReturn(t, n, i, nvmlsim.QueryMemoryInfo, vectorReturn(t, d.MemoryReturn))
					nvmlscantest.SetReturn(t, n, i, nvmlsim.QueryUtilizationRates, vectorReturn(t, d.UtilReturn))
				}
				s := newScanner(t, n, nvmlscan.Options{})
				var got []string
				for _, u := range usage(testContext(t), t, s) {
					if u.MemoryErr != nil && !errors.Is(u.MemoryErr, nvmlscan.ErrNotSupported) {
						continue
					}
					labels := fmt.Sprintf("device_index=%q,device_type=%q,device_uuid=%q", strconv.Itoa(u.Index), "NVIDIA-"+u.Name, u.UUID)
					if u.MemoryErr == nil {
						got = append(got, fmt.Sprintf("%s{%s} %v", hostFamilies[0], labels, float64(u.MemoryUsed)))
					}
					if u.UtilErr == nil {
						got = append(got, fmt.Sprintf("%s{%s} %v", hostFamilies[1], labels, float64(u.UtilGPU)))
						if !f.V290 {
							got = append(got, fmt.Sprintf("%s{%s} %v", hostFamilies[2], labels, float64(u.UtilMemory)))
						}
					}
				}
				want := hostSeries(t, v.WantText, hostFamilies)
				if diff := cmp.Diff(want, got, cmpopts.SortSlices(func(a, b string) bool { return a < b }), cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("host series (-HAMi +from Usage):\n%s", diff)
				}
			})
		}
		t.Logf("checked %d vectors from %s", checked, f.Dir)
	}
}

// hostSeries returns the samples of the host families in HAMi's exposition, as
// "family{device_index=…,device_type=…,device_uuid=…} value", without the node and zone
// labels (the monitor's, not NVML's).
func hostSeries(t *testing.T, text string, families []string) []string {
	t.Helper()
	var out []string
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		name, rest, ok := strings.Cut(line, "{")
		if !ok || strings.HasPrefix(line, "#") || !contains(families, name) {
			continue
		}
		labelText, value, ok := strings.Cut(rest, "} ")
		if !ok {
			t.Fatalf("sample %q", line)
		}
		var kept []string
		for l := range strings.SplitSeq(labelText, ",") {
			if !strings.HasPrefix(l, "node=") && !strings.HasPrefix(l, "zone=") {
				kept = append(kept, l)
			}
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("sample %q: %v", line, err)
		}
		out = append(out, fmt.Sprintf("%s{%s} %v", name, strings.Join(kept, ","), v))
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// vectorReturn is the nvml.Return of a vector's "*_return" ("" is SUCCESS).
func vectorReturn(t *testing.T, name string) nvml.Return {
	t.Helper()
	if name == "" {
		return nvml.SUCCESS
	}
	for r := range nvml.Return(1000) {
		if fmt.Sprint(r) == name {
			return r
		}
	}
	t.Fatalf("unknown NVML return %q", name)
	return nvml.SUCCESS
}
