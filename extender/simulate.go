package extender

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/schedcache"
)

// ReasonRegisterUnparsable starts the reason of a request Node of a simulation (see
// [Extender.Filter]) whose register annotation is present but does not decode; the decoding
// error follows after ": ". HAMi says "node unregistered" for it, as for a Node without the
// annotation; the SDK tells the two apart, so that a broken node template is found.
const ReasonRegisterUnparsable = "register annotation does not parse"

// simNode is one request Node of a simulation, decoded on its own.
type simNode struct {
	node    *corev1.Node // the request's object
	devices []annotation.Device
	scores  []map[string]int
	reason  string // why it cannot take the pod before any fit; "" when it registers
	fits    bool
	score   float64
}

// simulate answers a filter whose ExtenderArgs.Nodes carries whole Node objects, as the Cluster
// Autoscaler does for a node it only imagines and as kube-scheduler does with
// nodeCacheCapable: false. Each request Node is fitted from its own annotations alone: its
// register annotation gives the devices and their health, its hami.io/device-cordon and
// topology score annotation apply, the handshake is not looked at, and nothing is held on it
// (HAMi v2.10.0's filterSimulation), unless Options.SimulationLiveUsage and it is a registered
// live node. The namespace's live quota applies. Nothing is written: no pod patch, no Event,
// no usage assumed, no memo kept. The answer is every request Node that fits, deep copies,
// best first by the node policy (HAMi returns one of them), and FailedNodes for the others
// (never nil).
func (e *Extender) simulate(ctx context.Context, pod *corev1.Pod, req allocation.PodRequest, nodes *corev1.NodeList) *extenderv1.ExtenderFilterResult {
	logger := klog.FromContext(ctx)
	res := &extenderv1.ExtenderFilterResult{FailedNodes: extenderv1.FailedNodesMap{}}
	if nodes == nil {
		return res
	}
	cfg := e.opts.Config
	sims := make([]simNode, 0, len(nodes.Items))
	seen := make(map[string]bool, len(nodes.Items))
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if seen[n.Name] {
			continue // one answer per name: the first Node of that name
		}
		seen[n.Name] = true
		sims = append(sims, e.decodeRequestNode(n))
	}
	e.fitSimulated(pod, req, sims)

	var fitting []*simNode
	quotaFailed := false
	for i := range sims {
		s := &sims[i]
		if s.fits {
			fitting = append(fitting, s)
			continue
		}
		res.FailedNodes[s.node.Name] = s.reason
		quotaFailed = quotaFailed || strings.Contains(s.reason, allocation.ReasonResourceQuotaNotFit)
		if v := logger.V(4); v.Enabled() {
			v.Info("Simulated node does not fit the pod", "pod", klog.KObj(pod), "node", s.node.Name, "reason", s.reason)
		}
	}
	if quotaFailed {
		e.explainSimulatedQuota(pod, req, res.FailedNodes)
	}
	binpack := hasPolicy(cmp.Or(allocation.Policy(pod.Annotations[allocation.KeyNodeSchedulerPolicy]), cfg.NodeSchedulerPolicy), allocation.PolicyBinpack)
	slices.SortStableFunc(fitting, func(a, b *simNode) int {
		c := cmp.Compare(a.score, b.score) // spread: the idlest first
		if binpack {
			c = -c // binpack: the busiest first
		}
		return cmp.Or(c, strings.Compare(a.node.Name, b.node.Name))
	})
	if len(fitting) > 0 {
		res.Nodes = &corev1.NodeList{Items: make([]corev1.Node, len(fitting))}
		for i, s := range fitting {
			s.node.DeepCopyInto(&res.Nodes.Items[i])
		}
	}
	logger.V(3).Info("Simulated filter", "pod", klog.KObj(pod), "requestNodes", len(nodes.Items), "fit", len(fitting), "failed", len(res.FailedNodes))
	return res
}

// decodeRequestNode reads one request Node's devices and topology scores from its own
// annotations, as the node cache decodes a live Node: a score annotation that does not decode
// costs the node its scores, not its devices.
func (e *Extender) decodeRequestNode(n *corev1.Node) simNode {
	s := simNode{node: n}
	devicesOnly := e.opts.Vendor
	devicesOnly.ScoreKey = ""
	verdict := annotation.Check(devicesOnly, n.Annotations)
	if !verdict.Registers {
		s.reason = unregisteredRequest(e.opts.Vendor, verdict.Err)
		return s
	}
	s.devices = verdict.Devices
	if key := e.opts.Vendor.ScoreKey; key != "" {
		if raw, ok := n.Annotations[key]; ok {
			if scores, err := annotation.DecodePairScores(raw); err == nil {
				s.scores = annotation.ScoresByDevice(s.devices, scores)
			}
		}
	}
	return s
}

// unregisteredRequest is the reason of a request Node whose register annotation does not
// register: HAMi's "node unregistered" when it is absent or lists no devices, else
// [ReasonRegisterUnparsable] with the decoding error.
func unregisteredRequest(v annotation.Vendor, err error) string {
	switch {
	case errors.Is(err, annotation.ErrAbsent):
		return fmt.Sprintf("%s: the request's Node has no %s annotation", ReasonNodeUnregistered, v.RegisterKey)
	case errors.Is(err, annotation.ErrNoDevices):
		return fmt.Sprintf("%s: the request's Node's %s lists no devices", ReasonNodeUnregistered, v.RegisterKey)
	default:
		return fmt.Sprintf("%s: %v", ReasonRegisterUnparsable, err)
	}
}

// fitSimulated fits the pod on every decoded request Node in one view of the tracker (read
// only): with the namespace's quota, and, with Options.SimulationLiveUsage, on a registered
// live node what the other pods hold there.
func (e *Extender) fitSimulated(pod *corev1.Pod, req allocation.PodRequest, sims []simNode) {
	cfg := e.opts.Config
	key := podKey(pod.Namespace, pod.Name)
	var snap *schedcache.Snapshot
	if e.opts.SimulationLiveUsage {
		snap = e.cache.Snapshot()
	}
	view := e.usage.Lock()
	defer view.Unlock()
	var fo allocation.FitOptions
	if q := view.Quota(pod.Namespace, key); q.Limits.Any(cfg.Version) {
		fo.Quota = &q
	}
	self, _ := view.Pod(key) // what the pod itself holds: it does not count against itself
	for i := range sims {
		s := &sims[i]
		if s.reason != "" {
			continue
		}
		var used map[string]allocation.Usage
		var placements map[string][]mig.Placement
		if snap != nil && e.liveNode(snap, s.node) {
			used, _ = view.Node(s.node.Name)
			placements = view.MIG(s.node.Name)
			if self != nil && self.Node == s.node.Name {
				used, placements = minus(used, self.GPUs), minusMIG(placements, self.MIG)
			}
		}
		devs := allocation.SetPairScores(allocation.SetMIGUsage(allocation.WithUsage(s.devices, used), placements), s.scores)
		_, reason, fits := allocation.FitWith(devs, req, pod.Annotations, s.node.Annotations, cfg, fo)
		s.fits, s.reason = fits, reason
		if fits {
			s.score = allocation.NodeScore(devs)
		}
	}
}

// liveNode reports whether n is a node the cache has registered for the vendor under the same
// name and UID.
func (e *Extender) liveNode(snap *schedcache.Snapshot, n *corev1.Node) bool {
	info, ok := snap.Node(n.Name)
	if !ok || info.UID != n.UID || n.UID == "" {
		return false
	}
	reg := registration(info, e.opts.Vendor.Name)
	return reg != nil && reg.State == schedcache.StateRegistered
}

// explainSimulatedQuota adds to every reason with HAMi's ResourceQuotaNotFit which quota, how
// much is used and by whom, the limit and what the pod asks, as the live filter does, without
// its Event.
func (e *Extender) explainSimulatedQuota(pod *corev1.Pod, req allocation.PodRequest, failed extenderv1.FailedNodesMap) {
	q := e.usage.Quota(pod.Namespace, podKey(pod.Namespace, pod.Name))
	_, pods := e.usage.NamespaceUsage(pod.Namespace)
	delete(pods, podKey(pod.Namespace, pod.Name))
	detail := quotaDetail(pod.Namespace, q, askOf(req, e.opts.Config.Version), pods, e.opts.Config)
	for node, reason := range failed {
		if strings.Contains(reason, allocation.ReasonResourceQuotaNotFit) {
			failed[node] = reason + "; " + detail
		}
	}
}
