package schedplugin

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/hamireg/hamireg/allocation"
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
// nodeInfo, the nominated pods fitted first) and the quota q (nil: none).
func (p *Plugin) fit(s *cycleState, pod *corev1.Pod, nodeInfo fwk.NodeInfo, q *allocation.Quota) fitOutcome {
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
	u, nominated := p.usageOn(nodeInfo, node.Name, pod.UID, s.vendor, s.seq)
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
			u.add(pd.Usage(), pd.MIGUsage())
		}
	}
	devs := devices()
	pd, reason, ok := allocation.FitWith(devs, s.req, pod.Annotations, node.Annotations, s.cfg, allocation.FitOptions{Quota: q})
	return fitOutcome{devices: pd, score: allocation.NodeScore(devs), reason: reason, ok: ok}
}

// usageOn sums what nodeInfo's pods hold of vendor's GPUs on node, without the pod self: an
// assumed pod's devices come from its reservation, a bound pod's from its annotations
// (memoised), and reservations newer than seq count when their pods are absent from nodeInfo.
// Pods without spec.nodeName (nominated pods added by the framework) are returned apart,
// highest priority first.
func (p *Plugin) usageOn(nodeInfo fwk.NodeInfo, node string, self types.UID, vendor int, seq uint64) (nodeUsage, []*corev1.Pod) {
	var u nodeUsage
	var nominated []*corev1.Pod
	pods := nodeInfo.GetPods()
	present := make(map[types.UID]bool, len(pods))
	for _, pi := range pods {
		pod := pi.GetPod()
		if pod == nil || pod.UID == self {
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
	for _, res := range p.sh.res.newerOn(node, seq, present) {
		if res.vendor == vendor && res.uid != self {
			u.add(res.used, res.mig)
		}
	}
	slices.SortStableFunc(nominated, func(a, b *corev1.Pod) int { return cmp.Compare(priority(b), priority(a)) })
	return u, nominated
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
