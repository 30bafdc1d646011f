package schedplugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/hamireg/hamireg/allocation"
)

// errNoState is a Filter or Score called without PreFilter's state: a framework bug.
var errNoState = errors.New("no HAMiGPU cycle state")

// PreFilter reads what the pod asks. A pod that asks for no configured vendor's devices skips
// the plugin (its Filter, extensions and Score); one that asks for two vendors is
// unschedulable and unresolvable, and so is one whose allocation.KeyDeviceScoringWeights does
// not parse (HAMi v2.10.0's parse error; v2.9.0 ignores the annotation). Otherwise it writes the cycle's state: the request, the node
// cache's snapshot, the namespace's quota read once.
func (p *Plugin) PreFilter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	i, req, two := p.vendorOf(pod)
	if two != "" {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, two)
	}
	if i < 0 {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	if _, err := allocation.PodScoringWeights(pod.Annotations, p.s.vendors[i].cfg.Version); err != nil {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, err.Error()) // HAMi v2.10.0's parse error
	}
	if err := p.sh.waitSynced(ctx); err != nil {
		return nil, fwk.AsStatus(err)
	}
	cfg := p.s.vendors[i].cfg
	s := &cycleState{vendor: i, cfg: cfg, req: req, reqKey: requestKey(i, cfg, req, pod.Annotations), snap: p.sh.cache.Snapshot(), seq: p.sh.res.current(), results: make(map[string]nodeResult, len(nodes)),
		binpack: hasPolicy(cmp.Or(allocation.Policy(pod.Annotations[allocation.KeyNodeSchedulerPolicy]), cfg.NodeSchedulerPolicy), allocation.PolicyBinpack)}
	if q := p.sh.trackers[i].Quota(pod.Namespace, podKeyOf(pod)); q.Limits.Any(cfg.Version) {
		s.quota = &q
	}
	if _, ok := allocation.NewProbe(req, pod.Annotations, cfg); ok {
		annotations := pod.Annotations
		s.probes = &sync.Pool{New: func() any { pr, _ := allocation.NewProbe(req, annotations, cfg); return pr }}
	}
	cs.Write(stateKey, s)
	return nil, nil
}

// PreFilterExtensions implements fwk.PreFilterPlugin: AddPod and RemovePod move the
// namespace's quota for preemption and nominated pods.
func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return p }

// AddPod adds what podInfoToAdd holds (or asks, for a nominated pod) to the cycle's quota
// usage when it is in the pod's namespace; nothing per node (Filter reads the nodeInfo).
func (p *Plugin) AddPod(_ context.Context, cs fwk.CycleState, pod *corev1.Pod, podInfoToAdd fwk.PodInfo, _ fwk.NodeInfo) *fwk.Status {
	if s, other := p.quotaPeer(cs, pod, podInfoToAdd); other != nil {
		s.delta = s.delta.Add(p.quotaOf(s, other))
	}
	return nil
}

// RemovePod subtracts what podInfoToRemove holds from the cycle's quota usage when it is in
// the pod's namespace.
func (p *Plugin) RemovePod(_ context.Context, cs fwk.CycleState, pod *corev1.Pod, podInfoToRemove fwk.PodInfo, _ fwk.NodeInfo) *fwk.Status {
	if s, other := p.quotaPeer(cs, pod, podInfoToRemove); other != nil {
		s.delta = s.delta.Sub(p.quotaOf(s, other))
	}
	return nil
}

// quotaPeer returns the state and the other pod when it counts against the pod's quota.
func (p *Plugin) quotaPeer(cs fwk.CycleState, pod *corev1.Pod, pi fwk.PodInfo) (*cycleState, *corev1.Pod) {
	s := readState(cs)
	if s == nil || s.quota == nil || pi == nil {
		return nil, nil
	}
	other := pi.GetPod()
	if other == nil || other.Namespace != pod.Namespace || other.UID == pod.UID {
		return nil, nil
	}
	return s, other
}

// quotaOf is what other holds against the quota (tracker: informed or reserved), else what it
// asks (a nominated pod not placed yet).
func (p *Plugin) quotaOf(s *cycleState, other *corev1.Pod) allocation.QuotaAmount {
	if pl, ok := p.sh.trackers[s.vendor].Pod(podKeyOf(other)); ok {
		return pl.Quota
	}
	return allocation.AdmissionQuotaAsk(other, s.cfg)
}

// Filter fits the pod on the GPUs of the node it is handed (its pods, not a live usage view:
// preemption's victims removed and nominated pods added count). A failure is Unschedulable
// when removing pods could help, else UnschedulableAndUnresolvable; the message is HAMi's
// reason.
//
// A node that serves the vendor's count resource through DRA (a DeviceClass maps it through
// spec.extendedResourceName, read from the framework's DRA manager, and the node's allocatable
// has none of it: kube-scheduler's extended-resource mapping) is not fitted: a whole-GPU ask
// (allocation.WholeGPUs) passes, for kube-scheduler's DynamicResources plugin to allocate the
// claim it writes, and Reserve and PreBind then do nothing there (no reservation, no lock, no
// annotations); a share is UnschedulableAndUnresolvable with [ReasonDRANode] and the fix.
func (p *Plugin) Filter(_ context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	s := readState(cs)
	if s == nil {
		return fwk.AsStatus(errNoState)
	}
	if class := p.draNode(s.cfg, nodeInfo.Node()); class != nil {
		// kube-scheduler's DynamicResources plugin serves the pod's count here through the
		// claim it writes: a whole-GPU ask passes, a share cannot be expressed by that claim.
		if whole, shared := allocation.WholeGPUs(pod, s.cfg); !whole {
			return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, draReason(class, s.cfg, shared))
		}
		s.setResult(nodeInfo.Node().Name, nodeResult{nodeInfo: nodeInfo}) // score 0
		return nil
	}
	o := p.fit(s, pod, nodeInfo, s.fitQuota(), false)
	if !o.ok {
		if strings.Contains(o.reason, allocation.ReasonResourceQuotaNotFit) {
			p.sh.quotaRej.add(p.h, pod)
		}
		return o.status()
	}
	s.setResult(nodeInfo.Node().Name, nodeResult{score: o.score, nodeInfo: nodeInfo})
	return nil
}

// PreScore skips Score for pods the plugin skipped.
func (p *Plugin) PreScore(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	if readState(cs) == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

// scoreScale turns HAMi's node score (0 to 30) into an integer.
const scoreScale = 1000

// Score is HAMi's node score of the node (usage before the pod) × 1000.
func (p *Plugin) Score(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	s := readState(cs)
	if s == nil {
		return 0, fwk.AsStatus(errNoState)
	}
	r, ok := s.result(nodeInfo.Node().Name)
	if !ok {
		return 0, nil
	}
	return int64(math.Round(r.score * scoreScale)), nil
}

// ScoreExtensions implements fwk.ScorePlugin.
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return p }

// NormalizeScore maps the scores onto [0, 100]: the busiest node highest under the binpack
// node policy (the pod's, else the configuration's), the idlest otherwise; all equal is 100.
func (p *Plugin) NormalizeScore(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	s := readState(cs)
	if s == nil || len(scores) == 0 {
		return nil
	}
	lo, hi := scores[0].Score, scores[0].Score
	for _, n := range scores {
		lo, hi = min(lo, n.Score), max(hi, n.Score)
	}
	for i := range scores {
		switch {
		case hi == lo:
			scores[i].Score = fwk.MaxScore
		case s.binpack:
			scores[i].Score = (scores[i].Score - lo) * fwk.MaxScore / (hi - lo)
		default:
			scores[i].Score = (hi - scores[i].Score) * fwk.MaxScore / (hi - lo)
		}
	}
	return nil
}

// Reserve fits the pod again on nodeName alone (the cycle's snapshot, the node's nominated pods
// of equal or higher priority) and, under one lock of the usage tracker, checks the
// namespace's quota and assumes the devices; the reservation counts for every later Filter.
// No state: not our pod, success.
func (p *Plugin) Reserve(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) *fwk.Status {
	s := readState(cs)
	if s == nil {
		return nil
	}
	if s.reserved != nil { // reserved again on the same state
		p.sh.res.drop(pod.UID, s.reserved)
		s.reserved = nil
	}
	ni := p.reserveNodeInfo(s, pod, nodeName)
	if ni == nil {
		return fwk.AsStatus(fmt.Errorf("reserve %s on %s: node not in the scheduler's snapshot", klog.KObj(pod), nodeName))
	}
	if s.onDRA = p.draNode(s.cfg, ni.Node()) != nil; s.onDRA {
		return nil // the DynamicResources plugin's claim serves the pod there (see Filter)
	}
	t := p.sh.trackers[s.vendor]
	v := t.Lock()
	var q *allocation.Quota
	if qq := v.Quota(pod.Namespace, podKeyOf(pod)); qq.Limits.Any(s.cfg.Version) {
		q = &qq
	}
	o := p.fit(s, pod, ni, q, true)
	if !o.ok {
		v.Unlock()
		if strings.Contains(o.reason, allocation.ReasonResourceQuotaNotFit) {
			p.sh.quotaRej.add(p.h, pod)
		}
		return fwk.NewStatus(fwk.Unschedulable, o.reason)
	}
	undo := v.Assume(pod, nodeName, o.devices)
	v.Unlock()
	res := &reservation{uid: pod.UID, node: nodeName, vendor: s.vendor, devices: o.devices, used: allocation.PodUsage(o.devices, pod, s.cfg), mig: o.devices.MIGUsage(), undo: undo}
	p.sh.res.add(res)
	s.reserved = res
	p.sh.quotaRej.forget(pod)
	klog.FromContext(ctx).V(4).Info("Reserved GPUs", "pod", klog.KObj(pod), "node", nodeName, "devices", allocation.EncodePodDevices(o.devices))
	return nil
}

// reserveNodeInfo is nodeName's NodeInfo from the cycle's snapshot (else the one Filter saw),
// with the node's nominated pods of equal or higher priority added to a copy.
func (p *Plugin) reserveNodeInfo(s *cycleState, pod *corev1.Pod, nodeName string) fwk.NodeInfo {
	var ni fwk.NodeInfo
	if l := p.h.SnapshotSharedLister(); l != nil {
		if n, err := l.NodeInfos().Get(nodeName); err == nil {
			ni = n
		}
	}
	if ni == nil {
		if r, ok := s.result(nodeName); ok {
			ni = r.nodeInfo
		}
	}
	if ni == nil {
		return nil
	}
	var add []fwk.PodInfo
	for _, pi := range p.h.NominatedPodsForNode(nodeName) {
		np := pi.GetPod()
		if np == nil || np.UID == pod.UID || priority(np) < priority(pod) {
			continue
		}
		add = append(add, pi)
	}
	if len(add) == 0 {
		return ni
	}
	in := map[string]bool{}
	for _, pi := range ni.GetPods() {
		in[string(pi.GetPod().UID)] = true
	}
	cp := ni.Snapshot()
	for _, pi := range add {
		if !in[string(pi.GetPod().UID)] {
			cp.AddPodInfo(pi)
		}
	}
	return cp
}

// Unreserve drops the pod's reservation and, when PreBind took the node lock, gives it back
// and marks the bind failed (unless the pod is bound already). Idempotent; no state: nothing.
func (p *Plugin) Unreserve(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) {
	s := readState(cs)
	if s == nil {
		return
	}
	if s.locked {
		s.locked = false
		p.rollback(ctx, pod, nodeName, s.bindTime)
	}
	if s.reserved != nil {
		p.sh.res.drop(pod.UID, s.reserved)
		s.reserved = nil
	}
}

// signKey is the plugin's batching fragment for pods without GPUs.
const signKey = "hami.io/gpu"

// SignPod implements fwk.SignPlugin: a pod without GPUs signs one constant fragment (the
// plugin does not change its results); a GPU pod is refused, since GPU usage is not part of a
// signature.
func (p *Plugin) SignPod(_ context.Context, pod *corev1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	if i, _, two := p.vendorOf(pod); i >= 0 || two != "" {
		return nil, fwk.NewStatus(fwk.Unschedulable, "pods with HAMi devices are not batched")
	}
	return []fwk.SignFragment{{Key: signKey, Value: false}}, nil
}
