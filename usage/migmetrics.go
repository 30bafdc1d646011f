package usage

import (
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/mig"
)

// MIGTemplate is one instance kind of a HAMi v2.9.0 MIG geometry: Count instances of the
// profile Name, each with Memory MiB and Core percent (knownMigGeometries' name, memory, core,
// count).
type MIGTemplate struct {
	Name         string
	Memory, Core int32
	Count        int32
}

// MIGGeometries is one entry of HAMi v2.9.0's knownMigGeometries: the GPU models it applies to
// (an entry applies to a GPU whose type contains one of them, the first such entry wins, as
// HAMi v2.9.0 matches) and its allowed geometries, each a whole-GPU layout. A v2.9.0 MIG
// device's "[<template>-<position>]" UUID suffix indexes them: the geometry, then the position
// in the geometry's instances, each MIGTemplate repeated Count times.
type MIGGeometries struct {
	Models     []string
	Geometries [][]MIGTemplate
}

// ChartMIGGeometries returns HAMi v2.9.0's chart default knownMigGeometries, in a new slice.
func ChartMIGGeometries() []MIGGeometries {
	return []MIGGeometries{
		{Models: []string{"A30"}, Geometries: [][]MIGTemplate{
			{{Name: "1g.6gb", Memory: 6144, Core: 25, Count: 4}},
			{{Name: "2g.12gb", Memory: 12288, Core: 50, Count: 2}},
			{{Name: "4g.24gb", Memory: 24576, Core: 100, Count: 1}},
		}},
		{Models: []string{"A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"}, Geometries: [][]MIGTemplate{
			{{Name: "1g.5gb", Memory: 5120, Core: 14, Count: 7}},
			{{Name: "1g.5gb", Memory: 5120, Core: 14, Count: 1}, {Name: "2g.10gb", Memory: 10240, Core: 28, Count: 3}},
			{{Name: "3g.20gb", Memory: 20480, Core: 42, Count: 2}},
			{{Name: "7g.40gb", Memory: 40960, Core: 100, Count: 1}},
		}},
		{Models: []string{"A100-SXM4-80GB", "A100-80GB-PCIe", "A100-PCIE-80GB"}, Geometries: [][]MIGTemplate{
			{{Name: "1g.10gb", Memory: 9728, Core: 14, Count: 7}},
			{{Name: "1g.10gb", Memory: 9728, Core: 14, Count: 1}, {Name: "2g.20gb", Memory: 19968, Core: 28, Count: 3}},
			{{Name: "3g.40gb", Memory: 40192, Core: 42, Count: 2}},
			{{Name: "7g.80gb", Memory: 80896, Core: 98, Count: 1}},
		}},
		{Models: []string{"H100-PCIE-80GB", "H100-SXM5-80GB"}, Geometries: [][]MIGTemplate{
			{{Name: "1g.10gb", Memory: 10240, Core: 14, Count: 7}},
			{{Name: "1g.10gb", Memory: 10240, Core: 14, Count: 1}, {Name: "2g.20gb", Memory: 20480, Core: 28, Count: 3}},
			{{Name: "3g.40gb", Memory: 40960, Core: 42, Count: 2}},
			{{Name: "7g.80gb", Memory: 81920, Core: 100, Count: 1}},
		}},
		{Models: []string{"H100-PCIE-94GB", "H100-SXM5-94GB"}, Geometries: [][]MIGTemplate{
			{{Name: "1g.12gb", Memory: 12288, Core: 14, Count: 7}},
			{{Name: "1g.12gb", Memory: 12288, Core: 14, Count: 1}, {Name: "2g.24gb", Memory: 24576, Core: 28, Count: 3}},
			{{Name: "3g.47gb", Memory: 48128, Core: 42, Count: 2}},
			{{Name: "7g.94gb", Memory: 96256, Core: 100, Count: 1}},
		}},
		{Models: []string{"H20", "H100 on GH200"}, Geometries: [][]MIGTemplate{
			{{Name: "1g.12gb", Memory: 12288, Core: 14, Count: 7}},
			{{Name: "1g.12gb", Memory: 12288, Core: 14, Count: 1}, {Name: "2g.24gb", Memory: 24576, Core: 28, Count: 3}},
			{{Name: "3g.48gb", Memory: 49152, Core: 42, Count: 2}},
			{{Name: "7g.96gb", Memory: 98304, Core: 100, Count: 1}},
		}},
		{Models: []string{"H200 NVL", "H200-SXM5"}, Geometries: [][]MIGTemplate{
			{{Name: "1g.18gb", Memory: 18432, Core: 14, Count: 7}},
			{{Name: "1g.18gb", Memory: 18432, Core: 14, Count: 1}, {Name: "2g.35gb", Memory: 35840, Core: 28, Count: 3}},
			{{Name: "3g.71gb", Memory: 72704, Core: 42, Count: 2}},
			{{Name: "7g.141gb", Memory: 144384, Core: 100, Count: 1}},
		}},
		{Models: []string{"B200"}, Geometries: [][]MIGTemplate{
			{{Name: "1g.23gb", Memory: 23552, Core: 14, Count: 7}},
			{{Name: "1g.23gb", Memory: 23552, Core: 14, Count: 1}, {Name: "2g.45gb", Memory: 46080, Core: 28, Count: 3}},
			{{Name: "3g.90gb", Memory: 92160, Core: 42, Count: 2}},
			{{Name: "7g.180gb", Memory: 184320, Core: 100, Count: 1}},
		}},
	}
}

// maxMIGPositions bounds a v2.9.0 geometry's instances (a GPU has at most 7 or 8 slices): a
// hostile Count cannot make a scrape allocate without bound.
const maxMIGPositions = 64

// geometryFor is the geometries of the first entry whose model the GPU type contains (HAMi
// v2.9.0's match); nil when none.
func geometryFor(entries []MIGGeometries, gpuType string) [][]MIGTemplate {
	for _, e := range entries {
		for _, m := range e.Models {
			if m != "" && strings.Contains(gpuType, m) {
				return e.Geometries
			}
		}
	}
	return nil
}

// expand lists a geometry's instance names by position; false when it has more than
// maxMIGPositions instances.
func expand(geometry []MIGTemplate) ([]string, bool) {
	var out []string
	for _, t := range geometry {
		if t.Count < 0 || len(out)+int(t.Count) > maxMIGPositions {
			return nil, false
		}
		for range t.Count {
			out = append(out, t.Name)
		}
	}
	return out, true
}

// migHolder is what the MIG instance metric reads of one pod.
type migHolder struct {
	key     string
	node    string
	devices allocation.PodDevices
	allocs  []mig.Allocation
}

// migInstanceFamily is hami_node_gpu_mig_instance_info and its legacy nodeGPUMigInstance,
// with the labels of the HAMi version.
func migInstanceFamily(master bool) family {
	const legacyHelp = "GPU Sharing mode. 0 for hami-core, 1 for mig, 2 for mps"
	legacy := []string{"nodeid", "deviceuuid", "deviceidx", "migname"}
	if master {
		return newFamily("hami_node_gpu_mig_instance_info", "Realized MIG instance identity and scheduler placement",
			[]string{"node", "device_uuid", "device_index", "mig_uuid", "profile", "gpu_instance_id", "compute_instance_id", "placement_start", "placement_size"},
			"nodeGPUMigInstance", legacyHelp, legacy)
	}
	return newFamily("hami_node_gpu_mig_instance_info", legacyHelp, []string{"node", "device_uuid", "device_index", "mig_name"},
		"nodeGPUMigInstance", legacyHelp, legacy)
}

// collectMIG sends the MIG instance series of the registered nodes (node → GPU UUID → device),
// from pods sorted by key. Master: one series per reserved instance whose runtime identity is
// recorded, on a registered GPU in MIG mode of the pod's node, value 1. v2.9.0: per registered
// GPU in MIG mode that a pod holds a "[t-p]" device of, one series per position of the
// geometry of the first such device (by pod key, then entry), value 1 when a device holds that
// position, else 0; a device naming a geometry the GPU's model does not have is left out.
func (h *hamiCollector) collectMIG(ch chan<- prometheus.Metric, devices map[string]map[string]annotation.Device, pods []migHolder) {
	emitted := map[string]bool{} // HAMi's identity of a series: one series per label set
	send := func(d *prometheus.Desc, v float64, labels ...string) {
		id := d.String() + "\x00" + strings.Join(labels, "\x00")
		if emitted[id] {
			return
		}
		emitted[id] = true
		gauge(ch, d, v, labels...)
	}
	if h.version == allocation.VersionMaster {
		for _, p := range pods {
			for _, a := range p.allocs {
				d, ok := devices[p.node][a.GPUUUID]
				if !ok || a.Runtime == nil || d.Mode != allocation.ModeMIG {
					continue
				}
				idx := strconv.FormatUint(uint64(d.Index), 10)
				gi := strconv.FormatUint(uint64(a.Runtime.GPUInstanceID), 10)
				send(h.migInstance.cur, 1, p.node, d.ID, idx, a.Runtime.MigUUID, a.Profile, gi,
					strconv.FormatUint(uint64(a.Runtime.ComputeInstanceID), 10),
					strconv.FormatUint(uint64(a.Placement.Start), 10), strconv.FormatUint(uint64(a.Placement.Size), 10))
				if h.legacy {
					send(h.migInstance.legacy, 1, p.node, d.ID, idx, a.Profile+"-"+gi)
				}
			}
		}
		return
	}
	type gpuKey struct{ node, gpu string }
	type gpuUse struct {
		names []string // the geometry's instances by position; nil until a device gives one
		used  []int    // positions held
	}
	uses := map[gpuKey]*gpuUse{}
	var order []gpuKey
	for _, p := range pods {
		for _, c := range p.devices {
			for _, cd := range c {
				gpu, template, position, suffixed, err := mig.ParseLegacyUUID(cd.UUID)
				d, ok := devices[p.node][gpu]
				if err != nil || !suffixed || !ok || d.Mode != allocation.ModeMIG {
					continue
				}
				geometries := geometryFor(h.geometries, d.Type)
				if template >= len(geometries) {
					continue // a geometry the GPU does not have: not a position of it
				}
				k := gpuKey{p.node, gpu}
				u := uses[k]
				if u == nil {
					u = &gpuUse{}
					uses[k] = u
					order = append(order, k)
				}
				if u.names == nil {
					u.names, _ = expand(geometries[template])
				}
				u.used = append(u.used, position)
			}
		}
	}
	for _, k := range order {
		u := uses[k]
		d := devices[k.node][k.gpu]
		idx := strconv.FormatUint(uint64(d.Index), 10)
		for pos, name := range u.names {
			v := 0.0
			if slices.Contains(u.used, pos) {
				v = 1
			}
			migName := name + "-" + strconv.Itoa(pos)
			send(h.migInstance.cur, v, k.node, d.ID, idx, migName)
			if h.legacy {
				send(h.migInstance.legacy, v, k.node, d.ID, idx, migName)
			}
		}
	}
}
