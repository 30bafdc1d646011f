package nvmlsim_test

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"

	"github.com/hamireg/hamireg/nvmlscan/nvmlsim"
)

func newNode(t *testing.T, name string) *nvmlsim.Node {
	t.Helper()
	n, err := nvmlsim.New(name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestUsageDefaults: a wired GPU is idle (no memory used, all of it free, no utilisation, no
// process) and answers the preset's name and memory.
func TestUsageDefaults(t *testing.T) {
	t.Parallel()
	for _, server := range nvmlsim.Servers() {
		n := newNode(t, server)
		for i := range n.Server.Devices {
			d := n.Device(i)
			mem, ret := d.GetMemoryInfo()
			if total := d.Config.MemoryMB << 20; ret != nvml.SUCCESS || mem != (nvml.Memory{Total: total, Free: total}) || total == 0 {
				t.Errorf("%s GPU %d: GetMemoryInfo = %+v, %v; want %d bytes free", server, i, mem, ret, total)
			}
			if u, ret := d.GetUtilizationRates(); ret != nvml.SUCCESS || u != (nvml.Utilization{}) {
				t.Errorf("%s GPU %d: GetUtilizationRates = %+v, %v", server, i, u, ret)
			}
			if p, ret := d.GetComputeRunningProcesses(); ret != nvml.SUCCESS || len(p) != 0 {
				t.Errorf("%s GPU %d: GetComputeRunningProcesses = %+v, %v", server, i, p, ret)
			}
			if name, ret := d.GetName(); ret != nvml.SUCCESS || name != d.Config.Name {
				t.Errorf("%s GPU %d: GetName = %q, %v", server, i, name, ret)
			}
		}
	}
}

// TestUsageSetters: what the setters set is what the queries answer, for that GPU only; used
// memory follows the processes until SetMemoryUsed fixes it.
func TestUsageSetters(t *testing.T) {
	t.Parallel()
	n := newNode(t, "dgxh100")
	d := n.Device(3)
	total := d.Config.MemoryMB << 20
	procs := []nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: 5 << 20}, {Pid: 11, UsedGpuMemory: ^uint64(0)}, {Pid: 12, UsedGpuMemory: 2 << 20}}
	n.SetProcesses(3, procs)
	procs[0].Pid = 99 // the node keeps its own copy
	n.SetUtilization(3, 75, 20)
	got, ret := d.GetComputeRunningProcesses()
	want := []nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: 5 << 20}, {Pid: 11, UsedGpuMemory: ^uint64(0)}, {Pid: 12, UsedGpuMemory: 2 << 20}}
	if diff := cmp.Diff(want, got); ret != nvml.SUCCESS || diff != "" {
		t.Errorf("processes %v (-want +got):\n%s", ret, diff)
	}
	got[0].Pid = 1 // the caller's copy
	if again, _ := d.GetComputeRunningProcesses(); again[0].Pid != 10 {
		t.Error("a caller changed the node's processes")
	}
	if mem, _ := d.GetMemoryInfo(); mem != (nvml.Memory{Total: total, Used: 7 << 20, Free: total - 7<<20}) {
		t.Errorf("memory %+v, want the processes' 7 MiB used (VALUE_NOT_AVAILABLE not counted)", mem)
	}
	if u, _ := d.GetUtilizationRates(); u != (nvml.Utilization{Gpu: 75, Memory: 20}) {
		t.Errorf("utilization %+v", u)
	}
	n.SetMemoryUsed(3, 1<<30)
	if mem, _ := d.GetMemoryInfo(); mem.Used != 1<<30 || mem.Free != total-1<<30 {
		t.Errorf("memory %+v after SetMemoryUsed", mem)
	}
	n.SetMemoryTotal(3, 1<<29)
	n.SetName(3, "NVIDIA GB10")
	if mem, _ := d.GetMemoryInfo(); mem != (nvml.Memory{Total: 1 << 29, Used: 1 << 30}) {
		t.Errorf("memory %+v: used beyond total leaves nothing free", mem)
	}
	if name, _ := d.GetName(); name != "NVIDIA GB10" {
		t.Errorf("name %q", name)
	}
	// The other GPUs are untouched.
	other := n.Device(4)
	if mem, _ := other.GetMemoryInfo(); mem.Used != 0 || mem.Total != total {
		t.Errorf("GPU 4 memory %+v", mem)
	}
	if name, _ := other.GetName(); name != other.Config.Name {
		t.Errorf("GPU 4 name %q", name)
	}
	// SetLost still wins over SetName.
	n.SetLost(3, true)
	if _, ret := d.GetName(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("lost GPU's GetName: %v", ret)
	}
}

// TestSetReturn: each query answers the code set for it, with zero values, and answers
// normally again after nvml.SUCCESS; an unknown query is refused.
func TestSetReturn(t *testing.T) {
	t.Parallel()
	n := newNode(t, "dgxa100")
	d := n.Device(1)
	n.SetUtilization(1, 5, 6)
	n.SetProcesses(1, []nvml.ProcessInfo{{Pid: 1, UsedGpuMemory: 1}})
	answers := func() map[nvmlsim.Query]nvml.Return {
		m, r1 := d.GetMemoryInfo()
		u, r2 := d.GetUtilizationRates()
		p, r3 := d.GetComputeRunningProcesses()
		name, r4 := d.GetName()
		uuid, r5 := d.GetUUID()
		zero := map[nvmlsim.Query]bool{nvmlsim.QueryMemoryInfo: m == nvml.Memory{}, nvmlsim.QueryUtilizationRates: u == nvml.Utilization{},
			nvmlsim.QueryComputeRunningProcesses: p == nil, nvmlsim.QueryName: name == "", nvmlsim.QueryUUID: uuid == ""}
		got := map[nvmlsim.Query]nvml.Return{nvmlsim.QueryMemoryInfo: r1, nvmlsim.QueryUtilizationRates: r2,
			nvmlsim.QueryComputeRunningProcesses: r3, nvmlsim.QueryName: r4, nvmlsim.QueryUUID: r5}
		for q, ret := range got {
			if (ret != nvml.SUCCESS) != zero[q] {
				t.Errorf("%s answered %v with zero values %v", q, ret, zero[q])
			}
		}
		return got
	}
	all := func(ret nvml.Return) map[nvmlsim.Query]nvml.Return {
		m := map[nvmlsim.Query]nvml.Return{}
		for _, q := range nvmlsim.Queries() {
			m[q] = ret
		}
		return m
	}
	if diff := cmp.Diff(all(nvml.SUCCESS), answers()); diff != "" {
		t.Fatalf("before SetReturn (-want +got):\n%s", diff)
	}
	for _, q := range nvmlsim.Queries() {
		if err := n.SetReturn(1, q, nvml.ERROR_UNKNOWN); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(all(nvml.ERROR_UNKNOWN), answers()); diff != "" {
		t.Errorf("after SetReturn (-want +got):\n%s", diff)
	}
	if other, ret := n.Device(2).GetUtilizationRates(); ret != nvml.SUCCESS || other != (nvml.Utilization{}) {
		t.Errorf("GPU 2 answers %v", ret)
	}
	for _, q := range nvmlsim.Queries() {
		if err := n.SetReturn(1, q, nvml.SUCCESS); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(all(nvml.SUCCESS), answers()); diff != "" {
		t.Errorf("after SetReturn(SUCCESS) (-want +got):\n%s", diff)
	}
	if u, _ := d.GetUtilizationRates(); u != (nvml.Utilization{Gpu: 5, Memory: 6}) {
		t.Errorf("utilization %+v after the override is lifted", u)
	}
	if err := n.SetReturn(1, "GetTemperature", nvml.ERROR_UNKNOWN); !errors.Is(err, nvmlsim.ErrUnknownQuery) {
		t.Errorf("SetReturn of an unknown query: %v", err)
	}
	if !slices.IsSorted(nvmlsim.Queries()) || len(nvmlsim.Queries()) != 5 {
		t.Errorf("Queries() = %v", nvmlsim.Queries())
	}
}

// TestUsageMIGUtilization: a GPU in MIG mode answers its utilisation ERROR_NOT_SUPPORTED, as
// NVML does; its memory and processes still answer; MIG off answers again.
func TestUsageMIGUtilization(t *testing.T) {
	t.Parallel()
	n := newNode(t, "dgxa100")
	d := n.Device(0)
	n.SetUtilization(0, 40, 10)
	if ret, _ := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := d.GetUtilizationRates(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("MIG GPU utilization: %v, want ERROR_NOT_SUPPORTED", ret)
	}
	if _, ret := n.Device(1).GetUtilizationRates(); ret != nvml.SUCCESS {
		t.Errorf("GPU 1 (MIG off) utilization: %v", ret)
	}
	if _, ret := d.GetMemoryInfo(); ret != nvml.SUCCESS {
		t.Errorf("MIG GPU memory: %v", ret)
	}
	if _, ret := d.GetComputeRunningProcesses(); ret != nvml.SUCCESS {
		t.Errorf("MIG GPU processes: %v", ret)
	}
	if ret, _ := d.SetMigMode(nvml.DEVICE_MIG_DISABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if u, ret := d.GetUtilizationRates(); ret != nvml.SUCCESS || u.Gpu != 40 {
		t.Errorf("utilization after MIG off: %+v, %v", u, ret)
	}
}

// TestUsageConcurrent sets and queries usage from several goroutines (go test -race); every
// answer is one that was set as a whole.
func TestUsageConcurrent(t *testing.T) {
	t.Parallel()
	n := newNode(t, "dgxh100")
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			for r := range 200 {
				i := (r + w) % 8
				v := uint32(r % 100)
				n.SetUtilization(i, v, v)
				n.SetProcesses(i, []nvml.ProcessInfo{{Pid: v, UsedGpuMemory: uint64(v)}, {Pid: v, UsedGpuMemory: uint64(v)}})
				if r%10 == 0 {
					_ = n.SetReturn(i, nvmlsim.QueryComputeRunningProcesses, nvml.ERROR_UNKNOWN)
					_ = n.SetReturn(i, nvmlsim.QueryComputeRunningProcesses, nvml.SUCCESS)
				}
			}
		})
		wg.Go(func() {
			for r := range 200 {
				d := n.Device(r % 8)
				if u, ret := d.GetUtilizationRates(); ret == nvml.SUCCESS && u.Gpu != u.Memory {
					t.Errorf("torn utilization %+v", u)
				}
				if p, ret := d.GetComputeRunningProcesses(); ret == nvml.SUCCESS && len(p) == 2 && p[0] != p[1] {
					t.Errorf("torn processes %+v", p)
				}
				_, _ = d.GetMemoryInfo()
				_, _ = d.GetName()
			}
		})
	}
	wg.Wait()
}
