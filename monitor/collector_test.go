package monitor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/hamicore/region"
)

const (
	uuidA = "GPU-aa000000-1111-2222-3333-444455556666"
	uuidB = "GPU-bb000000-1111-2222-3333-444455556666"
	gib   = 1 << 30
)

func noPods() Pods { return PodsFunc(func() ([]*corev1.Pod, error) { return nil, nil }) }

func newTestMonitor(tb testing.TB, opts Options) *Monitor {
	tb.Helper()
	if opts.NodeName == "" {
		opts.NodeName = "node1"
	}
	if opts.Clock == nil {
		opts.Clock = clocktesting.NewFakeClock(testNow)
	}
	m, err := New(noPods(), opts)
	if err != nil {
		tb.Fatal(err)
	}
	m.bindScrapeContext(tb.Context()) // as Run does: scrapes query the host
	return m
}

// testRegion is a v1 region on the given devices.
func testRegion(tb testing.TB, uuids ...string) *region.Region {
	tb.Helper()
	r := &region.Region{Layout: region.LayoutV1, Major: 1, Minor: 2, DeviceCount: uint64(len(uuids)), Priority: 1, RecentKernel: 2, UtilizationSwitch: 1}
	for _, u := range uuids {
		var d region.Device
		if u != "" {
			if err := d.SetUUID(u); err != nil {
				tb.Fatal(err)
			}
		}
		d.MemoryLimit = 8 * gib
		r.Devices = append(r.Devices, d)
	}
	return r
}

// addSlot appends a slot of host PID hostpid using total bytes on device dev.
func addSlot(r *region.Region, hostpid int32, status int32, dev int, total uint64) {
	s := region.Slot{Index: len(r.Slots), PID: hostpid % 1000, HostPID: hostpid, Status: status}
	s.Used[dev] = region.Memory{Context: total / 4, Data: total - total/4, Total: total}
	s.Util[dev].SM = 10
	r.Slots = append(r.Slots, s)
	r.ProcNum = int32(len(r.Slots))
}

func testContainer(pod, name string, r *region.Region) Container {
	return Container{Key: pod + "_" + name, Pod: types.NamespacedName{Namespace: "ns", Name: pod}, PodUID: types.UID(pod), Name: name, Region: r}
}

func gatherText(t *testing.T, m *Monitor, cs []Container) string {
	t.Helper()
	text, _ := scrapeText(t, m, cs)
	return text
}

func TestRegister(t *testing.T) {
	m := newTestMonitor(t, Options{})
	reg := prometheus.NewRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	err := m.Register(reg)
	if are := (prometheus.AlreadyRegisteredError{}); !errors.As(err, &are) {
		t.Fatalf("second Register: %v, want an AlreadyRegisteredError", err)
	}
	// The failed second registration left the first one whole.
	n, err := testutil.GatherAndCount(reg, "hami_build_info", "hamireg_monitor_regions")
	if err != nil || n != 1+len(regionStates) {
		t.Fatalf("after the second Register: %d series, %v", n, err)
	}
	if err := m.Register(nil); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("Register(nil): %v", err)
	}

	// A node agent that registered the same hami_build_info already: the monitor keeps it.
	reg2 := prometheus.NewRegistry()
	if err := m.register(reg2, newCollector(m, func(context.Context) []Container { return nil })); err != nil {
		t.Fatal(err)
	}
	reg3 := prometheus.NewRegistry()
	reg3.MustRegister(buildInfoOf(t, reg2))
	if err := m.Register(reg3); err != nil {
		t.Fatalf("Register beside an identical hami_build_info: %v", err)
	}
	// The build info carries no zone label; every other family does.
	text := gatherText(t, m, []Container{testContainer("p", "c", testRegion(t, uuidA))})
	for l := range strings.Lines(text) {
		if strings.HasPrefix(l, "#") {
			continue
		}
		if zoned := strings.Contains(l, `zone="vGPU"`); zoned == strings.HasPrefix(l, "hami_build_info") {
			t.Errorf("zone label wrong on %q", l)
		}
	}
}

// buildInfoOf returns a collector equal to the hami_build_info reg serves.
func buildInfoOf(t *testing.T, reg *prometheus.Registry) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "hami_build_info" {
			labels := prometheus.Labels{}
			for _, lp := range mf.GetMetric()[0].GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "hami_build_info", Help: mf.GetHelp(), ConstLabels: labels}, func() float64 { return 1 })
		}
	}
	t.Fatal("no hami_build_info")
	return nil
}

// TestCollectorSDKRules asserts the rules by which the SDK's series differ from HAMi's, for
// both versions: every container with a region is reported (init containers and containers
// of pods HAMi's scheduler did not label included), sums cover the live slots only, a UUID
// HAMi-core has not written is never served.
func TestCollectorSDKRules(t *testing.T) {
	for _, v := range []annotation.Version{annotation.VersionMaster, annotation.VersionV290} {
		t.Run(fmt.Sprint(v), func(t *testing.T) {
			m := newTestMonitor(t, Options{Version: v})
			r := testRegion(t, uuidA, "")
			addSlot(r, 4001, 1, 0, 1*gib)
			addSlot(r, 4002, 0, 0, 3*gib) // exited
			addSlot(r, 4003, 1, 1, 2*gib) // on the device whose UUID is not written
			init := testContainer("p", "warmup", r)
			init.Init = true
			text := gatherText(t, m, []Container{init})
			want := `hami_vgpu_memory_used_bytes{container="warmup",device_uuid="` + uuidA + `",namespace="ns",pod="p",vdevice_index="0",zone="vGPU"} 1.073741824e+09`
			if !strings.Contains(text, want+"\n") {
				t.Errorf("no %s in\n%s", want, text)
			}
			if strings.Contains(text, `vdevice_index="1"`) || strings.Contains(text, "\x00") {
				t.Errorf("the device with an unwritten UUID is served:\n%s", text)
			}
		})
	}
}

func TestCollectorHost(t *testing.T) {
	host := &fakeHost{gpus: []HostGPU{
		{Index: 0, UUID: uuidA, Name: "NVIDIA A10", MemoryUsed: gib, UtilGPU: 10, UtilMemory: 2},
		{Index: 1, UUID: uuidB, Name: "NVIDIA A10", MemoryErr: errors.New("nvml: ERROR_UNKNOWN"), UtilGPU: 7},
	}}
	m := newTestMonitor(t, Options{Host: host})
	text := gatherText(t, m, nil)
	for _, want := range []string{
		`hamireg_monitor_host_up 1`,
		`hami_host_gpu_memory_used_bytes{device_index="0",device_type="NVIDIA-NVIDIA A10",device_uuid="` + uuidA + `",node="node1",zone="vGPU"} 1.073741824e+09`,
		`hamireg_monitor_regions{state="ok",zone="vGPU"} 0`,
	} {
		if !strings.Contains(strings.ReplaceAll(text, `hamireg_monitor_host_up{zone="vGPU"}`, "hamireg_monitor_host_up"), want+"\n") {
			t.Errorf("no %s in\n%s", want, text)
		}
	}
	if strings.Contains(text, uuidB) {
		t.Errorf("a GPU whose memory query failed is served:\n%s", text)
	}

	// The host query fails: no host series, host_up 0.
	m = newTestMonitor(t, Options{Host: &fakeHost{err: errors.New("nvml: init failed")}})
	text = gatherText(t, m, nil)
	if strings.Contains(text, "hami_host_gpu") || !strings.Contains(text, `hamireg_monitor_host_up{zone="vGPU"} 0`) {
		t.Errorf("host query failed:\n%s", text)
	}

	// Run's context ended: the scrape's context is done, the host is not asked.
	m = newTestMonitor(t, Options{Host: host})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	m.bindScrapeContext(ctx)
	if text = gatherText(t, m, nil); !strings.Contains(text, `hamireg_monitor_host_up{zone="vGPU"} 0`) {
		t.Errorf("scrape after Run ended:\n%s", text)
	}
}

func TestCollectorRegionStates(t *testing.T) {
	m := newTestMonitor(t, Options{})
	cs := []Container{
		testContainer("a", "c", testRegion(t, uuidA)),
		{Key: "b_c", Err: fmt.Errorf("read: %w", region.ErrNotInitialized)},
		{Key: "c_c", Err: fmt.Errorf("read: %w", region.ErrUnknownLayout)},
		{Key: "d_c", Err: os.ErrPermission},
	}
	text := gatherText(t, m, cs)
	for st, n := range map[string]int{RegionStateOK: 1, RegionStateNotInitialized: 1, RegionStateUnknownLayout: 1, RegionStateError: 1, RegionStateTruncated: 0} {
		if want := fmt.Sprintf(`hamireg_monitor_regions{state=%q,zone="vGPU"} %d`, st, n); !strings.Contains(text, want+"\n") {
			t.Errorf("no %s in\n%s", want, text)
		}
	}
}

// TestCollectorNeverFails: a container read twice (a folder and a claim of one container)
// or a GPU listed twice does not make the scrape fail on a duplicate series, a region with a
// corrupt count is served within its bounds, and a panic in the container source leaves the
// other series.
func TestCollectorNeverFails(t *testing.T) {
	gpu := HostGPU{Index: 0, UUID: uuidA, Name: "A10", MemoryUsed: gib}
	host := &fakeHost{gpus: []HostGPU{gpu, gpu}}
	m := newTestMonitor(t, Options{Host: host, LegacyMetrics: true, Version: annotation.VersionV290})
	r := testRegion(t, uuidA)
	r.ProcNum, r.DeviceCount = -3, 1<<63
	c := testContainer("p", "c", r)
	text := gatherText(t, m, []Container{c, c})
	if n := strings.Count(text, "hami_vgpu_memory_used_bytes{"); n != 1 {
		t.Errorf("%d used series for one container read twice:\n%s", n, text)
	}

	reg := prometheus.NewRegistry()
	if err := m.register(reg, newCollector(m, func(context.Context) []Container { panic("source") })); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "hami_host_gpu_memory_used_bytes"); err != nil || n != 1 {
		t.Fatalf("after a panic in the source: %d host series, %v", n, err)
	}
}

func TestElapsed(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, c := range []struct {
		t    uint64
		want float64
	}{{1, 999}, {999, 1}, {1000, 0}, {2000, 0}, {1 << 63, 0}, {^uint64(0), 0}} {
		if got := elapsed(now, c.t); got != c.want {
			t.Errorf("elapsed(%d) = %g, want %g", c.t, got, c.want)
		}
	}
}

func TestProcessMetrics(t *testing.T) {
	host := &fakeHost{gpus: []HostGPU{
		{Index: 0, UUID: uuidA, Name: "A10", Processes: []Process{{PID: 4001, UsedMemory: 2 * gib}, {PID: 4010, UsedMemory: gib}, {PID: 4002, UsedMemory: gib / 2}}},
		{Index: 1, UUID: uuidB, Name: "A10", Processes: []Process{{PID: 4020, UsedMemory: gib}}}, // no region lists it
	}}
	m := newTestMonitor(t, Options{Host: host, ProcessMetrics: true})
	r := testRegion(t, uuidA)
	addSlot(r, 4001, 1, 0, 1800*(1<<20)) // accounted below the driver
	addSlot(r, 4003, 1, 0, gib)          // the driver lists no 4003: stale
	addSlot(r, 4002, 0, 0, gib)          // exited: names nobody, so 4002 is unaccounted
	addSlot(r, 0, 1, 0, gib)             // host PID not found yet: no process series
	text := gatherText(t, m, []Container{testContainer("p", "main", r)})
	l := `container="main",device_uuid="` + uuidA + `",hostpid="%d",namespace="ns",pod="p",`
	wants := []string{
		fmt.Sprintf(`hamireg_monitor_process_memory_bytes{`+l+`source="hami-core",vdevice_index="0",zone="vGPU"} 1.8874368e+09`, 4001),
		fmt.Sprintf(`hamireg_monitor_process_memory_bytes{`+l+`source="nvml",vdevice_index="0",zone="vGPU"} 2.147483648e+09`, 4001),
		fmt.Sprintf(`hamireg_monitor_process_memory_drift_ratio{`+l+`vdevice_index="0",zone="vGPU"} -0.12109375`, 4001),
		fmt.Sprintf(`hamireg_monitor_process_memory_bytes{`+l+`source="hami-core",vdevice_index="0",zone="vGPU"} 1.073741824e+09`, 4003),
		fmt.Sprintf(`hamireg_monitor_stale_slot_memory_bytes{`+l+`vdevice_index="0",zone="vGPU"} 1.073741824e+09`, 4003),
		`hamireg_monitor_unaccounted_process_memory_bytes{container="",device_index="0",device_uuid="` + uuidA + `",namespace="",pid="4010",pod="",zone="vGPU"} 1.073741824e+09`,
		`hamireg_monitor_unaccounted_process_memory_bytes{container="",device_index="0",device_uuid="` + uuidA + `",namespace="",pid="4002",pod="",zone="vGPU"} 5.36870912e+08`,
	}
	for _, w := range wants {
		if !strings.Contains(text, w+"\n") {
			t.Errorf("no %s", w)
		}
	}
	for _, absent := range []string{`hostpid="0"`, `hostpid="4002"`, `",pid="4020"`, `",pid="4001"`, `hostpid="4003",namespace="ns",pod="p",source="nvml"`} {
		if strings.Contains(text, absent) {
			t.Errorf("unexpected %s", absent)
		}
	}
	if got := strings.Count(text, "\nhamireg_monitor_"); got != len(wants)+len(regionStates)+1 {
		t.Errorf("%d hamireg_monitor_ series, want %d:\n%s", got, len(wants)+len(regionStates)+1, text)
	}

	// The driver's process list failed on the GPU: HAMi-core's side only, nothing stale or
	// unaccounted.
	host.gpus[0].ProcessesErr = errors.New("nvml: ERROR_UNKNOWN")
	text = gatherText(t, m, []Container{testContainer("p", "main", r)})
	if strings.Contains(text, "stale_slot") || strings.Contains(text, "unaccounted") || strings.Contains(text, `source="nvml"`) || !strings.Contains(text, `source="hami-core"`) {
		t.Errorf("process list failed:\n%s", text)
	}

	// Without ProcessMetrics none of the families is served.
	m = newTestMonitor(t, Options{Host: host})
	if text = gatherText(t, m, []Container{testContainer("p", "main", r)}); strings.Contains(text, "process") {
		t.Errorf("process families served without ProcessMetrics:\n%s", text)
	}
}

func TestMIGInfoWithoutNodeLabel(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "mig-0", Namespace: "ns", Annotations: map[string]string{
		"hami.io/vgpu-mig-allocations": `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"` + uuidA + `","profile":"1g.10gb","placement":{"start":0,"size":1},"migUUID":"MIG-1","gpuInstanceID":3,"computeInstanceID":0},` +
			`{"containerIndex":5,"deviceIndex":0,"gpuUUID":"` + uuidA + `","profile":"1g.10gb","placement":{"start":1,"size":1},"migUUID":"MIG-2","gpuInstanceID":4,"computeInstanceID":0}]`}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}}}
	for _, v := range []annotation.Version{annotation.VersionMaster, annotation.VersionV290} {
		m, err := New(PodsFunc(func() ([]*corev1.Pod, error) { return []*corev1.Pod{pod, nil}, nil }), Options{NodeName: "node1", Version: v})
		if err != nil {
			t.Fatal(err)
		}
		text := gatherText(t, m, nil)
		want := `hami_mig_device_info{compute_instance_id="0",container="main",device_uuid="` + uuidA + `",gpu_instance_id="3",mig_uuid="MIG-1",namespace="ns",pod="mig-0",profile="1g.10gb",vdevice_index="0",zone="vGPU"} 1`
		if got := strings.Contains(text, want+"\n"); got != (v == annotation.VersionMaster) {
			t.Errorf("%v: MIG series served %v:\n%s", v, got, text)
		}
		if strings.Contains(text, "MIG-2") {
			t.Errorf("%v: allocation of a container the pod does not have served", v)
		}
	}
}

// BenchmarkScrape is one Gather of a node of 110 containers on 8 GPUs each (two live
// processes per device), the host families and the legacy names: hamireg, every region read
// from its file at the scrape (Containers' positioned reads, what a scrape of the monitor
// does); hamireg-regions-in-memory, the collector alone; hami, the baseline, HAMi v2.10.0's
// way of re-reading every region at each scrape (through mappings made once, summing the
// slots per accessor, const metrics on a registerer wrapped with zone="vGPU").
func BenchmarkScrape(b *testing.B) {
	const containers, gpus = 110, 8
	host := &fakeHost{}
	var uuids []string
	for g := range gpus {
		u := fmt.Sprintf("GPU-%08x-1111-2222-3333-444455556666", g)
		uuids = append(uuids, u)
		host.gpus = append(host.gpus, HostGPU{Index: g, UUID: u, Name: "NVIDIA A10", MemoryUsed: gib, UtilGPU: 50})
	}
	dir := b.TempDir()
	var cs []Container
	for i := range containers {
		r := testRegion(b, uuids...)
		r.LastKernelTime = uint64(testNow.Unix()) - 5
		for g := range gpus {
			addSlot(r, int32(10000+2*i), 1, g, gib)
			addSlot(r, int32(10001+2*i), 1, g, gib/2)
		}
		c := testContainer(fmt.Sprintf("pod-%d", i), "main", r)
		c.Path = filepath.Join(dir, fmt.Sprintf("%d.cache", i))
		if err := region.WriteFile(c.Path, r); err != nil {
			b.Fatal(err)
		}
		cs = append(cs, c)
	}
	for _, mode := range []string{"hamireg", "hamireg-regions-in-memory", "hami"} {
		b.Run(mode, func(b *testing.B) {
			m := newTestMonitor(b, Options{Host: host, LegacyMetrics: true})
			reg := prometheus.NewRegistry()
			source := func(context.Context) []Container { return cs }
			if mode == "hami" {
				// HAMi's way, the baseline: mapped regions, const metrics, a wrapping registerer.
				if err := prometheus.WrapRegistererWith(prometheus.Labels{LabelZone: DefaultZone}, reg).Register(newHAMiScrape(b, cs, host)); err != nil {
					b.Fatal(err)
				}
			}
			if mode == "hamireg" {
				source = func(context.Context) []Container {
					out := make([]Container, len(cs))
					for i, c := range cs {
						c.Region, c.Err = region.ReadFile(c.Path)
						out[i] = c
					}
					return out
				}
			}
			if mode != "hami" {
				if err := m.register(reg, newCollector(m, source)); err != nil {
					b.Fatal(err)
				}
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			start := time.Now()
			for b.Loop() {
				mfs, err := reg.Gather()
				if err != nil || len(mfs) == 0 {
					b.Fatal(err)
				}
			}
			d := time.Since(start)
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(d.Microseconds())/1000/float64(b.N), "scrape-ms")
			b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(b.N)/containers, "heap-B/container")
		})
	}
}

// FuzzCollectRegion: whatever a region holds (UUID bytes, device and slot counts, counters,
// last kernel time, the clock), every family is served without a panic and without a series
// the registry refuses (Gather fails the whole scrape on one bad series), in both versions,
// legacy names and process families on.
func FuzzCollectRegion(f *testing.F) {
	f.Add([]byte(uuidA), uint8(2), uint8(3), int32(1), int32(4001), uint64(gib), uint64(1), int64(1000))
	f.Add([]byte("GPU-\x80\xff"), uint8(16), uint8(0), int32(0), int32(-1), ^uint64(0), ^uint64(0), int64(-5))
	f.Fuzz(func(t *testing.T, uuid []byte, devs, slots uint8, status, hostpid int32, total, lkt uint64, now int64) {
		r := &region.Region{Layout: region.LayoutV1, DeviceCount: uint64(devs), LastKernelTime: lkt}
		for i := range min(int(devs), region.MaxDevices) {
			var d region.Device
			copy(d.RawUUID[:], uuid)
			if i%2 == 1 {
				copy(d.RawUUID[:], uuidB)
			}
			d.MemoryLimit = total
			r.Devices = append(r.Devices, d)
		}
		for k := range int(slots) {
			s := region.Slot{Index: k, HostPID: hostpid + int32(k%3), Status: status}
			for i := range s.Used {
				s.Used[i] = region.Memory{Context: total, Module: uint64(k), Data: total / 3, Total: total}
				s.Util[i].SM = total
			}
			r.Slots = append(r.Slots, s)
		}
		host := &fakeHost{gpus: []HostGPU{{Index: 0, UUID: string(uuid), Name: string(uuid), Processes: []Process{{PID: uint32(hostpid), UsedMemory: total}}},
			{Index: 1, UUID: uuidB, Processes: []Process{{PID: 1, UsedMemory: total}, {PID: 1}}}}}
		c := testContainer("p", "c", r)
		for _, v := range []annotation.Version{annotation.VersionMaster, annotation.VersionV290} {
			m := newTestMonitor(t, Options{Version: v, LegacyMetrics: true, Host: host, ProcessMetrics: true,
				Clock: clocktesting.NewFakeClock(time.Unix(now, 0))})
			reg := prometheus.NewPedanticRegistry()
			col := newCollector(m, func(context.Context) []Container { return []Container{c, c} })
			col.recovered = func(r any) { t.Errorf("%v: Collect panicked: %v", v, r) }
			if err := m.register(reg, col); err != nil {
				t.Fatal(err)
			}
			if _, err := reg.Gather(); err != nil {
				t.Fatalf("%v: %v", v, err)
			}
		}
	})
}
