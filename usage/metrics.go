package usage

import (
	"cmp"
	"iter"
	"maps"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
)

// MetricsZone is the value of the zone label of HAMi's scheduler families: every family
// carries the const label zone="vGPU" (HAMi wraps its collector with it), except
// hami_build_info.
const MetricsZone = "vGPU"

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

// hamiCollector computes HAMi's scheduler families at scrape time from the registered nodes,
// the tracker and the quota seam.
type hamiCollector struct {
	nodes   Registered
	usage   *Tracker
	vendor  string
	version allocation.Version
	config  allocation.Config
	legacy  bool
	// quotas, when set (tests), gives the quota families' entries instead of the tracker.
	quotas func() []QuotaUsage
	// geometries are HAMi v2.9.0's knownMigGeometries, for its MIG instance names.
	geometries []MIGGeometries

	memLimit, coreLimit, memAlloc, shared, coreAlloc, overview, memRatio, vgpuMem, vgpuCore, quotaUsed, migInstance family
	quotaLimit                                                                                                      *prometheus.Desc
}

var _ prometheus.Collector = (*hamiCollector)(nil)

// MetricsOptions configure [NewHAMiCollector].
type MetricsOptions struct {
	// Vendor is the vendor word of the devices reported. Empty means NVIDIA.
	Vendor string
	// Config gives the HAMi version (its labels) and the quota resource names. The zero value
	// is HAMi's chart.
	Config allocation.Config
	// Legacy also serves HAMi's legacy metric names beside the current ones.
	Legacy bool
	// MIGGeometries are the knownMigGeometries of HAMi v2.9.0's scheduler, which name the MIG
	// instances of hami_node_gpu_mig_instance_info with v2.9.0's labels (a pod's
	// "[<template>-<position>]" devices index them). Nil means [ChartMIGGeometries]; master
	// does not read them.
	MIGGeometries []MIGGeometries
}

// Registered yields each node registered for the vendor with its devices, in the order of its
// register annotation (schedcache's Snapshot.Registered).
type Registered func() iter.Seq2[string, []annotation.Device]

// NewHAMiCollector returns HAMi's scheduler metric families (hami_gpu_*, hami_node_gpu_*,
// hami_vgpu_*, hami_resource_quota_*; byte-exact per HAMi version), computed at scrape time
// from the registered nodes and what t counts on them. The extender and the scheduler plugin
// both register one over their tracker, so both report the same families by the same rules.
//
// hami_node_gpu_mig_instance_info (legacy nodeGPUMigInstance) has each version's labels. HAMi
// master (v2.10.0): {node, device_uuid, device_index, mig_uuid, profile, gpu_instance_id,
// compute_instance_id, placement_start, placement_size} = 1 for every MIG reservation of a pod
// (hami.io/vgpu-mig-allocations) whose runtime identity the node recorded, on a registered
// GPU in MIG mode; legacy migname "<profile>-<gpuInstanceID>". A reservation not realised
// yet has no series. v2.9.0: {node, device_uuid, device_index, mig_name} per position of the
// geometry a registered MIG GPU's pods use ("[<template>-<position>]" devices, geometries from
// MetricsOptions.MIGGeometries), mig_name "<profile>-<position>", 1 when a pod holds the
// position, else 0; when the pods of one GPU name different geometries, the first pod by
// namespace/name decides (HAMi: whichever its map yields first), and a device naming no
// geometry or position is left out (HAMi panics). Without any such series the family is
// absent, HELP and TYPE included.
func NewHAMiCollector(t *Tracker, nodes Registered, opts MetricsOptions) prometheus.Collector {
	cfg, err := opts.Config.WithDefaults()
	if err != nil {
		cfg, _ = allocation.Config{Version: opts.Config.Version}.WithDefaults()
	}
	h := newHAMiCollector(nodes, t, cmp.Or(opts.Vendor, annotation.VendorNVIDIA), cfg, opts.Legacy)
	h.geometries = opts.MIGGeometries
	if h.geometries == nil {
		h.geometries = ChartMIGGeometries()
	}
	return h
}

func newHAMiCollector(nodes Registered, u *Tracker, vendor string, cfg allocation.Config, legacy bool) *hamiCollector {
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
	h := &hamiCollector{nodes: nodes, usage: u, vendor: vendor, version: ver, config: cfg, legacy: legacy,
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
		migInstance: migInstanceFamily(master),
	}
	if master {
		h.quotaLimit = prometheus.NewDesc("hami_resource_quota_limit", "resourcequota limit for a certain device",
			[]string{"namespace", "quota_name"}, prometheus.Labels{"zone": MetricsZone})
	}
	return h
}

func (h *hamiCollector) families() []family {
	return []family{h.memLimit, h.coreLimit, h.memAlloc, h.shared, h.coreAlloc, h.overview, h.memRatio, h.vgpuMem, h.vgpuCore, h.quotaUsed, h.migInstance}
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
// hold per node and GPU, the container series, the quota entries, and the pods' devices and
// MIG reservations, sorted by pod key.
func metricsState(u *Tracker, c allocation.Config) (nodes map[string]map[string]allocation.Usage, series []podSeries, quotas []QuotaUsage, migPods []migHolder) {
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
		if len(pl.MIGAllocations) > 0 || (c.Version != allocation.VersionMaster && len(pl.Devices) > 0) {
			migPods = append(migPods, migHolder{key: key, node: pl.Node, devices: pl.Devices, allocs: pl.MIGAllocations})
		}
	}
	slices.SortFunc(migPods, func(a, b migHolder) int { return strings.Compare(a.key, b.key) })
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
	return nodes, series, quotas, migPods
}

// containerSeries are one pod's container gauges. v2.9.0: one series per container entry and
// device (container_index = the entry's index, init containers first). master: HAMi caches
// the pod collapsed per device, so every device is one series under container_index "0",
// summed over the containers.
func containerSeries(ns, name string, pl *Placement, ver allocation.Version) []podSeries {
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
	nodes, series, quotas, migPods := metricsState(h.usage, h.config)
	registered := map[string]map[string]annotation.Device{} // for the MIG instances
	for node, devices := range h.nodes() {
		if len(migPods) > 0 {
			byID := make(map[string]annotation.Device, len(devices))
			for _, d := range devices {
				byID[d.ID] = d
			}
			registered[node] = byID
		}
		for _, d := range devices {
			use := nodes[node][d.ID]
			idx := strconv.FormatUint(uint64(d.Index), 10)
			usedCores := strconv.FormatInt(use.Usedcores, 10)
			coresLabel := usedCores // v2.9.0: the used cores (a label that changes with every allocation)
			if master {
				coresLabel = strconv.FormatInt(int64(d.Devcore), 10)
			}
			h.emit(ch, h.memLimit, float64(d.Devmem)*mib, node, d.ID, idx, d.Type)
			h.emit(ch, h.coreLimit, float64(d.Devcore), node, d.ID, idx, d.Type)
			h.emit(ch, h.memAlloc, float64(use.Usedmem)*mib, node, d.ID, idx, d.Type, coresLabel)
			h.emit(ch, h.shared, float64(use.Used), node, d.ID, idx, d.Type)
			h.emit(ch, h.coreAlloc, float64(use.Usedcores), node, d.ID, idx, d.Type)
			ov := []string{node, d.ID, idx, coresLabel, strconv.FormatInt(int64(d.Devmem), 10), d.Type}
			if !master {
				ov = append(ov, strconv.FormatInt(use.Used, 10))
			}
			h.emit(ch, h.overview, float64(use.Usedmem)*mib, ov...)
			switch {
			case master && d.Devmem == 0: // master leaves the ratio of a GPU without memory out
			case master:
				ratio := float64(use.Usedmem) / float64(d.Devmem)
				gauge(ch, h.memRatio.cur, ratio, node, d.ID, idx, d.Type)
				if h.legacy {
					gauge(ch, h.memRatio.legacy, ratio, node, d.ID, idx)
				}
			default:
				// v2.9.0 divides as is: NaN for a GPU without memory.
				h.emit(ch, h.memRatio, float64(use.Usedmem)/float64(d.Devmem), node, d.ID, idx)
			}
		}
	}
	h.collectMIG(ch, registered, migPods)
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
