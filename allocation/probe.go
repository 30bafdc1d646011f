package allocation

import (
	"cmp"
	"strconv"
	"strings"

	"github.com/hamireg/hamireg/annotation"
)

// Probe answers [Fit]'s yes or no for one pod request on many nodes, without the devices or
// the reason: for a scheduler that fits a request on every candidate and needs the devices
// only on the node it chooses (call [Fit] there) and the reasons only when no node fits. A
// Probe allocates nothing per node in the common case.
//
// A Probe models a request in which at most one container asks for GPUs, without
// [KeyNUMABind], and with a device policy made of [PolicyBinpack], [PolicySpread] and (HAMi
// master) "mutex" only. For such a request the devices' order does not change the answer, so
// the request fits iff at least Count GPUs pass every check of [Fit]. [NewProbe] refuses
// anything else (several GPU containers, whose choices depend on each other; NUMA binding,
// which depends on the walk; [PolicyTopologyAware] and unknown policies): call [Fit] then. A
// Probe knows nothing of ResourceQuota: a caller that checks quotas with the fit does not use
// one for a pod a quota applies to.
//
// A Probe does not model MIG placement either: it counts a GPU in [ModeMIG] as one that
// does not fit, which is [Fit]'s answer only for v2.9.0 and for a GPU without profiles. Fit a
// node with a MIG GPU with [Fit] ([ProbeNode.MIG] says whether it has one).
//
// A Probe is not safe for concurrent use (it keeps the type checks it made).
type Probe struct {
	f      fitter
	r      Request
	any    bool // some container asks for GPUs
	lists  bool // the pod has UUID lists
	types  bool // the pod has type or mode lists
	seen   []typeSeen
	cores  int32
	memPct bool
}

type typeSeen struct {
	typ, mode string
	ok        bool
}

// NewProbe returns a Probe of req with the pod's annotations pod under c, or false when a
// Probe does not model the request (see [Probe]).
func NewProbe(req PodRequest, pod map[string]string, c Config) (*Probe, bool) {
	c = c.orDefaults()
	if c.Vendor != annotation.VendorNVIDIA {
		return nil, false // the generic fit is not probed
	}
	p := &Probe{}
	for _, r := range req.Containers {
		if r.Count <= 0 {
			continue
		}
		if p.any {
			return nil, false // several GPU containers
		}
		p.any, p.r = true, r
	}
	if bind, _ := strconv.ParseBool(pod[KeyNUMABind]); bind {
		return nil, false
	}
	policy := cmp.Or(Policy(pod[KeyGPUSchedulerPolicy]), c.GPUSchedulerPolicy)
	for part := range strings.SplitSeq(string(policy), ",") {
		switch Policy(part) {
		case PolicyBinpack, PolicySpread, "mutex":
		default:
			return nil, false
		}
	}
	p.f = fitter{pod: pod, c: c, nvidia: true, binpack: hasPolicy(policy, PolicyBinpack)}
	if c.Version == VersionMaster {
		p.f.mutex = hasPolicy(policy, "mutex")
	}
	_, use := pod[KeyUseGPUUUID]
	_, noUse := pod[KeyNoUseGPUUUID]
	p.lists = use || noUse
	_, useType := pod[KeyUseGPUType]
	_, noUseType := pod[KeyNoUseGPUType]
	_, mode := pod[KeyVGPUMode]
	p.types = useType || noUseType || mode
	p.cores = min(p.r.Cores, 100)
	p.memPct = p.r.MemoryPercentage != PercentageUnset && p.r.Memory == 0
	return p, true
}

// ProbeNode is a node as a [Probe] reads it: its GPUs, what pods hold of each, and its node
// score, kept compact so that probing every node of a large cluster reads little memory. Set
// it again whenever the node's devices or usage change; the zero value is a node without GPUs.
type ProbeNode struct {
	devices []annotation.Device
	gpus    []probeGPU
	score   float64
}

// probeGPU is what the checks of a GPU read besides its strings.
type probeGPU struct {
	count, devmem, devcore int32
	health, mig            bool
	used                   Usage
}

// Set makes n the node whose GPUs are devices, in the order of its register annotation,
// where pods hold used[id] of the GPU id (nothing when absent), as [WithUsage] pairs them. It
// keeps devices (not copied) and reuses n's memory.
func (n *ProbeNode) Set(devices []annotation.Device, used map[string]Usage) {
	n.devices, n.gpus = devices, n.gpus[:0]
	var sum Usage
	var slots, cores, mem int64
	for i := range devices {
		d := &devices[i]
		u := used[d.ID]
		n.gpus = append(n.gpus, probeGPU{count: d.Count, devmem: d.Devmem, devcore: d.Devcore, health: d.Health, mig: d.Mode == "mig", used: u})
		sum = sum.Add(u)
		slots, cores, mem = slots+int64(d.Count), cores+int64(d.Devcore), mem+int64(d.Devmem)
	}
	n.score = 10 * (ratio(sum.Used, slots) + ratio(sum.Usedcores, cores) + ratio(sum.Usedmem, mem)) // as NodeScore
}

// MIG reports whether one of the node's GPUs is in [ModeMIG], which a [Probe] does not model.
func (n *ProbeNode) MIG() bool {
	for i := range n.gpus {
		if n.gpus[i].mig {
			return true
		}
	}
	return false
}

// Score is the node's [NodeScore].
func (n *ProbeNode) Score() float64 { return n.score }

// Fits reports whether [Fit] places the request on node n, whose [KeyDeviceCordon]
// annotation is cordon.
func (p *Probe) Fits(n *ProbeNode, cordon string) bool {
	if !p.any {
		return true
	}
	if int(p.r.Count) > len(n.gpus) {
		return false
	}
	var cordonSet map[string]bool
	if p.f.c.Version == VersionMaster && cordon != "" {
		cordonSet = cordoned(cordon)
	}
	strs := p.types || p.lists || cordonSet != nil
	need := p.r.Count
	for i := range n.gpus {
		if !p.passes(&n.gpus[i]) || (strs && !p.passesStrings(&n.devices[i], cordonSet)) {
			continue
		}
		if need--; need == 0 {
			return true
		}
	}
	return false
}

// passes and passesStrings are the device checks of fitter.container for a request without
// NUMA binding (the order of the checks does not change whether a GPU passes them all).
func (p *Probe) passes(g *probeGPU) bool {
	r, u := &p.r, &g.used
	if !g.health || (!p.types && r.Type != annotation.VendorNVIDIA) {
		return false
	}
	if int64(g.count) <= u.Used || (p.f.mutex && u.Used > 0) {
		return false
	}
	mem := r.Memory
	if p.memPct {
		mem = g.devmem * r.MemoryPercentage / 100 // int32 arithmetic, as fitter.container
	}
	cores := p.cores
	switch {
	case int64(g.devmem)-u.Usedmem < int64(mem),
		int64(g.devcore)-u.Usedcores < int64(cores),
		g.devcore == 100 && cores == 100 && u.Used > 0,
		g.devcore != 0 && u.Usedcores == int64(g.devcore) && cores == 0,
		g.mig:
		return false
	}
	return true
}

func (p *Probe) passesStrings(d *annotation.Device, cordon map[string]bool) bool {
	return !cordon[d.ID] && (!p.types || p.typeFits(d)) && (!p.lists || p.f.uuidFits(d.ID))
}

// typeFits is fitter.typeFits, kept per GPU type and mode (a node's GPUs are of few).
func (p *Probe) typeFits(d *annotation.Device) bool {
	for _, s := range p.seen {
		if s.typ == d.Type && s.mode == d.Mode {
			return s.ok
		}
	}
	du := DeviceUsage{Device: *d}
	ok := p.f.typeFits(&du, p.r)
	if len(p.seen) < 16 {
		p.seen = append(p.seen, typeSeen{typ: d.Type, mode: d.Mode, ok: ok})
	}
	return ok
}
