package extender

import (
	"errors"

	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/schedcache"
	"github.com/hamireg/hamireg/usage"
)

// memoSize is how many fits per node are kept: pods of a few workloads that arrive interleaved
// each find theirs.
const memoSize = 4

// nodeUsage is what the pods hold on one node, as of the tracker's view, and the last fits made
// there.
type nodeUsage struct {
	used  map[string]allocation.Usage // the tracker's, valid while its lock is held
	mig   map[string][]mig.Placement  // the tracker's MIG placements, likewise
	ver   uint64                      // changes whenever used or mig changes
	memos [memoSize]fitMemo
	next  int // the memo to replace
	probe probeCache
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
// the node's devices and usage, the request, the pod's annotations, the node's annotations and
// the namespace's quota (part of reqKey), so while none of them changed the answer is the same.
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

// usageIndex is the extender's usage: the exported tracker (package usage), fed by the pod
// and ResourceQuota informers, and the filter's memos per node.
type usageIndex struct {
	*usage.Tracker
	memos map[string]*nodeUsage // guarded by the tracker's lock (decide holds a View)
	// decodeFailed, when set (before Run), is called for a pod whose device annotation does
	// not decode.
	decodeFailed func()
	// migFailed, when set (before Run), is called for a pod whose MIG reservation does not
	// decode or apply (its devices then occupy every placement of their MIG GPUs).
	migFailed func(pod *corev1.Pod, err error)
}

func newUsageIndex(v annotation.Vendor, cfg allocation.Config) *usageIndex {
	u := &usageIndex{memos: map[string]*nodeUsage{}}
	u.Tracker = usage.New(usage.Options{Vendor: v, Config: cfg, DecodeFailed: func(pod *corev1.Pod, err error) {
		if errors.Is(err, mig.ErrMalformed) {
			if u.migFailed != nil {
				u.migFailed(pod, err)
			}
			return
		}
		if u.decodeFailed != nil {
			u.decodeFailed()
		}
	}})
	return u
}

// nodeLocked returns a node's memo entry with its usage as of view.
func (u *usageIndex) nodeLocked(view *usage.View, name string) *nodeUsage {
	n := u.memos[name]
	if n == nil {
		n = &nodeUsage{}
		u.memos[name] = n
	}
	n.used, n.ver = view.Node(name)
	n.mig = view.MIG(name)
	return n
}

// usage returns what the pods hold on node, GPU UUID → usage, in a new map.
func (u *usageIndex) usage(node string) map[string]allocation.Usage { return u.Node(node) }
