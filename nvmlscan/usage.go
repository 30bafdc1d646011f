package nvmlscan

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
)

// GPUUsage is one host GPU's live usage, what HAMi's monitor exports as its host families
// (hami_host_gpu_memory_used_bytes, hami_host_gpu_utilization_ratio,
// hami_host_gpu_memory_controller_utilization_ratio), with the GPU's compute processes
// besides. A query that failed leaves its values zero and sets its error field, a
// [*DeviceError] naming the GPU and the query.
type GPUUsage struct {
	// Index is the GPU's host NVML index (the enumeration index, HAMi's device_index).
	Index int
	// UUID is the GPU's UUID ("GPU-…").
	UUID string
	// Name is nvmlDeviceGetName, e.g. "NVIDIA A100-SXM4-40GB" (HAMi's device_type is
	// "NVIDIA-" + Name).
	Name string
	// MemoryUsed is nvmlDeviceGetMemoryInfo's (v1) used, in bytes.
	MemoryUsed uint64
	// MemoryTotal is nvmlDeviceGetMemoryInfo's (v1) total, in bytes.
	MemoryTotal uint64
	// MemoryErr is the memory query's error, nil when it answered. errors.Is(MemoryErr,
	// [ErrNotSupported]) when NVML answers ERROR_NOT_SUPPORTED (unified memory, such as a
	// GB10: HAMi skips only the memory series of the GPU); any other error: HAMi skips every
	// host series of the GPU.
	MemoryErr error
	// UtilGPU and UtilMemory are nvmlDeviceGetUtilizationRates' gpu (core) and memory
	// (memory controller) utilisation, in percent over NVML's last sample period.
	UtilGPU, UtilMemory uint32
	// UtilErr is the utilisation query's error, nil when it answered; errors.Is
	// [ErrNotSupported] when NVML answers ERROR_NOT_SUPPORTED, as it does on a GPU in MIG mode.
	UtilErr error
	// Processes are the GPU's compute processes (nvmlDeviceGetComputeRunningProcesses, v3 as
	// go-nvml exposes it), in NVML's order. On a GPU in MIG mode they are the processes of all
	// its MIG devices, when the caller may see them.
	Processes []ProcessUsage
	// ProcessesErr is the process query's error, nil when it answered (ERROR_NO_PERMISSION
	// when the caller may not see other users' processes on a MIG GPU).
	ProcessesErr error
}

// ProcessUsage is one compute process on a GPU, as NVML sees it.
type ProcessUsage struct {
	// PID is the host PID (NVML knows no container PID namespace).
	PID uint32
	// UsedMemory is NVML's usedGpuMemory in bytes; NVML_VALUE_NOT_AVAILABLE
	// (math.MaxUint64) passes through unchanged.
	UsedMemory uint64
}

// Usage reads the live usage of every host GPU, in NVML index order, through the scanner's
// NVML (initialised once by [New]; HAMi's monitor initialises and shuts NVML down on every
// scrape). MIG mode changes nothing: the GPUs are the parent GPUs, as HAMi reports them.
//
// A query that fails for one GPU sets that GPU's error field (MemoryErr, UtilErr,
// ProcessesErr) and the other GPUs and queries are still read; an answer of
// ERROR_NOT_SUPPORTED errors.Is [ErrNotSupported] (and nvml.ERROR_NOT_SUPPORTED). A GPU whose
// handle, UUID or name cannot be read is left out (logged at V(2)): without them it has no
// identity to report, and HAMi emits no series for it either.
//
// Usage returns an error only when NVML cannot count the GPUs, when ctx ends, or after
// [Scanner.Close] ([ErrClosed]). It is serialised with scans and the MIG manager's calls.
func (s *Scanner) Usage(ctx context.Context) ([]GPUUsage, error) {
	s.scanMu.Lock()
	defer s.scanMu.Unlock()
	if s.isClosed() {
		return nil, fmt.Errorf("read usage: %w", ErrClosed)
	}
	logger := klog.FromContext(ctx)
	n, ret := s.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("count devices: %w", ret)
	}
	out := make([]GPUUsage, 0, min(max(n, 0), 64))
	for i := range n {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("read usage: %w", context.Cause(ctx))
		}
		u, err := s.usage(i)
		if err != nil {
			logger.V(2).Info("Skipping GPU in usage", "index", i, "gpuUUID", err.UUID, "err", err)
			continue
		}
		out = append(out, u)
	}
	return out, nil
}

// usage reads GPU i, or returns the error of its handle, UUID or name query.
func (s *Scanner) usage(i int) (GPUUsage, *DeviceError) {
	u := GPUUsage{Index: i}
	fail := func(op Op, ret nvml.Return) (GPUUsage, *DeviceError) {
		return GPUUsage{}, &DeviceError{Index: i, UUID: u.UUID, Op: op, Err: ret}
	}
	dev, ret := s.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS || dev == nil {
		return fail(OpHandle, handleReturn(ret))
	}
	if u.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
		u.UUID = ""
		return fail(OpUUID, ret)
	}
	if u.Name, ret = dev.GetName(); ret != nvml.SUCCESS {
		return fail(OpName, ret)
	}
	queryErr := func(op Op, ret nvml.Return) error {
		var err error = ret
		if ret == nvml.ERROR_NOT_SUPPORTED {
			err = fmt.Errorf("%w: %w", ErrNotSupported, ret)
		}
		return &DeviceError{Index: i, UUID: u.UUID, Op: op, Err: err}
	}
	if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
		u.MemoryUsed, u.MemoryTotal = mem.Used, mem.Total
	} else {
		u.MemoryErr = queryErr(OpMemory, ret)
	}
	if util, ret := dev.GetUtilizationRates(); ret == nvml.SUCCESS {
		u.UtilGPU, u.UtilMemory = util.Gpu, util.Memory
	} else {
		u.UtilErr = queryErr(OpUtilization, ret)
	}
	if procs, ret := dev.GetComputeRunningProcesses(); ret == nvml.SUCCESS {
		u.Processes = make([]ProcessUsage, len(procs))
		for j, p := range procs {
			u.Processes[j] = ProcessUsage{PID: p.Pid, UsedMemory: p.UsedGpuMemory}
		}
	} else {
		u.ProcessesErr = queryErr(OpProcesses, ret)
	}
	return u, nil
}

// handleReturn is the code of a failed handle query: ERROR_UNKNOWN for a nil handle that NVML
// reported as a success.
func handleReturn(ret nvml.Return) nvml.Return {
	if ret == nvml.SUCCESS {
		return nvml.ERROR_UNKNOWN
	}
	return ret
}
