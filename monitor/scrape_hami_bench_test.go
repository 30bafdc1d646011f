package monitor

import (
	"context"
	"encoding/binary"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// hamiScrape is the baseline of BenchmarkScrape: HAMi v2.10.0's way of serving the same node.
// Every region is mapped once (as its lister adopts it) and read through the mapping at each
// scrape: per device, one loop over the live slots below proc_num per accessor (context,
// module, buffer, offset, total, SM), then one const metric per series with its label values
// (prometheus.MustNewConstMetric), on a registerer wrapped with zone="vGPU"; host families
// from the same fake host. It does not re-validate the files: a truncated one would fault.
type hamiScrape struct {
	maps [][]byte
	pods []Container // for the labels
	host Host
	now  time.Time

	used, limit, mem, util, ctx, module, buffer, kernel *prometheus.Desc
	lUsed, lLimit, lMem, lUtil, lKernel                 *prometheus.Desc
	hostMem, hostUtil, hostMC, lHostMem, lHostUtil      *prometheus.Desc
}

func newHAMiScrape(tb testing.TB, cs []Container, host Host) *hamiScrape {
	tb.Helper()
	h := &hamiScrape{pods: cs, host: host, now: testNow}
	for _, c := range cs {
		f, err := os.Open(c.Path)
		if err != nil {
			tb.Fatal(err)
		}
		st, err := f.Stat()
		if err != nil {
			tb.Fatal(err)
		}
		mm, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
		_ = f.Close()
		if err != nil {
			tb.Fatal(err)
		}
		h.maps = append(h.maps, mm)
	}
	tb.Cleanup(func() {
		for _, mm := range h.maps {
			_ = syscall.Munmap(mm)
		}
	})
	five := []string{"namespace", "pod", "container", "vdevice_index", "device_uuid"}
	legacy := []string{"podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid"}
	d := func(name string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc(name, name, labels, nil)
	}
	h.used, h.limit, h.mem, h.util = d("hami_vgpu_memory_used_bytes", five), d("hami_vgpu_memory_limit_bytes", five), d("hami_container_device_memory_bytes", five), d("hami_container_device_utilization_ratio", five)
	h.ctx, h.module, h.buffer, h.kernel = d("hami_vgpu_memory_context_bytes", five), d("hami_vgpu_memory_module_bytes", five), d("hami_vgpu_memory_buffer_bytes", five), d("hami_container_last_kernel_elapsed_seconds", five)
	h.lUsed, h.lLimit = d("vGPU_device_memory_usage_in_bytes", legacy), d("vGPU_device_memory_limit_in_bytes", legacy)
	h.lMem = d("Device_memory_desc_of_container", append(append([]string(nil), legacy...), "context", "module", "data", "offset"))
	h.lUtil, h.lKernel = d("Device_utilization_desc_of_container", legacy), d("Device_last_kernel_of_container", legacy)
	hostL := []string{"node", "device_index", "device_uuid", "device_type"}
	h.hostMem, h.hostUtil = d("hami_host_gpu_memory_used_bytes", hostL), d("hami_host_gpu_utilization_ratio", hostL)
	h.hostMC = d("hami_host_gpu_memory_controller_utilization_ratio", hostL[1:])
	h.lHostMem, h.lHostUtil = d("HostGPUMemoryUsage", []string{"nodeid", "deviceidx", "deviceuuid", "devicetype"}), d("HostCoreUtilization", []string{"nodeid", "deviceidx", "deviceuuid", "devicetype"})
	return h
}

func (h *hamiScrape) Describe(chan<- *prometheus.Desc) {}

func (h *hamiScrape) Collect(ch chan<- prometheus.Metric) {
	gauge := prometheus.GaugeValue
	if gpus, err := h.host.GPUs(context.Background()); err == nil {
		for _, g := range gpus {
			idx, typ := strconv.Itoa(g.Index), "NVIDIA-"+g.Name
			ch <- prometheus.MustNewConstMetric(h.hostMem, gauge, float64(g.MemoryUsed), "node1", idx, g.UUID, typ)
			ch <- prometheus.MustNewConstMetric(h.hostUtil, gauge, float64(g.UtilGPU), "node1", idx, g.UUID, typ)
			ch <- prometheus.MustNewConstMetric(h.hostMC, gauge, float64(g.UtilMemory), idx, g.UUID, typ)
			ch <- prometheus.MustNewConstMetric(h.lHostMem, gauge, float64(g.MemoryUsed), "node1", idx, g.UUID, typ)
			ch <- prometheus.MustNewConstMetric(h.lHostUtil, gauge, float64(g.UtilGPU), "node1", idx, g.UUID, typ)
		}
	}
	le := binary.LittleEndian
	sum := func(mm []byte, procs, off int) uint64 {
		var s uint64
		for k := range procs {
			slot := mm[v1Procs+k*v1SlotSize:]
			if le.Uint32(slot[v1Status:]) != 0 {
				s += le.Uint64(slot[off:])
			}
		}
		return s
	}
	for k, mm := range h.maps {
		c := &h.pods[k]
		num := min(int(le.Uint64(mm[v1Num:])), 16)
		procs := min(max(int(int32(le.Uint32(mm[v1ProcNum:]))), 0), 1024)
		for i := range num {
			uuid := mm[64+i*96 : 64+i*96+40]
			if uuid[0] == 0 || !utf8.Valid(uuid) {
				continue
			}
			used := v1Used + i*v1UsedStride
			ctx, module, data, offset := sum(mm, procs, used), sum(mm, procs, used+8), sum(mm, procs, used+16), sum(mm, procs, used+24)
			total, sm := sum(mm, procs, used+32), sum(mm, procs, v1Util+i*v1UtilStride+16)
			limit := le.Uint64(mm[1600+i*8:])
			labels := []string{c.Pod.Namespace, c.Pod.Name, c.Name, strconv.Itoa(i), string(uuid)}
			ch <- prometheus.MustNewConstMetric(h.used, gauge, float64(total), labels...)
			ch <- prometheus.MustNewConstMetric(h.limit, gauge, float64(limit), labels...)
			ch <- prometheus.MustNewConstMetric(h.mem, gauge, float64(total), labels...)
			ch <- prometheus.MustNewConstMetric(h.util, gauge, float64(sm), labels...)
			ch <- prometheus.MustNewConstMetric(h.ctx, gauge, float64(ctx), labels...)
			ch <- prometheus.MustNewConstMetric(h.module, gauge, float64(module), labels...)
			ch <- prometheus.MustNewConstMetric(h.buffer, gauge, float64(data), labels...)
			ch <- prometheus.MustNewConstMetric(h.lUsed, gauge, float64(total), labels...)
			ch <- prometheus.MustNewConstMetric(h.lLimit, gauge, float64(limit), labels...)
			ch <- prometheus.MustNewConstMetric(h.lMem, gauge, float64(total), append(labels, strconv.FormatUint(ctx, 10),
				strconv.FormatUint(module, 10), strconv.FormatUint(data, 10), strconv.FormatUint(offset, 10))...)
			ch <- prometheus.MustNewConstMetric(h.lUtil, gauge, float64(sm), labels...)
			if t := le.Uint64(mm[2008912:]); t > 0 {
				el := max(h.now.Unix()-int64(t), 0)
				ch <- prometheus.MustNewConstMetric(h.kernel, gauge, float64(el), labels...)
				ch <- prometheus.MustNewConstMetric(h.lKernel, gauge, float64(el), labels...)
			}
		}
	}
}
