package extender

import (
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/schedcache"
)

// placement is what one pod holds on one node: GPU UUID → usage.
type placement struct {
	node string
	used map[string]allocation.Usage
	// devices are the pod's device entries the usage was summed from (the container gauges).
	devices allocation.PodDevices
}

// podUsage is one pod's contribution: what the informer last showed (the pod's
// hami.io/vgpu-node and device annotations), else what this extender assumed at filter before
// the informer caught up.
type podUsage struct {
	informed, assumed *placement
}

func (p *podUsage) effective() *placement {
	if p.informed != nil {
		return p.informed
	}
	return p.assumed
}

// memoSize is how many fits per node are kept: pods of a few workloads that arrive interleaved
// each find theirs.
const memoSize = 4

// nodeUsage is what the pods hold on one node, and the last fits made there.
type nodeUsage struct {
	used  map[string]allocation.Usage
	ver   uint64 // changes whenever used changes
	memos [memoSize]fitMemo
	next  int // the memo to replace
	probe probeCache
	// node is the Node object the lister last gave, cordon its hami.io/device-cordon.
	node   *corev1.Node
	cordon string
}

// memo returns the fit made for reqKey on this node's current usage and devices, if any.
func (n *nodeUsage) memo(info *schedcache.NodeInfo, reqKey, cordon string) (fitMemo, bool) {
	for i := range n.memos {
		m := &n.memos[i]
		if m.valid && m.ver == n.ver && m.info == info && m.reqKey == reqKey && m.cordon == cordon {
			return *m, true
		}
	}
	return fitMemo{}, false
}

// remember keeps a fit, replacing the oldest.
func (n *nodeUsage) remember(m fitMemo) {
	n.memos[n.next] = m
	n.next = (n.next + 1) % memoSize
}

// fitMemo is the fit of one request on one node at one usage version: Fit is a pure function of
// the node's devices and usage, the request, the pod's annotations and the node's annotations,
// so while none of them changed the answer is the same.
type fitMemo struct {
	valid   bool
	info    *schedcache.NodeInfo // the cache's immutable view the devices came from
	ver     uint64
	reqKey  string
	cordon  string
	devices allocation.PodDevices
	reason  string
	ok      bool
	score   float64
}

// usageIndex keeps the per-node usage incrementally from pod events: a pod event changes only
// the nodes it was and is placed on; no filter call recomputes usage over all pods.
type usageIndex struct {
	vendor  annotation.Vendor
	version allocation.Version

	// decodeFailed, when set, is called for a pod whose device annotation does not decode.
	decodeFailed func()

	mu    sync.Mutex
	pods  map[string]*podUsage // by namespace/name
	nodes map[string]*nodeUsage
	ver   uint64
}

func newUsageIndex(v annotation.Vendor, ver allocation.Version) *usageIndex {
	return &usageIndex{vendor: v, version: ver, pods: map[string]*podUsage{}, nodes: map[string]*nodeUsage{}}
}

// placementOf reads a pod's placement from its annotations as HAMi's pod cache does: the node
// of hami.io/vgpu-node, the devices of hami.io/vgpu-devices-allocated; nil when it holds
// nothing (no node, terminated, no or undecodable device list).
func (u *usageIndex) placementOf(pod *corev1.Pod) *placement {
	node, ok := allocation.PodNode(pod)
	if !ok {
		return nil
	}
	pd, ok, err := allocation.Allocated(pod, u.vendor, u.version)
	if err != nil && u.decodeFailed != nil {
		u.decodeFailed()
	}
	if err != nil || !ok {
		return nil
	}
	used := pd.Usage()
	if len(used) == 0 {
		return nil
	}
	return &placement{node: node, used: used, devices: pd}
}

// changed reports whether an update touches what usage reads: the phase, hami.io/vgpu-node
// and the vendor's allocated devices.
func (u *usageIndex) changed(o, n *corev1.Pod) bool {
	return o.Status.Phase != n.Status.Phase || o.Annotations[allocation.KeyNode] != n.Annotations[allocation.KeyNode] ||
		o.Annotations[u.vendor.AllocatedKey] != n.Annotations[u.vendor.AllocatedKey]
}

// observe applies a pod add or update from the informer.
func (u *usageIndex) observe(key string, pod *corev1.Pod) {
	terminated := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	p := u.placementOf(pod)
	u.mu.Lock()
	defer u.mu.Unlock()
	if terminated {
		u.setLocked(key, nil, nil)
		return
	}
	cur := u.pods[key]
	var assumed *placement
	if cur != nil && p == nil {
		assumed = cur.assumed // the informer has not caught up with the filter's patch yet
	}
	u.setLocked(key, p, assumed)
}

// forget applies a pod delete.
func (u *usageIndex) forget(key string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.setLocked(key, nil, nil)
}

// assume records what a filter just chose for a pod, so that the next filter counts it before
// the informer delivers the patched pod. It returns a function that undoes it.
func (u *usageIndex) assumeLocked(key string, p *placement) (undo func()) {
	cur := u.pods[key]
	var informed, prevAssumed *placement
	if cur != nil {
		informed, prevAssumed = cur.informed, cur.assumed
	}
	// The new choice replaces whatever the pod held (a re-filtered pod does not count twice).
	u.setLocked(key, nil, p)
	return func() {
		u.mu.Lock()
		defer u.mu.Unlock()
		if c := u.pods[key]; c != nil && c.assumed == p && c.informed == nil {
			u.setLocked(key, informed, prevAssumed)
		}
	}
}

// setLocked replaces a pod's contribution and updates the node totals it changes.
func (u *usageIndex) setLocked(key string, informed, assumed *placement) {
	var before *placement
	if cur := u.pods[key]; cur != nil {
		before = cur.effective()
	}
	next := &podUsage{informed: informed, assumed: assumed}
	after := next.effective()
	if after == nil {
		delete(u.pods, key)
	} else {
		u.pods[key] = next
	}
	if before == after {
		return
	}
	if before != nil {
		u.addLocked(before, -1)
	}
	if after != nil {
		u.addLocked(after, 1)
	}
}

func (u *usageIndex) addLocked(p *placement, sign int64) {
	n := u.nodes[p.node]
	if n == nil {
		n = &nodeUsage{used: map[string]allocation.Usage{}}
		u.nodes[p.node] = n
	}
	for gpu, use := range p.used {
		cur := n.used[gpu]
		if sign > 0 {
			cur = cur.Add(use)
		} else {
			cur = cur.Sub(use)
		}
		if cur == (allocation.Usage{}) {
			delete(n.used, gpu)
		} else {
			n.used[gpu] = cur
		}
	}
	u.ver++
	n.ver = u.ver
}

// nodeLocked returns a node's usage entry, creating an empty one.
func (u *usageIndex) nodeLocked(name string) *nodeUsage {
	n := u.nodes[name]
	if n == nil {
		u.ver++
		n = &nodeUsage{used: map[string]allocation.Usage{}, ver: u.ver}
		u.nodes[name] = n
	}
	return n
}

// Usage returns what the pods hold on node, GPU UUID → usage, in a new map.
func (u *usageIndex) usage(node string) map[string]allocation.Usage {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := map[string]allocation.Usage{}
	if n := u.nodes[node]; n != nil {
		for k, v := range n.used {
			out[k] = v
		}
	}
	return out
}
