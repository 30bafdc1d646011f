package extender

import (
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/schedcache"
	"github.com/hamireg/hamireg/usage"
)

// probeCache is what an allocation.Probe reads of a node, for the node cache view and the
// usage version it was set at: a filter sets it again only on the nodes whose usage or
// registration changed since the last filter. It also keeps the last answer, for the request
// key and cordon annotation it was given: the fitMemos keep the devices and reasons of full
// fits, this the yes or no of probes.
type probeCache struct {
	info *schedcache.NodeInfo
	ver  uint64
	node allocation.ProbeNode
	// mig: the node has a GPU in MIG mode, which a Probe does not model (placements).
	mig bool

	reqKey, cordon string
	asked, ok      bool
}

// probed is the probe's answer on the node: ok and score only, no devices and no reason;
// false when the node has a GPU in MIG mode (Fit it instead).
func (n *nodeUsage) probed(p *allocation.Probe, info *schedcache.NodeInfo, reg *schedcache.Registration, reqKey, cordon string) (fitMemo, bool) {
	c := &n.probe
	if c.info != info {
		c.mig = slices.ContainsFunc(reg.Devices, func(d annotation.Device) bool { return d.Mode == allocation.ModeMIG })
	}
	if c.mig {
		c.info = info
		return fitMemo{}, false
	}
	if c.info != info || c.ver != n.ver {
		c.node.Set(reg.Devices, n.used)
		c.info, c.ver, c.asked = info, n.ver, false
	}
	if !c.asked || c.reqKey != reqKey || c.cordon != cordon {
		c.reqKey, c.cordon, c.asked = reqKey, cordon, true
		c.ok = p.Fits(&c.node, cordon)
	}
	return fitMemo{ok: c.ok, score: c.node.Score()}, true
}

// nodeAnnotations are what the fit reads of the node's annotations, from the node cache's view
// of it (no lister lookup per candidate): hami.io/device-cordon, nil without one.
func nodeAnnotations(info *schedcache.NodeInfo) (map[string]string, string) {
	if info.Cordon == "" {
		return nil, ""
	}
	return map[string]string{allocation.KeyDeviceCordon: info.Cordon}, info.Cordon
}

// exactLocked is the loop of decideWith for one registered node the pod does not hold
// anything on, with Fit: the node's devices, reason and score, remembered for later filters.
// false when the node is not registered in snap.
func (e *Extender) exactLocked(view *usage.View, snap *schedcache.Snapshot, pod *corev1.Pod, req allocation.PodRequest, reqKey, name string) (fitMemo, bool) {
	info, ok := snap.Node(name)
	if !ok {
		return fitMemo{}, false
	}
	reg := registration(info, e.opts.Vendor.Name)
	if reg == nil || reg.State != schedcache.StateRegistered {
		return fitMemo{}, false
	}
	nu := e.usage.nodeLocked(view, name)
	nodeAnnotations, cordon := nodeAnnotations(info)
	if m, hit := nu.memo(info, reqKey, cordon); hit {
		return m, true
	}
	devs := allocation.SetMIGUsage(allocation.WithUsage(reg.Devices, nu.used), nu.mig)
	pd, reason, fits := allocation.Fit(devs, req, pod.Annotations, nodeAnnotations, e.opts.Config)
	m := fitMemo{valid: true, info: info, ver: nu.ver, reqKey: reqKey, cordon: cordon,
		devices: pd, reason: reason, ok: fits, score: allocation.NodeScore(devs)}
	nu.remember(m)
	return m, true
}

// chosenLocked is Fit on the node a probe chose: its devices, false if Fit disagrees.
func (e *Extender) chosenLocked(view *usage.View, snap *schedcache.Snapshot, pod *corev1.Pod, req allocation.PodRequest, reqKey, name string, score float64) (allocation.PodDevices, bool) {
	m, ok := e.exactLocked(view, snap, pod, req, reqKey, name)
	return m.devices, ok && m.ok && m.score == score
}

// explainLocked fills in the reasons of the probed nodes that do not fit, with Fit; false if
// Fit disagrees on one.
func (e *Extender) explainLocked(view *usage.View, snap *schedcache.Snapshot, pod *corev1.Pod, req allocation.PodRequest, reqKey string, names []string, failed map[string]string) bool {
	for _, name := range names {
		m, ok := e.exactLocked(view, snap, pod, req, reqKey, name)
		if !ok || m.ok {
			return false
		}
		failed[name] = m.reason
	}
	return true
}
