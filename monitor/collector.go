package monitor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/hamicore/region"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/usage"
)

// ScrapeTimeout bounds the work of one scrape: the Host's GPUs call and the read of the
// regions. Prometheus's Collect carries no context, so the collector derives its own from the
// context Run was given, with this timeout (a scrape before Run queries no host).
const ScrapeTimeout = 10 * time.Second

// LabelZone is the const label HAMi's monitor puts on every series but hami_build_info.
const LabelZone = "zone"

// The sources of hamireg_monitor_process_memory_bytes.
const (
	// SourceHAMiCore is HAMi-core's own accounting of the process (the slot's used[i].total).
	SourceHAMiCore = "hami-core"
	// SourceNVML is the driver's view of the same host PID (the Host's Process.UsedMemory).
	SourceNVML = "nvml"
)

// The states of hamireg_monitor_regions: a region read ([Container.Region] set) is "ok";
// a region that failed is counted by the class of its error.
const (
	RegionStateOK             = "ok"
	RegionStateNotInitialized = "not_initialized" // region.ErrNotInitialized: magic not written yet
	RegionStateTooSmall       = "too_small"       // region.ErrTooSmall
	RegionStateUnknownLayout  = "unknown_layout"  // region.ErrUnknownLayout
	RegionStateTruncated      = "truncated"       // region.ErrTruncated
	RegionStateInvalid        = "invalid"         // another region.ErrInvalid
	RegionStateError          = "error"           // anything else (I/O)
)

var regionStates = []string{RegionStateOK, RegionStateNotInitialized, RegionStateTooSmall, RegionStateUnknownLayout,
	RegionStateTruncated, RegionStateInvalid, RegionStateError}

// regionState classifies c for hamireg_monitor_regions.
func regionState(c *Container) string {
	switch {
	case c.Region != nil:
		return RegionStateOK
	case errors.Is(c.Err, region.ErrNotInitialized):
		return RegionStateNotInitialized
	case errors.Is(c.Err, region.ErrTooSmall):
		return RegionStateTooSmall
	case errors.Is(c.Err, region.ErrUnknownLayout):
		return RegionStateUnknownLayout
	case errors.Is(c.Err, region.ErrTruncated):
		return RegionStateTruncated
	case errors.Is(c.Err, region.ErrInvalid):
		return RegionStateInvalid
	}
	return RegionStateError
}

// uuidLabelSize is HAMi's cut of the 96-byte UUID field for the device_uuid label
// (DeviceUUID(i)[0:40]).
const uuidLabelSize = 40

// Register registers the monitor's metrics with reg as HAMi's initMetrics does:
// hami_build_info (the SDK's build, from runtime/debug.ReadBuildInfo; see
// usage.DefaultBuildInfo) and the monitor's collector, whose series all carry the const
// label zone="vGPU" (HAMi wraps its registerer with it). An identical hami_build_info
// already registered (by the node agent) is kept. Registering the monitor twice with one
// registry returns an error wrapping prometheus.AlreadyRegisteredError.
//
// Every scrape reads the regions ([Monitor.Containers]) and, when Options.Host is set, the
// host GPUs; see docs/monitor.md for the families per Options.Version.
func (m *Monitor) Register(reg prometheus.Registerer) error {
	c := newCollector(m, m.Containers)
	c.fromFolders = true
	return m.register(reg, c)
}

// register registers hami_build_info and c with reg.
func (m *Monitor) register(reg prometheus.Registerer, c *collector) error {
	if reg == nil {
		return fmt.Errorf("register monitor metrics: %w: the registerer is nil", ErrInvalidOptions)
	}
	build := usage.NewBuildInfoCollector(usage.DefaultBuildInfo())
	ownBuild := true
	if err := reg.Register(build); err != nil {
		if are := (prometheus.AlreadyRegisteredError{}); !errors.As(err, &are) {
			return fmt.Errorf("register hami_build_info: %w", err)
		}
		ownBuild = false
	}
	// The collector's descriptors carry zone="vGPU" themselves: the exposition is what HAMi's
	// wrapping registerer gives, without rewrapping every series of every scrape (a third of
	// the scrape's cost at 110 containers).
	if err := reg.Register(c); err != nil {
		if ownBuild {
			reg.Unregister(build)
		}
		return fmt.Errorf("register monitor collector: %w", err)
	}
	// The SDK's own feedback families carry no zone label: they are not HAMi's.
	if m.opts.FeedbackMetrics {
		if err := reg.Register(m.feedbackCollector()); err != nil {
			reg.Unregister(c)
			if ownBuild {
				reg.Unregister(build)
			}
			return fmt.Errorf("register feedback metrics: %w", err)
		}
	}
	return nil
}

// bindScrapeContext makes ctx (Run's) the parent of every scrape's context: its logger logs
// the scrape's warnings, and a scrape after ctx ended queries nothing.
func (m *Monitor) bindScrapeContext(ctx context.Context) { m.scrapeCtx.p.Store(&ctx) }

// scrapeParent holds the context Run gave ([Monitor.bindScrapeContext]).
type scrapeParent struct {
	p atomic.Pointer[context.Context]
}

// scrapeContext returns the context of one scrape and its cancel; ok is false before Run
// gave one (Register may come first, and Collect carries no context): such a scrape reads
// the regions but queries no host, as one after Run ended.
func (m *Monitor) scrapeContext() (ctx context.Context, cancel context.CancelFunc, ok bool) {
	if p := m.scrapeCtx.p.Load(); p != nil {
		ctx, cancel = context.WithTimeout(*p, ScrapeTimeout)
		return ctx, cancel, true
	}
	return nil, func() {}, false
}

// collector is the monitor's prometheus.Collector: HAMi's families of the Options.Version,
// the legacy ones with Options.LegacyMetrics, the SDK's process families with
// Options.ProcessMetrics, and the SDK's operational families. It holds no state between
// scrapes.
type collector struct {
	m *Monitor
	// containers is the source of the regions: m.Containers, a test's slice otherwise.
	containers func(context.Context) []Container
	// fromFolders is set when containers is m.Containers: the scan's failed loads count too.
	fromFolders bool
	// recovered, when set, is told of a panic Collect recovered (tests fail on it).
	recovered func(any)
	d         descs
}

// descs are the collector's descriptors; nil ones are not served under the options.
type descs struct {
	hostMem, hostUtil, hostMemCtl                                  *prometheus.Desc
	used, limit, devMem, util, context, module, buffer, lastKernel *prometheus.Desc
	mig                                                            *prometheus.Desc

	legacyHostMem, legacyHostUtil, legacyUsed, legacyLimit *prometheus.Desc
	legacyMemDesc, legacyUtil, legacyLastKernel, legacyMig *prometheus.Desc

	regions, hostUp                                       *prometheus.Desc
	processMem, processDrift, unaccounted, staleSlotBytes *prometheus.Desc
}

// The label sets of HAMi's families.
var (
	labelsContainer       = []string{"namespace", "pod", "container", "vdevice_index", "device_uuid"}
	labelsLegacyContainer = []string{"podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid"}
	// v2.9.0's hami_container_device_memory_bytes and the legacy memory description add
	// the breakdown (offset derived: total - context - module - data, wrapping).
	labelsV290DeviceMemory = []string{"namespace", "pod", "container", "vdevice_index", "device_uuid", "context_size", "module_size", "buffer_size", "offset"}
	labelsLegacyMemoryDesc = []string{"podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid", "context", "module", "data", "offset"}
)

func newCollector(m *Monitor, containers func(context.Context) []Container) *collector {
	c := &collector{m: m, containers: containers}
	o := &m.opts
	master := o.Version == annotation.VersionMaster
	d := &c.d
	host := []string{"device_index", "device_uuid", "device_type"}
	legacyHost := []string{"deviceidx", "deviceuuid", "devicetype"}
	if master {
		host = append([]string{"node"}, host...)
		legacyHost = append([]string{"nodeid"}, legacyHost...)
	}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, prometheus.Labels{LabelZone: DefaultZone})
	}
	with := func(base []string, more ...string) []string {
		return append(append([]string(nil), base...), more...)
	}
	if o.Host != nil {
		d.hostMem = desc("hami_host_gpu_memory_used_bytes", "GPU device memory usage in bytes", host...)
		d.hostUtil = desc("hami_host_gpu_utilization_ratio", "GPU core utilization ratio (0-100)", host...)
		if master {
			d.hostMemCtl = desc("hami_host_gpu_memory_controller_utilization_ratio", "GPU memory controller utilization ratio (0-100)",
				"device_index", "device_uuid", "device_type")
		}
		d.hostUp = desc("hamireg_monitor_host_up", "1 when the last scrape's host GPU query answered, 0 when it failed (no host series then).")
	}
	d.used = desc("hami_vgpu_memory_used_bytes", "vGPU device memory usage in bytes", labelsContainer...)
	d.limit = desc("hami_vgpu_memory_limit_bytes", "vGPU device memory limit in bytes", labelsContainer...)
	if master {
		d.devMem = desc("hami_container_device_memory_bytes", "Container device memory usage in bytes", labelsContainer...)
		d.mig = desc("hami_mig_device_info", "MIG runtime identity for a container allocation",
			with(labelsContainer, "mig_uuid", "profile", "gpu_instance_id", "compute_instance_id")...)
	} else {
		d.devMem = desc("hami_container_device_memory_bytes", `Container device memory usage breakdown in bytes (The label "context_size", "module_size", "buffer_size" and "offset" will be deprecated in v2.10.0, use hami_vgpu_memory_context_bytes, hami_vgpu_memory_module_bytes and hami_vgpu_memory_buffer_bytes instead)`,
			labelsV290DeviceMemory...)
	}
	d.util = desc("hami_container_device_utilization_ratio", "Container device SM utilization ratio", labelsContainer...)
	d.context = desc("hami_vgpu_memory_context_bytes", "Container device memory context size in bytes", labelsContainer...)
	d.module = desc("hami_vgpu_memory_module_bytes", "Container device memory module size in bytes", labelsContainer...)
	d.buffer = desc("hami_vgpu_memory_buffer_bytes", "Container device memory buffer size in bytes", labelsContainer...)
	d.lastKernel = desc("hami_container_last_kernel_elapsed_seconds", "Seconds since last kernel execution in container", labelsContainer...)
	if o.LegacyMetrics {
		if o.Host != nil {
			d.legacyHostMem = desc("HostGPUMemoryUsage", "GPU device memory usage", legacyHost...)
			d.legacyHostUtil = desc("HostCoreUtilization", "GPU core utilization", legacyHost...)
		}
		d.legacyUsed = desc("vGPU_device_memory_usage_in_bytes", "vGPU device usage", labelsLegacyContainer...)
		d.legacyLimit = desc("vGPU_device_memory_limit_in_bytes", "vGPU device limit", labelsLegacyContainer...)
		d.legacyMemDesc = desc("Device_memory_desc_of_container", "Container device memory description", labelsLegacyMemoryDesc...)
		d.legacyUtil = desc("Device_utilization_desc_of_container", "Container device utilization description", labelsLegacyContainer...)
		d.legacyLastKernel = desc("Device_last_kernel_of_container", "Container device last kernel description", labelsLegacyContainer...)
		if master {
			d.legacyMig = desc("MigInfo", "Mig device information for container", with(labelsLegacyContainer, "instanceid")...)
		}
	}
	d.regions = desc("hamireg_monitor_regions", "Regions the scrape found, by state: ok (read) or the class of the read error.", "state")
	if o.ProcessMetrics {
		proc := with(labelsContainer, "hostpid")
		d.processMem = desc("hamireg_monitor_process_memory_bytes",
			"A container process's memory on a device by host PID: source hami-core is HAMi-core's accounting (the slot's used total), nvml the driver's.",
			with(proc, "source")...)
		d.processDrift = desc("hamireg_monitor_process_memory_drift_ratio",
			"(hami-core - nvml) / nvml of a container process's memory on a device; not served when the driver reports 0.", proc...)
		d.unaccounted = desc("hamireg_monitor_unaccounted_process_memory_bytes",
			"Memory of a driver process on a shared GPU (one a region lists) that no live slot of any region names by host PID: HAMi-core does not account it (pod labels empty: the monitor cannot tell whose).",
			"device_index", "device_uuid", "pid", "namespace", "pod", "container")
		d.staleSlotBytes = desc("hamireg_monitor_stale_slot_memory_bytes",
			"Memory HAMi-core accounts to a live slot whose host PID the driver no longer lists on that GPU.", proc...)
	}
	return c
}

// Describe sends the descriptors of the families the options serve.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	d := &c.d
	for _, x := range []*prometheus.Desc{d.hostMem, d.hostUtil, d.hostMemCtl, d.used, d.limit, d.devMem, d.util, d.context,
		d.module, d.buffer, d.lastKernel, d.mig, d.legacyHostMem, d.legacyHostUtil, d.legacyUsed, d.legacyLimit,
		d.legacyMemDesc, d.legacyUtil, d.legacyLastKernel, d.legacyMig, d.regions, d.hostUp, d.processMem,
		d.processDrift, d.unaccounted, d.staleSlotBytes} {
		if x != nil {
			ch <- x
		}
	}
}

// scrape is the state of one Collect.
type scrape struct {
	c   *collector
	ch  chan<- prometheus.Metric
	log logr.Logger
	// devices holds the (namespace, pod, container, device index) already served and seen
	// the series keys of the process families, so that a container read twice (a folder and
	// a claim of one container) never makes Gather fail on a duplicate series.
	devices map[deviceKey]struct{}
	seen    map[*prometheus.Desc]map[string]struct{}
}

// Collect reads the host GPUs and the regions and sends the series. It never panics: a
// panic in it would kill the process (the registry collects in its own goroutine); one is
// recovered and logged, the series sent before it stay.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel, bound := c.m.scrapeContext()
	defer cancel()
	log := logr.Discard()
	if bound {
		log = klog.FromContext(ctx).WithName("monitor")
	}
	s := &scrape{c: c, ch: ch, log: log, devices: map[deviceKey]struct{}{},
		seen: map[*prometheus.Desc]map[string]struct{}{}}
	defer func() {
		if r := recover(); r != nil {
			s.log.Error(fmt.Errorf("%v", r), "Monitor collector panicked; the scrape is partial")
			if c.recovered != nil {
				c.recovered(r)
			}
		}
	}()
	var (
		gpus    []HostGPU
		hostErr error
	)
	if h := c.m.opts.Host; h != nil && bound {
		gpus, hostErr = h.GPUs(ctx)
		if hostErr != nil {
			s.log.Error(hostErr, "Cannot read the host GPUs; no host series this scrape")
			s.send(c.d.hostUp, 0)
		} else {
			s.send(c.d.hostUp, 1)
			s.host(gpus)
		}
	}
	cs := c.containers(ctx)
	states := make(map[string]int, len(regionStates))
	for i := range cs {
		states[regionState(&cs[i])]++
	}
	if c.fromFolders {
		// The regions the last scan could not load are not adopted (no series), but counted.
		for _, err := range c.m.failedLoads() {
			states[regionState(&Container{Err: err})]++
		}
	}
	for _, st := range regionStates {
		s.send(c.d.regions, float64(states[st]), st)
	}
	now := c.m.opts.Clock.Now()
	for i := range cs {
		if cs[i].Region != nil {
			s.container(&cs[i], now)
		}
	}
	if c.d.mig != nil {
		s.mig()
	}
	if c.d.processMem != nil && hostErr == nil {
		s.processes(cs, gpus)
	}
}

// deviceKey names one device of one container in the series.
type deviceKey struct {
	ns, pod, ctr string
	index        int
}

// first reports whether k is served for the first time this scrape.
func (s *scrape) first(k deviceKey) bool {
	if _, dup := s.devices[k]; dup {
		return false
	}
	s.devices[k] = struct{}{}
	return true
}

// send sends one series of desc unless desc is nil (not served); a label value the registry
// refuses (not UTF-8) is logged and skipped.
func (s *scrape) send(desc *prometheus.Desc, v float64, labels ...string) {
	if desc == nil {
		return
	}
	m, err := prometheus.NewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	if err != nil {
		s.log.V(2).Info("Series skipped", "desc", desc.String(), "err", err)
		return
	}
	s.ch <- m
}

// sendOnce is send unless the same series of desc was sent already this scrape.
func (s *scrape) sendOnce(desc *prometheus.Desc, v float64, labels ...string) {
	if desc == nil {
		return
	}
	key := ""
	for _, l := range labels {
		key += l + "\xff"
	}
	seen := s.seen[desc]
	if seen == nil {
		seen = map[string]struct{}{}
		s.seen[desc] = seen
	}
	if _, dup := seen[key]; dup {
		return
	}
	seen[key] = struct{}{}
	s.send(desc, v, labels...)
}

// host sends the host families by HAMi's rules: a memory query the driver does not support
// (ErrNotSupported) drops only the memory series, another memory error every series of the
// GPU; a utilisation error drops the utilisation series (and v2.10.0's memory-controller one).
func (s *scrape) host(gpus []HostGPU) {
	// sendOnce: a Host listing one GPU twice must not fail the whole scrape.
	d := &s.c.d
	node := s.c.m.opts.NodeName
	master := d.hostMemCtl != nil
	for i := range gpus {
		g := &gpus[i]
		idx := strconv.Itoa(g.Index)
		typ := "NVIDIA-" + g.Name
		labels := []string{idx, g.UUID, typ}
		if master {
			labels = []string{node, idx, g.UUID, typ}
		}
		switch {
		case g.MemoryErr == nil:
			s.sendOnce(d.hostMem, float64(g.MemoryUsed), labels...)
			s.sendOnce(d.legacyHostMem, float64(g.MemoryUsed), labels...)
		case errors.Is(g.MemoryErr, ErrNotSupported):
		default:
			s.log.V(2).Info("Host GPU skipped", "index", g.Index, "uuid", g.UUID, "err", g.MemoryErr)
			continue
		}
		if g.UtilErr != nil {
			continue
		}
		s.sendOnce(d.hostUtil, float64(g.UtilGPU), labels...)
		s.sendOnce(d.legacyHostUtil, float64(g.UtilGPU), labels...)
		s.sendOnce(d.hostMemCtl, float64(g.UtilMemory), idx, g.UUID, typ)
	}
}

// uuidLabel returns HAMi's device_uuid of d: the first 40 bytes of the UUID field as written
// (a shorter UUID keeps its NUL padding, as HAMi's cut does), and false when HAMi-core has
// not written it (the SDK never serves 40 NUL bytes) or the cut is not UTF-8.
func uuidLabel(d *region.Device) (string, bool) {
	if !d.ValidUUID() {
		return "", false
	}
	u := string(d.RawUUID[:uuidLabelSize])
	return u, utf8.ValidString(u)
}

// container sends the per-device families of one region: every device with a written UUID,
// sums over the live slots.
func (s *scrape) container(c *Container, now time.Time) {
	d := &s.c.d
	r := c.Region
	master := d.mig != nil
	for i := range r.Devices {
		dev := &r.Devices[i]
		uuid, ok := uuidLabel(dev)
		if !ok || !s.first(deviceKey{c.Pod.Namespace, c.Pod.Name, c.Name, i}) {
			continue
		}
		l := []string{c.Pod.Namespace, c.Pod.Name, c.Name, strconv.Itoa(i), uuid}
		labels, ok := labelPairs(labelsContainer, l)
		if !ok {
			s.log.V(2).Info("Container series skipped: a label is not UTF-8", "container", c.Key, "device", i)
			continue
		}
		mem, sm := r.Usage(i)
		offset := mem.Total - mem.Context - mem.Module - mem.Data // HAMi's derived offset, wrapping
		breakdown := []string{u64(mem.Context), u64(mem.Module), u64(mem.Data), u64(offset)}
		s.sendShared(d.used, labels, float64(mem.Total))
		s.sendShared(d.limit, labels, float64(dev.MemoryLimit))
		if master {
			s.sendShared(d.devMem, labels, float64(mem.Total))
		} else {
			p, _ := labelPairs(labelsV290DeviceMemory, append(l[:5:5], breakdown...))
			s.sendShared(d.devMem, p, float64(mem.Total))
		}
		s.sendShared(d.util, labels, float64(sm))
		s.sendShared(d.context, labels, float64(mem.Context))
		s.sendShared(d.module, labels, float64(mem.Module))
		s.sendShared(d.buffer, labels, float64(mem.Data))
		var legacy []*dto.LabelPair
		if d.legacyUsed != nil {
			legacy, _ = labelPairs(labelsLegacyContainer, l)
			p, _ := labelPairs(labelsLegacyMemoryDesc, append(l[:5:5], breakdown...))
			s.sendShared(d.legacyUsed, legacy, float64(mem.Total))
			s.sendShared(d.legacyLimit, legacy, float64(dev.MemoryLimit))
			s.sendShared(d.legacyMemDesc, p, float64(mem.Total))
			s.sendShared(d.legacyUtil, legacy, float64(sm))
		}
		if r.LastKernelTime > 0 {
			e := elapsed(now, r.LastKernelTime)
			s.sendShared(d.lastKernel, labels, e)
			s.sendShared(d.legacyLastKernel, legacy, e)
		}
	}
}

// sample is a gauge sample whose label pairs (sorted by name, zone included) are shared by
// the families of one container device: a scrape of 110 containers on 8 GPUs sends 11 000
// series, and a const metric allocates every label pair of every one of them.
type sample struct {
	desc   *prometheus.Desc
	labels []*dto.LabelPair
	value  float64
}

func (m *sample) Desc() *prometheus.Desc { return m.desc }

func (m *sample) Write(out *dto.Metric) error {
	out.Label = m.labels
	out.Gauge = &dto.Gauge{Value: &m.value}
	return nil
}

// sendShared sends one sample of desc with labels unless desc is nil (not served).
func (s *scrape) sendShared(desc *prometheus.Desc, labels []*dto.LabelPair, v float64) {
	if desc != nil {
		s.ch <- &sample{desc: desc, labels: labels, value: v}
	}
}

// labelPairs returns the label pairs of names and values (in the descriptor's order) and
// zone="vGPU", sorted by name as the exposition writes them; false when a value is not
// UTF-8 (the registry would refuse the series).
func labelPairs(names, values []string) ([]*dto.LabelPair, bool) {
	out := make([]*dto.LabelPair, 0, len(names)+1)
	for i := range names {
		if !utf8.ValidString(values[i]) {
			return nil, false
		}
		out = append(out, &dto.LabelPair{Name: &names[i], Value: &values[i]})
	}
	out = append(out, zonePair)
	slices.SortFunc(out, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out, true
}

// zonePair is zone="vGPU", shared by every sample (never written to).
var zonePair = &dto.LabelPair{Name: proto.String(LabelZone), Value: proto.String(DefaultZone)}

func u64(v uint64) string { return strconv.FormatUint(v, 10) }

// elapsed is max(now - t, 0) in seconds, t in unix seconds (a t beyond any time.Time is in
// the future: 0).
func elapsed(now time.Time, t uint64) float64 {
	n := now.Unix()
	if n <= 0 || t >= uint64(n) {
		return 0
	}
	return now.Sub(time.Unix(int64(t), 0)).Seconds()
}

// mig sends hami_mig_device_info (v2.10.0) for every realised MIG allocation of the node's
// pods: HAMi's labels, container = the containerIndex-th of init containers then containers,
// vdevice_index = deviceIndex. Unlike HAMi, a pod without the hami.io/vgpu-node label counts.
func (s *scrape) mig() {
	pods, err := s.c.m.pods.NodePods()
	if err != nil {
		s.log.V(2).Info("No MIG series: pods not listed", "err", err)
		return
	}
	d := &s.c.d
	for _, pod := range pods {
		if pod == nil || pod.Annotations[mig.KeyAllocations] == "" {
			continue
		}
		allocs, err := mig.DecodeAllocations(pod.Annotations[mig.KeyAllocations])
		if err != nil {
			s.log.V(2).Info("MIG allocations not decoded", "pod", klog.KObj(pod), "err", err)
			continue
		}
		ninit := len(pod.Spec.InitContainers)
		for _, a := range allocs {
			if a.Runtime == nil || a.ContainerIndex >= ninit+len(pod.Spec.Containers) {
				continue
			}
			name := ""
			if a.ContainerIndex < ninit {
				name = pod.Spec.InitContainers[a.ContainerIndex].Name
			} else {
				name = pod.Spec.Containers[a.ContainerIndex-ninit].Name
			}
			l := []string{pod.Namespace, pod.Name, name, strconv.Itoa(a.DeviceIndex), a.GPUUUID}
			if !s.first(deviceKey{"mig\xff" + pod.Namespace, pod.Name, name, a.DeviceIndex}) {
				continue // two pods of one name (a deleted one and its successor)
			}
			gi := strconv.FormatUint(uint64(a.Runtime.GPUInstanceID), 10)
			s.send(d.mig, 1, append(l[:5:5], a.Runtime.MigUUID, a.Profile, gi, strconv.FormatUint(uint64(a.Runtime.ComputeInstanceID), 10))...)
			s.send(d.legacyMig, 1, append(l[:5:5], gi)...)
		}
	}
}
