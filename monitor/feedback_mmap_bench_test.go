//go:build unix

package monitor

import (
	"encoding/binary"
	"os"
	"syscall"
	"testing"

	"github.com/hamireg/hamireg/hamicore/region"
)

// hamiMapped is a region as HAMi's monitor holds it: the file mapped shared, read and
// written in place.
type hamiMapped struct {
	mem                   []byte
	num, uuids            int
	rk, sw, prio          int
	deviceMax, uuidStride int
}

// benchHAMiMmap is BenchmarkFeedbackRound's baseline: HAMi v2.10.0's Observe over mapped
// regions (mapped once, as HAMi adopts a folder once), counts keyed by the 96-byte UUID
// string in a slice grown to the priority.
func benchHAMiMmap(b *testing.B) {
	node, _ := benchNode(b)
	regs := make([]*hamiMapped, 0, len(node.dirs))
	for _, d := range node.dirs {
		f, err := os.OpenFile(node.path(d), os.O_RDWR, 0)
		if err != nil {
			b.Fatal(err)
		}
		st, err := f.Stat()
		if err != nil {
			b.Fatal(err)
		}
		mem, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
		_ = f.Close()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = syscall.Munmap(mem) })
		rk, _ := region.LayoutV1.Offset(region.FieldRecentKernel)
		sw, _ := region.LayoutV1.Offset(region.FieldUtilizationSwitch)
		prio, _ := region.LayoutV1.Offset(region.FieldPriority)
		regs = append(regs, &hamiMapped{mem: mem, num: 56, uuids: 64, rk: int(rk), sw: int(sw), prio: int(prio),
			deviceMax: region.MaxDevices, uuidStride: region.UUIDSize})
	}
	le := binary.LittleEndian
	get := func(r *hamiMapped, off int) int32 { return int32(le.Uint32(r.mem[off:])) }
	set := func(r *hamiMapped, off int, v int32) { le.PutUint32(r.mem[off:], uint32(v)) }
	uuid := func(r *hamiMapped, i int) string {
		return string(r.mem[r.uuids+i*r.uuidStride : r.uuids+(i+1)*r.uuidStride])
	}
	valid := func(r *hamiMapped, i int) bool { return r.mem[r.uuids+i*r.uuidStride] != 0 }
	blocking := func(counts map[string][]int, p int, r *hamiMapped) bool {
		for i := range r.deviceMax {
			s, ok := counts[uuid(r, i)]
			if !ok {
				continue
			}
			for j := 0; j < min(p, len(s)); j++ {
				if s[j] > 0 {
					return true
				}
			}
		}
		return false
	}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		n++
		b.StopTimer()
		for _, r := range regs {
			set(r, r.rk, 2)
		}
		b.StartTimer()
		counts := map[string][]int{}
		for _, r := range regs {
			rk := get(r, r.rk)
			if rk <= 0 {
				continue
			}
			rk--
			if p := int(get(r, r.prio)); rk > 0 && p >= 0 {
				for i := range r.deviceMax {
					if !valid(r, i) {
						continue
					}
					s := counts[uuid(r, i)]
					for len(s) <= p {
						s = append(s, 0)
					}
					s[p]++
					counts[uuid(r, i)] = s
				}
			}
			set(r, r.rk, rk)
		}
		for _, r := range regs {
			p, rk, sw := int(get(r, r.prio)), get(r, r.rk), get(r, r.sw)
			blocked := blocking(counts, p, r)
			switch {
			case blocked && rk >= 0:
				set(r, r.rk, -1)
			case !blocked && rk < 0:
				set(r, r.rk, 0)
			}
			on := blocked
			for i := range r.deviceMax {
				if s := counts[uuid(r, i)]; p >= 0 && p < len(s) && s[p] > 1 {
					on = true
				}
			}
			switch {
			case on && sw != 1:
				set(r, r.sw, 1)
			case !on && sw != 0:
				set(r, r.sw, 0)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n)/1e6, "round-ms")
}
