package nvmlsim

import (
	"errors"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Query names an NVML query of a simulated GPU whose answer [Node.SetReturn] can replace.
type Query string

// The queries [Node.SetReturn] takes: the ones a node monitor makes of every GPU.
const (
	QueryMemoryInfo              Query = "GetMemoryInfo"
	QueryUtilizationRates        Query = "GetUtilizationRates"
	QueryComputeRunningProcesses Query = "GetComputeRunningProcesses"
	QueryName                    Query = "GetName"
	QueryUUID                    Query = "GetUUID"
)

// Queries returns the queries [Node.SetReturn] takes, sorted.
func Queries() []Query {
	q := []Query{QueryMemoryInfo, QueryUtilizationRates, QueryComputeRunningProcesses, QueryName, QueryUUID}
	slices.Sort(q)
	return q
}

// ErrUnknownQuery is returned by [Node.SetReturn] for a query that [Queries] does not list.
var ErrUnknownQuery = errors.New("unknown simulated NVML query")

// gpuUsage is the live usage of one simulated GPU. Every field is guarded by Node.usageMu.
type gpuUsage struct {
	// used is the memory in use set by SetMemoryUsed; nil means the sum of the processes'.
	used *uint64
	// total is the memory set by SetMemoryTotal; nil means the server device's MemoryInfo.Total.
	total *uint64
	// name is the name set by SetName; nil means the server device's.
	name  *string
	util  nvml.Utilization
	procs []nvml.ProcessInfo
	// ret holds the answers SetReturn replaced; a query not in it answers normally.
	ret map[Query]nvml.Return
}

// wireUsage wires the usage queries of GPU i: GetMemoryInfo, GetUtilizationRates,
// GetComputeRunningProcesses, and the SetReturn overrides of GetName and GetUUID.
func (n *Node) wireUsage(i int) {
	d := n.Device(i)
	n.usage[i] = &gpuUsage{ret: map[Query]nvml.Return{}}
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		n.usageMu.Lock()
		defer n.usageMu.Unlock()
		u := n.usage[i]
		if ret, ok := u.ret[QueryMemoryInfo]; ok {
			return nvml.Memory{}, ret
		}
		used, total := u.processMemory(), d.MemoryInfo.Total
		if u.used != nil {
			used = *u.used
		}
		if u.total != nil {
			total = *u.total
		}
		var free uint64
		if used < total {
			free = total - used
		}
		return nvml.Memory{Total: total, Free: free, Used: used}, nvml.SUCCESS
	}
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		mig := n.migEnabled(i)
		n.usageMu.Lock()
		defer n.usageMu.Unlock()
		u := n.usage[i]
		if ret, ok := u.ret[QueryUtilizationRates]; ok {
			return nvml.Utilization{}, ret
		}
		if mig {
			return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED
		}
		return u.util, nvml.SUCCESS
	}
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		n.usageMu.Lock()
		defer n.usageMu.Unlock()
		u := n.usage[i]
		if ret, ok := u.ret[QueryComputeRunningProcesses]; ok {
			return nil, ret
		}
		return slices.Clone(u.procs), nvml.SUCCESS
	}
	getName := d.GetNameFunc
	d.GetNameFunc = func() (string, nvml.Return) {
		if ret, ok := n.answer(i, QueryName); ok {
			return "", ret
		}
		name, ret := getName()
		if ret != nvml.SUCCESS {
			return "", ret
		}
		n.usageMu.Lock()
		defer n.usageMu.Unlock()
		if set := n.usage[i].name; set != nil {
			return *set, nvml.SUCCESS
		}
		return name, nvml.SUCCESS
	}
	getUUID := d.GetUUIDFunc
	d.GetUUIDFunc = func() (string, nvml.Return) {
		if ret, ok := n.answer(i, QueryUUID); ok {
			return "", ret
		}
		return getUUID()
	}
}

// answer returns the answer SetReturn set for query q of GPU i, if any.
func (n *Node) answer(i int, q Query) (nvml.Return, bool) {
	n.usageMu.Lock()
	defer n.usageMu.Unlock()
	ret, ok := n.usage[i].ret[q]
	return ret, ok
}

// migEnabled reports whether MIG mode is on (current mode) on GPU i.
func (n *Node) migEnabled(i int) bool {
	n.migMu.Lock()
	defer n.migMu.Unlock()
	return n.mig[i].current == nvml.DEVICE_MIG_ENABLE
}

// processMemory is the sum of the processes' memory, saturating, skipping NVML's
// VALUE_NOT_AVAILABLE.
func (u *gpuUsage) processMemory() uint64 {
	var sum uint64
	for _, p := range u.procs {
		if p.UsedGpuMemory == notAvailable {
			continue
		}
		if sum+p.UsedGpuMemory < sum {
			return ^uint64(0)
		}
		sum += p.UsedGpuMemory
	}
	return sum
}

// notAvailable is NVML's NVML_VALUE_NOT_AVAILABLE in a 64-bit field.
const notAvailable = ^uint64(0)

// update runs f on GPU i's usage under the lock.
func (n *Node) update(i int, f func(u *gpuUsage)) {
	n.usageMu.Lock()
	defer n.usageMu.Unlock()
	f(n.usage[i])
}

// SetUtilization sets what GetUtilizationRates answers for GPU i: gpu and memory are
// nvmlUtilization_t's gpu and memory, in percent (0 until set). While GPU i is in MIG mode
// the query answers ERROR_NOT_SUPPORTED instead, as NVML does on a MIG-enabled GPU.
func (n *Node) SetUtilization(i int, gpu, memory uint32) {
	n.update(i, func(u *gpuUsage) { u.util = nvml.Utilization{Gpu: gpu, Memory: memory} })
}

// SetProcesses sets the processes GetComputeRunningProcesses lists for GPU i (none until
// set), in that order; the slice is copied. Pid is the host PID and UsedGpuMemory the bytes
// NVML reports for the process (NVML_VALUE_NOT_AVAILABLE is all ones). Unless
// [Node.SetMemoryUsed] fixed it, GetMemoryInfo's Used is the sum of their UsedGpuMemory.
func (n *Node) SetProcesses(i int, procs []nvml.ProcessInfo) {
	procs = slices.Clone(procs)
	n.update(i, func(u *gpuUsage) { u.procs = procs })
}

// SetMemoryUsed fixes GetMemoryInfo's Used for GPU i at bytes (Free becomes Total − Used, 0
// when Used exceeds Total). Until it is called, Used is the sum of the memory of the
// processes of [Node.SetProcesses]: 0 on an idle GPU.
func (n *Node) SetMemoryUsed(i int, bytes uint64) {
	n.update(i, func(u *gpuUsage) { u.used = &bytes })
}

// SetMemoryTotal sets GetMemoryInfo's Total for GPU i (until then the server device's
// MemoryInfo.Total, the preset's memory, which a caller may change before anything queries
// the GPU). A scanner registers the new total at its next scan.
func (n *Node) SetMemoryTotal(i int, bytes uint64) {
	n.update(i, func(u *gpuUsage) { u.total = &bytes })
}

// SetName sets what GetName answers for GPU i (the server preset's name, such as
// "NVIDIA A100-SXM4-40GB", until set). The names of its MIG devices and the models of
// [Node.SetTopology] keep the preset's.
func (n *Node) SetName(i int, name string) {
	n.update(i, func(u *gpuUsage) { u.name = &name })
}

// SetReturn makes query q of GPU i answer ret (and zero values) from now on, as a GPU whose
// driver answers ERROR_NOT_SUPPORTED (unified memory, a MIG-enabled GPU's utilization) or
// ERROR_UNKNOWN does; nvml.SUCCESS makes it answer normally again. An answer set here comes
// before [Node.SetLost]'s ERROR_GPU_IS_LOST and before a MIG-enabled GPU's unsupported
// utilization. It returns an error that errors.Is [ErrUnknownQuery] for
// a query [Queries] does not list.
func (n *Node) SetReturn(i int, q Query, ret nvml.Return) error {
	if !slices.Contains(Queries(), q) {
		return fmt.Errorf("set return of GPU %d: %w %q (%v)", i, ErrUnknownQuery, q, Queries())
	}
	n.update(i, func(u *gpuUsage) {
		if ret == nvml.SUCCESS {
			delete(u.ret, q)
			return
		}
		u.ret[q] = ret
	})
	return nil
}
