package extender

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	"k8s.io/utils/clock"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/schedcache"
	"github.com/hamireg/hamireg/usage"
)

// HAMi's scheduler metrics: every family carries the const label zone="vGPU" (HAMi wraps its
// collector with it), except hami_build_info.
const (
	// MetricsZone is the value of the zone label of HAMi's families.
	MetricsZone = "vGPU"
	// DefaultMetricsBindAddress is HAMi's --metrics-bind-address.
	DefaultMetricsBindAddress = ":9395"
	// MetricsPrefix starts the name of every operational metric of the SDK's own, which are not
	// HAMi's: hamireg_extender_*.
	MetricsPrefix = "hamireg_"
)

const mib = 1 << 20

// BuildInfo labels hami_build_info (HAMi's versionmetrics collector, value 1).
type BuildInfo struct {
	Version, Revision, BuildDate, GoVersion, Compiler, Platform string
}

// DefaultBuildInfo is the SDK's build as the running binary records it: the version of module
// github.com/hamireg/hamireg (the main module's, or the dependency's), the VCS revision and time
// when the binary was built from a checkout, and the Go toolchain, compiler and platform.
func DefaultBuildInfo() BuildInfo {
	b := BuildInfo{GoVersion: runtime.Version(), Compiler: runtime.Compiler, Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	const module = "github.com/hamireg/hamireg"
	if bi.Main.Path == module {
		b.Version = bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == module {
			b.Version = d.Version
		}
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.time":
			b.BuildDate = s.Value
		}
	}
	return b
}

// QuotaUsage is one entry of HAMi's quota gauges (hami_resource_quota_used,
// hami_resource_quota_limit, QuotaUsed): a namespace's usage of one quota resource.
type QuotaUsage struct {
	// Namespace is the namespace; Resource the quota resource name without "limits."
	// ("nvidia.com/gpumem"), HAMi's quota_name.
	Namespace, Resource string
	// Limit is the ResourceQuota's limit as written (HAMi's limit label, unscaled); 0 when the
	// namespace has none, and then LimitSet is false.
	Limit    int64
	LimitSet bool
	// Used is what the namespace's pods hold (MiB for memory, percent for cores).
	Used int64
}

// family is one of HAMi's metric families: its current name and its --legacy-metrics name.
type family struct{ cur, legacy *prometheus.Desc }

func newFamily(name, help string, labels []string, legacyName, legacyHelp string, legacyLabels []string) family {
	zone := prometheus.Labels{"zone": MetricsZone}
	return family{
		cur:    prometheus.NewDesc(name, help, labels, zone),
		legacy: prometheus.NewDesc(legacyName, legacyHelp, legacyLabels, zone),
	}
}

// hamiCollector computes HAMi's scheduler families at scrape time from the node cache, the
// usage index and the quota seam.
type hamiCollector struct {
	cache   *schedcache.Cache
	usage   *usage.Tracker
	vendor  string
	version allocation.Version
	config  allocation.Config
	legacy  bool
	// quotas, when set (tests), gives the quota families' entries instead of the tracker.
	quotas func() []QuotaUsage

	memLimit, coreLimit, memAlloc, shared, coreAlloc, overview, memRatio, vgpuMem, vgpuCore, quotaUsed family
	quotaLimit                                                                                         *prometheus.Desc
}

var _ prometheus.Collector = (*hamiCollector)(nil)

// HAMiMetricsOptions configure [NewHAMiCollector].
type HAMiMetricsOptions struct {
	// Vendor is the vendor word whose registrations are reported. Empty means NVIDIA.
	Vendor string
	// Config gives the HAMi version (its labels) and the quota resource names. The zero value
	// is HAMi's chart.
	Config allocation.Config
	// Legacy also serves HAMi's legacy metric names beside the current ones.
	Legacy bool
}

// NewHAMiCollector returns HAMi's scheduler metric families (hami_gpu_*, hami_node_gpu_*,
// hami_vgpu_*, hami_resource_quota_*; byte-exact per HAMi version, see the package doc),
// computed at scrape time from the node cache c and the usage tracker t. The extender
// registers one on Options.Registerer; a scheduler plugin registers one with its own tracker,
// so both report the same families from the same rules.
func NewHAMiCollector(c *schedcache.Cache, t *usage.Tracker, opts HAMiMetricsOptions) prometheus.Collector {
	cfg, err := opts.Config.WithDefaults()
	if err != nil {
		cfg, _ = allocation.Config{Version: opts.Config.Version}.WithDefaults()
	}
	return newHAMiCollector(c, t, cmp.Or(opts.Vendor, annotation.VendorNVIDIA), cfg, opts.Legacy)
}

func newHAMiCollector(c *schedcache.Cache, u *usage.Tracker, vendor string, cfg allocation.Config, legacy bool) *hamiCollector {
	ver := cfg.Version
	master := ver == allocation.VersionMaster
	dev := []string{"node", "device_uuid", "device_index", "device_type"}
	legacyDev := []string{"nodeid", "deviceuuid", "deviceidx", "devicetype"}
	overview := []string{"node", "device_uuid", "device_index", "device_cores", "device_memory_limit", "device_type"}
	legacyOverview := []string{"nodeid", "deviceuuid", "deviceidx", "devicecores", "devicememorylimit", "devicetype"}
	if !master {
		overview = append(overview, "shared_containers")
		legacyOverview = append(legacyOverview, "sharedcontainers")
	}
	ratio := []string{"node", "device_uuid", "device_index"}
	if master {
		ratio = append(ratio, "device_type")
	}
	ctr := []string{"namespace", "node", "pod", "container_index", "device_uuid"}
	legacyCtr := []string{"podnamespace", "nodename", "podname", "containeridx", "deviceuuid"}
	h := &hamiCollector{cache: c, usage: u, vendor: vendor, version: ver, config: cfg, legacy: legacy,
		memLimit: newFamily("hami_gpu_memory_limit_bytes", "Device memory limit for a certain GPU", dev,
			"GPUDeviceMemoryLimit", "Device memory limit for a certain GPU", legacyDev),
		coreLimit: newFamily("hami_gpu_core_limit_ratio", "Device core limit for a certain GPU", dev,
			"GPUDeviceCoreLimit", "Device memory core limit for a certain GPU", legacyDev),
		memAlloc: newFamily("hami_gpu_memory_allocated_bytes", "Device memory allocated for a certain GPU", append(slices.Clone(dev), "device_cores"),
			"GPUDeviceMemoryAllocated", "Device memory allocated for a certain GPU", append(slices.Clone(legacyDev), "devicecores")),
		shared: newFamily("hami_gpu_shared_count", "Number of containers sharing this GPU", dev,
			"GPUDeviceSharedNum", "Number of containers sharing this GPU", legacyDev),
		coreAlloc: newFamily("hami_gpu_core_allocated_ratio", "Device core allocated for a certain GPU", dev,
			"GPUDeviceCoreAllocated", "Device core allocated for a certain GPU", legacyDev),
		overview: newFamily("hami_node_gpu_overview", "GPU overview on a certain node", overview,
			"nodeGPUOverview", "GPU overview on a certain node", legacyOverview),
		memRatio: newFamily("hami_node_gpu_memory_allocated_ratio", "GPU Memory Allocated Percentage on a certain GPU", ratio,
			"nodeGPUMemoryPercentage", "GPU Memory Allocated Percentage on a certain GPU", []string{"nodeid", "deviceuuid", "deviceidx"}),
		vgpuMem: newFamily("hami_vgpu_memory_allocated_bytes", "vGPU memory allocated from a container", ctr,
			"vGPUMemoryAllocated", "vGPU memory allocated from a container", legacyCtr),
		vgpuCore: newFamily("hami_vgpu_core_allocated_ratio", "vGPU core allocated from a container", ctr,
			"vGPUCoreAllocated", "vGPU core allocated from a container", legacyCtr),
		quotaUsed: newFamily("hami_resource_quota_used", "resourcequota usage for a certain device", []string{"namespace", "quota_name", "limit"},
			"QuotaUsed", "resourcequota usage for a certain device", []string{"quotanamespace", "quotaName", "limit"}),
	}
	if master {
		h.quotaLimit = prometheus.NewDesc("hami_resource_quota_limit", "resourcequota limit for a certain device",
			[]string{"namespace", "quota_name"}, prometheus.Labels{"zone": MetricsZone})
	}
	return h
}

func (h *hamiCollector) families() []family {
	return []family{h.memLimit, h.coreLimit, h.memAlloc, h.shared, h.coreAlloc, h.overview, h.memRatio, h.vgpuMem, h.vgpuCore, h.quotaUsed}
}

// Describe implements prometheus.Collector.
func (h *hamiCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range h.families() {
		ch <- f.cur
		if h.legacy {
			ch <- f.legacy
		}
	}
	if h.quotaLimit != nil {
		ch <- h.quotaLimit
	}
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	m, err := prometheus.NewConstMetric(d, prometheus.GaugeValue, v, labels...)
	if err != nil {
		m = prometheus.NewInvalidMetric(d, err)
	}
	ch <- m
}

// emit sends a series of f under its current name and, with legacy metrics, its legacy name.
func (h *hamiCollector) emit(ch chan<- prometheus.Metric, f family, v float64, labels ...string) {
	gauge(ch, f.cur, v, labels...)
	if h.legacy {
		gauge(ch, f.legacy, v, labels...)
	}
}

// podSeries is one series of the container gauges.
type podSeries struct {
	namespace, name, node, container, uuid string
	mem, cores                             int64
}

// metricsState is what a scrape reads from the usage tracker, in one lock section: what pods
// hold per node and GPU, the container series, and the quota entries.
func metricsState(u *usage.Tracker, c allocation.Config) (nodes map[string]map[string]allocation.Usage, series []podSeries, quotas []QuotaUsage) {
	view := u.Lock()
	defer view.Unlock()
	nodes = map[string]map[string]allocation.Usage{}
	for name, used := range view.Nodes() {
		nodes[name] = maps.Clone(used)
	}
	for key, pl := range view.Pods() {
		ns, name, ok := strings.Cut(key, "/")
		if !ok {
			ns, name = "", key
		}
		series = append(series, containerSeries(ns, name, pl, c.Version)...)
	}
	memKey, coresKey := allocation.QuotaKeys(c)
	for ns := range view.Namespaces() {
		// HAMi keeps an entry per resource for every namespace whose pods it counted (limit 0
		// when no quota sets one) and for every limit a ResourceQuota sets.
		if ns.Pods > 0 || ns.Limits.Memory.Set {
			quotas = append(quotas, QuotaUsage{Namespace: ns.Name, Resource: strings.TrimPrefix(memKey, "limits."),
				Limit: ns.Limits.Memory.Value, LimitSet: ns.Limits.Memory.Set, Used: ns.Used.Memory})
		}
		if ns.Pods > 0 || ns.Limits.Cores.Set {
			quotas = append(quotas, QuotaUsage{Namespace: ns.Name, Resource: strings.TrimPrefix(coresKey, "limits."),
				Limit: ns.Limits.Cores.Value, LimitSet: ns.Limits.Cores.Set, Used: ns.Used.Cores})
		}
	}
	return nodes, series, quotas
}

// containerSeries are one pod's container gauges. v2.9.0: one series per container entry and
// device (container_index = the entry's index, init containers first). master: HAMi caches
// the pod collapsed per device, so every device is one series under container_index "0",
// summed over the containers.
func containerSeries(ns, name string, pl *usage.Placement, ver allocation.Version) []podSeries {
	var out []podSeries
	add := func(container string, d allocation.ContainerDevice) {
		for i := range out {
			if s := &out[i]; s.container == container && s.uuid == d.UUID {
				s.mem += int64(d.Usedmem)
				s.cores += int64(d.Usedcores)
				return
			}
		}
		out = append(out, podSeries{namespace: ns, name: name, node: pl.Node, container: container, uuid: d.UUID,
			mem: int64(d.Usedmem), cores: int64(d.Usedcores)})
	}
	for i, c := range pl.Devices {
		container := strconv.Itoa(i)
		if ver == allocation.VersionMaster {
			container = "0"
		}
		for _, d := range c {
			add(container, d)
		}
	}
	return out
}

// Collect implements prometheus.Collector.
func (h *hamiCollector) Collect(ch chan<- prometheus.Metric) {
	master := h.version == allocation.VersionMaster
	snap := h.cache.Snapshot()
	nodes, series, quotas := metricsState(h.usage, h.config)
	for info := range snap.All() {
		reg := registration(info, h.vendor)
		if reg == nil || reg.State != schedcache.StateRegistered {
			continue
		}
		for _, d := range reg.Devices {
			use := nodes[info.Name][d.ID]
			idx := strconv.FormatUint(uint64(d.Index), 10)
			usedCores := strconv.FormatInt(use.Usedcores, 10)
			coresLabel := usedCores // v2.9.0: the used cores (a label that changes with every allocation)
			if master {
				coresLabel = strconv.FormatInt(int64(d.Devcore), 10)
			}
			h.emit(ch, h.memLimit, float64(d.Devmem)*mib, info.Name, d.ID, idx, d.Type)
			h.emit(ch, h.coreLimit, float64(d.Devcore), info.Name, d.ID, idx, d.Type)
			h.emit(ch, h.memAlloc, float64(use.Usedmem)*mib, info.Name, d.ID, idx, d.Type, coresLabel)
			h.emit(ch, h.shared, float64(use.Used), info.Name, d.ID, idx, d.Type)
			h.emit(ch, h.coreAlloc, float64(use.Usedcores), info.Name, d.ID, idx, d.Type)
			ov := []string{info.Name, d.ID, idx, coresLabel, strconv.FormatInt(int64(d.Devmem), 10), d.Type}
			if !master {
				ov = append(ov, strconv.FormatInt(use.Used, 10))
			}
			h.emit(ch, h.overview, float64(use.Usedmem)*mib, ov...)
			switch {
			case master && d.Devmem == 0: // master leaves the ratio of a GPU without memory out
			case master:
				ratio := float64(use.Usedmem) / float64(d.Devmem)
				gauge(ch, h.memRatio.cur, ratio, info.Name, d.ID, idx, d.Type)
				if h.legacy {
					gauge(ch, h.memRatio.legacy, ratio, info.Name, d.ID, idx)
				}
			default:
				// v2.9.0 divides as is: NaN for a GPU without memory.
				h.emit(ch, h.memRatio, float64(use.Usedmem)/float64(d.Devmem), info.Name, d.ID, idx)
			}
		}
	}
	for _, s := range series {
		h.emit(ch, h.vgpuMem, float64(s.mem)*mib, s.namespace, s.node, s.name, s.container, s.uuid)
		h.emit(ch, h.vgpuCore, float64(s.cores), s.namespace, s.node, s.name, s.container, s.uuid)
	}
	if h.quotas != nil {
		quotas = h.quotas()
	}
	for _, q := range quotas {
		h.emit(ch, h.quotaUsed, float64(q.Used), q.Namespace, q.Resource, strconv.FormatInt(q.Limit, 10))
		if h.quotaLimit != nil && q.LimitSet {
			gauge(ch, h.quotaLimit, float64(q.Limit), q.Namespace, q.Resource)
		}
	}
}

// NewBuildInfoCollector is HAMi's hami_build_info gauge with b's labels (see [DefaultBuildInfo]); the extender
// registers it beside [NewHAMiCollector]'s families.
func NewBuildInfoCollector(b BuildInfo) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hami_build_info",
		Help: "hami build metadata exposed as labels with a constant value of 1.",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "build_date": b.BuildDate,
			"go_version": b.GoVersion, "compiler": b.Compiler, "platform": b.Platform},
	}, func() float64 { return 1 })
}

// Filter results, the values of the result label of hamireg_extender_filter_duration_seconds.
const (
	filterPlaced        = "placed"
	filterUnschedulable = "unschedulable"
	filterNoGPU         = "no_gpu"
	filterError         = "error"
)

// metrics are the extender's collectors: HAMi's families and its own operational ones. A nil
// *metrics records nothing.
type metrics struct {
	clock          clock.PassiveClock // measures the durations
	hami           *hamiCollector
	filterDuration *prometheus.HistogramVec
	bindDuration   *prometheus.HistogramVec
	filterLockWait prometheus.Histogram
	nodeLockWait   prometheus.Histogram
	decodeFailures prometheus.Counter
}

// newMetrics registers HAMi's families, hami_build_info and the operational metrics with
// reg; a nil reg gives nil.
func newMetrics(reg prometheus.Registerer, e *Extender) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	o := e.opts
	m := &metrics{
		clock: o.Clock,
		hami:  newHAMiCollector(e.cache, e.usage.Tracker, o.Vendor.Name, o.Config, o.LegacyMetrics),
		filterDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "hamireg", Subsystem: "extender", Name: "filter_duration_seconds",
			Help:    "Time a filter call took, by result: placed, unschedulable (no candidate fits), no_gpu (the pod asks for none), error (the pod patch failed).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"result"}),
		bindDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "hamireg", Subsystem: "extender", Name: "bind_duration_seconds",
			Help:    "Time a bind call took, node lock wait included, by result: ok, error.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{"result"}),
		filterLockWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "hamireg", Subsystem: "extender", Name: "filter_lock_wait_seconds",
			Help:    "Time a filter waited for the other filters in flight (decisions are serialised so that two never choose the same capacity).",
			Buckets: prometheus.ExponentialBuckets(0.00001, 4, 10),
		}),
		nodeLockWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "hamireg", Subsystem: "extender", Name: "node_lock_wait_seconds",
			Help:    "Time a bind took to get the node lock (waiting for the binds of other pods to the same node and their Allocate), successful or not.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
		decodeFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "hamireg", Subsystem: "extender", Name: "annotation_decode_failures_total",
			Help: "Pod device annotations (hami.io/vgpu-devices-allocated) that did not decode: the pod's usage is not counted.",
		}),
	}
	for _, r := range []string{filterPlaced, filterUnschedulable, filterNoGPU, filterError} {
		m.filterDuration.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "error"} {
		m.bindDuration.WithLabelValues(r)
	}
	build := o.BuildInfo
	if build == (BuildInfo{}) {
		build = DefaultBuildInfo()
	}
	pods := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "hamireg", Subsystem: "extender", Name: "pods",
		Help: "Pods whose GPUs count against a node (from the informer, or assumed at filter before it caught up).",
	}, func() float64 { return float64(e.Stats().Pods) })
	collectors := []prometheus.Collector{m.hami, NewBuildInfoCollector(build), m.filterDuration, m.bindDuration, m.filterLockWait,
		m.nodeLockWait, m.decodeFailures, pods}
	for i, c := range collectors {
		if err := reg.Register(c); err != nil {
			for _, done := range collectors[:i] {
				reg.Unregister(done)
			}
			if _, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
				return nil, fmt.Errorf("register metrics: %w: %w (one extender per Registerer)", ErrInvalidOptions, err)
			}
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	e.usage.decodeFailed = m.decodeFailures.Inc
	return m, nil
}

// filtered records a filter call for pod that started at start.
func (m *metrics) filtered(start time.Time, pod *corev1.Pod, cfg allocation.Config, res *extenderv1.ExtenderFilterResult) {
	if m == nil {
		return
	}
	result := filterPlaced
	switch {
	case res == nil || res.Error != "":
		result = filterError
	case !allocation.Requests(pod, cfg).Any():
		result = filterNoGPU
	case res.NodeNames == nil && res.Nodes == nil:
		result = filterUnschedulable
	}
	m.filterDuration.WithLabelValues(result).Observe(m.clock.Since(start).Seconds())
}

func (m *metrics) bound(start time.Time, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.bindDuration.WithLabelValues(result).Observe(m.clock.Since(start).Seconds())
}

func (m *metrics) filterLockWaited(start time.Time) {
	if m != nil {
		m.filterLockWait.Observe(m.clock.Since(start).Seconds())
	}
}

func (m *metrics) nodeLockWaited(start time.Time) {
	if m != nil {
		m.nodeLockWait.Observe(m.clock.Since(start).Seconds())
	}
}
