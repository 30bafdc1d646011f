//go:build unix

package monitor

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// Offsets of the v1.1/1.2 layout (spec §3.2), for the baseline that reads a mapping as HAMi
// does.
const (
	v1Num, v1Procs, v1SlotSize, v1ProcNum                = 56, 1856, 1960, 2008896
	v1Used, v1UsedStride, v1Util, v1UtilStride, v1Status = 8, 64, 1160, 48, 1928
)

// benchContainers and benchGPUs are a full node: 110 containers with 8 GPUs each.
const benchContainers, benchGPUs, benchProcs = 110, 8, 4

// BenchmarkContainers is one scrape's reads of 110 containers × 8 GPUs (4 live CUDA
// processes each): the SDK's Containers (open, pread of the header, tail and live slots,
// close; then the per-device sums the collector takes) against HAMi v2.10.0's way, regions
// mapped once at adoption and every per-device sum (context, module, data, offset, total,
// SM) a separate loop over the slots below proc_num through the mapping on every scrape.
func BenchmarkContainers(b *testing.B) {
	root := b.TempDir()
	pods := make([]*corev1.Pod, 0, benchContainers)
	var paths []string
	for i := range benchContainers {
		uid := types.UID(fmt.Sprintf("0b1c2d3e-0000-4000-8000-%012d", i))
		pods = append(pods, testPod(fmt.Sprintf("pod-%03d", i), uid, []string{"main"}))
		dir := filepath.Join(root, ContainersDir, string(uid)+"_main")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		path := filepath.Join(dir, "9f8e7d6c.cache")
		writeTestRegion(b, path, benchGPUs, benchProcs, 2<<30)
		paths = append(paths, path)
	}
	m, err := New(PodsFunc(func() ([]*corev1.Pod, error) { return pods, nil }), Options{Root: root, NodeName: "node-1", DisableFeedback: true})
	if err != nil {
		b.Fatal(err)
	}
	if err := m.scan(klog.NewContext(b.Context(), logr.Discard())); err != nil {
		b.Fatal(err)
	}
	want := uint64(benchProcs) * (2 << 30)

	b.Run("hamireg", func(b *testing.B) {
		b.ReportAllocs()
		start := time.Now()
		for b.Loop() {
			var sum uint64
			for _, c := range m.Containers(b.Context()) {
				if c.Err != nil {
					b.Fatal(c.Err)
				}
				for i := range c.Region.Devices {
					mem, _ := c.Region.Usage(i)
					sum += mem.Total
				}
			}
			if sum != want*benchContainers*benchGPUs {
				b.Fatalf("sum %d", sum)
			}
		}
		b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), "scrape-ms")
		// What one scrape's result keeps on the heap per container.
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		cs := m.Containers(b.Context())
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(len(cs)), "heap-B/container")
		runtime.KeepAlive(cs)
	})

	b.Run("hami-v2.10.0-mmap", func(b *testing.B) {
		maps := make([][]byte, 0, len(paths))
		for _, p := range paths {
			f, err := os.Open(p)
			if err != nil {
				b.Fatal(err)
			}
			st, err := f.Stat()
			if err != nil {
				b.Fatal(err)
			}
			mm, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
			_ = f.Close()
			if err != nil {
				b.Fatal(err)
			}
			maps = append(maps, mm)
		}
		b.Cleanup(func() {
			for _, mm := range maps {
				_ = syscall.Munmap(mm)
			}
		})
		le := binary.LittleEndian
		// sumSlots is one of HAMi's accessors: a loop over the live slots below proc_num.
		sumSlots := func(mm []byte, procs int, off int) uint64 {
			var s uint64
			for k := range procs {
				slot := mm[v1Procs+k*v1SlotSize:]
				if le.Uint32(slot[v1Status:]) != 0 {
					s += le.Uint64(slot[off:])
				}
			}
			return s
		}
		b.ReportAllocs()
		start := time.Now()
		for b.Loop() {
			var sum uint64
			for _, mm := range maps {
				num := min(int(le.Uint64(mm[v1Num:])), 16)
				procs := min(max(int(int32(le.Uint32(mm[v1ProcNum:]))), 0), 1024)
				for i := range num {
					used := v1Used + i*v1UsedStride
					util := v1Util + i*v1UtilStride
					_ = sumSlots(mm, procs, used)    // context
					_ = sumSlots(mm, procs, used+8)  // module
					_ = sumSlots(mm, procs, used+16) // data
					_ = sumSlots(mm, procs, used+24) // offset
					sum += sumSlots(mm, procs, used+32)
					_ = sumSlots(mm, procs, util+16) // SM
				}
			}
			if sum != want*benchContainers*benchGPUs {
				b.Fatalf("sum %d", sum)
			}
		}
		b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), "scrape-ms")
		b.ReportMetric(0, "heap-B/container")
		b.ReportMetric(float64(len(maps[0])), "mapped-B/container")
	})
}
