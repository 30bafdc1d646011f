package schedplugin

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/schedcache"
)

// fitOutcome is one node's fit of the cycle's pod.
type fitOutcome struct {
	devices allocation.PodDevices
	score   float64 // HAMi's node score before the pod
	reason  string
	ok      bool
}

// status is the Filter status of a failed fit.
func (o fitOutcome) status() *fwk.Status {
	if allocation.Unresolvable(o.reason) {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, o.reason)
	}
	return fwk.NewStatus(fwk.Unschedulable, o.reason)
}

// registrationOf is info's registration of the vendor named name, without copying it.
func registrationOf(info *schedcache.NodeInfo, name string) *schedcache.Registration {
	for i := range info.Registrations {
		if info.Registrations[i].Vendor == name {
			return &info.Registrations[i]
		}
	}
	return nil
}

// unregisteredReason explains a node the pod cannot use for want of a registration; it starts
// with HAMi's "node unregistered".
func unregisteredReason(info *schedcache.NodeInfo, known bool, vendor string) string {
	if !known {
		return allocation.ReasonNodeUnregistered + ": not known to the node cache (no Node object, or outside its informer)"
	}
	reg := registrationOf(info, vendor)
	if reg == nil {
		return allocation.ReasonNodeUnregistered + ": vendor not tracked by the node cache"
	}
	return fmt.Sprintf("%s: %s %s: %s", allocation.ReasonNodeUnregistered, reg.Vendor, reg.State, reg.Reason)
}

// fit fits pod on nodeInfo's GPUs of the cycle's vendor, with what the node's pods hold
// (design B: the pods of nodeInfo, the reservation map, the newer reservations absent from
// nodeInfo, the nominated pods fitted first) and the quota q (nil: none). Without needDevices
// (Filter) a request an allocation.Probe models is only probed on a node whose usage is
// memoised: a yes carries the node score and no devices (Reserve fits the chosen node again),
// a no is explained by Fit.
func (p *Plugin) fit(s *cycleState, pod *corev1.Pod, nodeInfo fwk.NodeInfo, q *allocation.Quota, needDevices bool) fitOutcome {
	node := nodeInfo.Node()
	if node == nil {
		return fitOutcome{reason: allocation.ReasonNodeUnregistered + ": node not found"}
	}
	vendor := p.s.vendors[s.vendor].vendor.Name
	info, known := s.snap.Node(node.Name)
	var reg *schedcache.Registration
	if known {
		reg = registrationOf(info, vendor)
	}
	if reg == nil || reg.State != schedcache.StateRegistered {
		return fitOutcome{reason: unregisteredReason(info, known, vendor)}
	}
	ukey := usageKey{gen: nodeInfo.GetGeneration(), info: info, res: p.sh.res.nodeVersion(node.Name), foreign: p.sh.foreign.version(node.Name), vendor: s.vendor}
	key := memoKey{usage: ukey, req: s.reqKey}
	selfIn := holds(nodeInfo, pod.UID)
	memoable := q == nil
	if memoable && !selfIn {
		if m, ok := p.sh.memo.Load(node.Name); ok {
			if m := m.(*fitMemo); m.key == key && s.seq >= m.seq {
				return m.out
			}
		}
	}
	var (
		u                   nodeUsage
		nominated           []*corev1.Pod
		self, newer, stored bool
		probeNode           *allocation.ProbeNode
	)
	if m, ok := p.sh.usage.Load(node.Name); ok && !selfIn {
		if m := m.(*usageMemo); m.key == ukey && s.seq >= m.seq {
			u, probeNode, stored = m.u, &m.probe, true
		}
	}
	if !stored {
		u, nominated, self, newer = p.usageOn(nodeInfo, node.Name, pod.UID, s.vendor, s.seq)
		if len(nominated) == 0 && !self && !newer {
			// Kept read-only from here: the nominated pods' fits below add to u only when
			// there are nominated pods, and then nothing is stored.
			m := &usageMemo{key: ukey, seq: s.seq, u: u}
			m.probe.Set(reg.Devices, u.used)
			p.sh.usage.Store(node.Name, m)
			probeNode = &m.probe
		}
	}
	if !needDevices && memoable && s.probes != nil && probeNode != nil && !probeNode.MIG() {
		pr := s.probes.Get().(*allocation.Probe)
		fits := pr.Fits(probeNode, node.Annotations[allocation.KeyDeviceCordon])
		s.probes.Put(pr)
		if fits {
			return fitOutcome{score: probeNode.Score(), ok: true}
		}
	}
	devices := func() []allocation.DeviceUsage {
		return allocation.SetPairScores(allocation.SetMIGUsage(allocation.WithUsage(reg.Devices, u.used), u.mig), reg.PairScores)
	}
	for _, np := range nominated {
		i, req, _ := p.vendorOf(np)
		if i != s.vendor {
			continue
		}
		pd, _, ok := allocation.Fit(devices(), req, np.Annotations, node.Annotations, p.s.vendors[i].cfg)
		if ok {
			u.add(allocation.PodUsage(pd, np, p.s.vendors[i].cfg), pd.MIGUsage())
		}
	}
	devs := devices()
	pd, reason, ok := allocation.FitWith(devs, s.req, pod.Annotations, node.Annotations, s.cfg, allocation.FitOptions{Quota: q})
	out := fitOutcome{devices: pd, score: allocation.NodeScore(devs), reason: reason, ok: ok}
	if memoable && len(nominated) == 0 && !self && !newer && !selfIn {
		p.sh.memo.Store(node.Name, &fitMemo{key: key, seq: s.seq, out: out})
	}
	return out
}

// usageKey is what a node's usage depends on: the NodeInfo's generation (its pods and Node),
// the node cache's registration, the node's reservations and foreign pods, and the vendor.
type usageKey struct {
	gen     int64
	info    *schedcache.NodeInfo
	res     uint64
	foreign uint64
	vendor  int
}

// usageMemo is a node's usage without nominated pods, the pod itself or newer reservations
// (valid for a cycle that began no earlier: seq), and the same as an allocation.ProbeNode.
// Read-only once stored.
type usageMemo struct {
	key   usageKey
	seq   uint64
	u     nodeUsage
	probe allocation.ProbeNode
}

// memoKey is what a node's fit depends on: the NodeInfo's generation (its pods and Node), the
// node cache's registration, the node's reservations and foreign pods, and the request.
type memoKey struct {
	usage usageKey
	req   string
}

// fitMemo is a node's last fit without quota, nominated pods, the pod itself or newer
// reservations: valid for a cycle that began no earlier (seq).
type fitMemo struct {
	key memoKey
	seq uint64
	out fitOutcome
}

// holds reports whether nodeInfo holds the pod uid.
func holds(nodeInfo fwk.NodeInfo, uid types.UID) bool {
	for _, pi := range nodeInfo.GetPods() {
		if pi.GetPod().UID == uid {
			return true
		}
	}
	return false
}

// requestKey identifies what a fit depends on besides the node: the vendor, the profile's
// configuration, the request and the pod's annotations other than those the scheduler and
// the device plugin write.
func requestKey(vendor int, cfg allocation.Config, req allocation.PodRequest, annotations map[string]string) string {
	b := make([]byte, 0, 256+32*len(annotations))
	b = fmt.Appendf(b, "%d|%+v|%d", vendor, cfg, req.Init) // profiles may differ in policies and defaults
	for _, r := range req.Containers {
		b = fmt.Appendf(b, "|%d,%s,%d,%d,%d,%t", r.Count, r.Type, r.Memory, r.MemoryPercentage, r.Cores, r.Sidecar)
	}
	for _, k := range slices.Sorted(maps.Keys(annotations)) {
		if slices.Contains(writtenKeys, k) || strings.HasSuffix(k, "-devices-allocated") || strings.HasSuffix(k, "-devices-to-allocate") {
			continue
		}
		b = strconv.AppendQuote(append(b, '|'), k)
		b = strconv.AppendQuote(append(b, '='), annotations[k])
	}
	return string(b)
}

// writtenKeys are pod annotations the scheduler and the device plugin write; the fit does not
// read them.
var writtenKeys = []string{allocation.KeyNode, allocation.KeyTime, allocation.KeyBindPhase, allocation.KeyBindTime, mig.KeyAllocations}

// usageOn sums what nodeInfo's pods hold of vendor's GPUs on node, without the pod self: an
// assumed pod's devices come from its reservation, a bound pod's from its annotations
// (memoised), and reservations newer than seq count when their pods are absent from nodeInfo,
// as do the pods placed on the node but not bound (foreignPods) that nodeInfo lacks.
// Pods without spec.nodeName (nominated pods added by the framework) are returned apart,
// highest priority first.
func (p *Plugin) usageOn(nodeInfo fwk.NodeInfo, node string, self types.UID, vendor int, seq uint64) (u nodeUsage, nominated []*corev1.Pod, selfIn, newer bool) {
	pods := nodeInfo.GetPods()
	present := make(map[types.UID]bool, len(pods))
	for _, pi := range pods {
		pod := pi.GetPod()
		if pod == nil {
			continue
		}
		if pod.UID == self {
			selfIn = true
			continue
		}
		present[pod.UID] = true
		if pod.Spec.NodeName == "" {
			nominated = append(nominated, pod)
			continue
		}
		if res, ok := p.sh.res.get(pod.UID); ok && res.node == node && res.vendor == vendor {
			u.add(res.used, res.mig)
			continue
		}
		if pl, ok := p.sh.placement(pod, vendor); ok && pl.Node == node {
			u.add(pl.GPUs, pl.MIG)
		}
	}
	foreign, _ := p.sh.foreign.on(node)
	for _, pod := range foreign {
		if present[pod.UID] || pod.UID == self {
			continue
		}
		if _, ours := p.sh.res.get(pod.UID); ours {
			continue // placed by this scheduler: its reservation or its NodeInfo counts it
		}
		if pl, ok := p.sh.placement(pod, vendor); ok && pl.Node == node {
			u.add(pl.GPUs, pl.MIG)
		}
	}
	for _, res := range p.sh.res.newerOn(node, seq, present) {
		newer = true
		if res.vendor == vendor && res.uid != self {
			u.add(res.used, res.mig)
		}
	}
	slices.SortStableFunc(nominated, func(a, b *corev1.Pod) int { return cmp.Compare(priority(b), priority(a)) })
	return u, nominated, selfIn, newer
}

func priority(pod *corev1.Pod) int32 {
	if pod.Spec.Priority != nil {
		return *pod.Spec.Priority
	}
	return 0
}

// hasPolicy reports whether the comma list p holds want.
func hasPolicy(p, want allocation.Policy) bool {
	return slices.Contains(strings.Split(string(p), ","), string(want))
}
