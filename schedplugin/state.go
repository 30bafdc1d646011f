package schedplugin

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/schedcache"
)

// stateKey is where PreFilter keeps the cycle's state.
const stateKey fwk.StateKey = Name

// cycleState is one scheduling cycle's, written by PreFilter.
type cycleState struct {
	vendor int
	cfg    allocation.Config
	req    allocation.PodRequest
	reqKey string // what a fit depends on besides the node, for the per-node memo
	// probes hand out allocation.Probes of the request (one per goroutine: a Probe is not
	// safe for concurrent use); nil when a Probe does not model it.
	probes  *sync.Pool
	binpack bool
	snap    *schedcache.Snapshot
	seq     uint64 // the reservation sequence number when the cycle began
	// quota is the namespace's quota read once (nil: it limits nothing); delta is what
	// AddPod/RemovePod moved since.
	quota *allocation.Quota
	delta allocation.QuotaAmount

	// results are the per-node fits of this cycle's Filters, for Score and Reserve.
	mu      sync.Mutex
	results map[string]nodeResult

	// Written by Reserve and PreBind (one goroutine after the other).
	reserved *reservation
	locked   bool
	bindTime string
	// onDRA: Reserve found the node a DRA node of the extended-resource mapping.
	onDRA bool
}

// nodeResult is one node's fit.
type nodeResult struct {
	score    float64
	nodeInfo fwk.NodeInfo
}

// Clone implements fwk.StateData: a copy with its own (empty) result map, so that the fits of
// preemption's and the nominated pass's copies never reach the cycle's; the quota delta is a
// value.
func (s *cycleState) Clone() fwk.StateData {
	return &cycleState{vendor: s.vendor, cfg: s.cfg, req: s.req, reqKey: s.reqKey, probes: s.probes, binpack: s.binpack, snap: s.snap, seq: s.seq,
		quota: s.quota, delta: s.delta, results: map[string]nodeResult{}}
}

func (s *cycleState) setResult(node string, r nodeResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.results[node] = r
}

func (s *cycleState) result(node string) (nodeResult, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.results[node]
	return r, ok
}

// fitQuota is the quota the pod is fitted against, with the delta; nil when none limits.
func (s *cycleState) fitQuota() *allocation.Quota {
	if s.quota == nil {
		return nil
	}
	q := *s.quota
	q.Used = q.Used.Add(s.delta)
	return &q
}

// readState returns the cycle's state; nil when PreFilter wrote none (the pod is not ours).
func readState(cs fwk.CycleState) *cycleState {
	if cs == nil {
		return nil
	}
	d, err := cs.Read(stateKey)
	if err != nil {
		return nil
	}
	s, _ := d.(*cycleState)
	return s
}

// reservation is what Reserve took for a pod: memory only, until Unreserve or the pod's
// deletion.
type reservation struct {
	uid     types.UID
	node    string
	vendor  int
	seq     uint64
	devices allocation.PodDevices
	used    map[string]allocation.Usage
	mig     map[string][]mig.Placement
	undo    func()
}

// reservations is the plugin's reservation map, by pod UID, with a global sequence number.
type reservations struct {
	mu   sync.RWMutex
	seq  uint64
	byID map[types.UID]*reservation
	ver  map[string]uint64 // per node: the sequence number of its last change
}

// nodeVersion changes whenever a reservation on node is added or dropped.
func (r *reservations) nodeVersion(node string) uint64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.ver[node]
}

// current is the latest sequence number.
func (r *reservations) current() uint64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.seq
}

// add records res (numbering it) and returns the reservation it replaced, if any.
func (r *reservations) add(res *reservation) *reservation {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byID == nil {
		r.byID = map[types.UID]*reservation{}
	}
	if r.ver == nil {
		r.ver = map[string]uint64{}
	}
	r.seq++
	res.seq = r.seq
	old := r.byID[res.uid]
	r.byID[res.uid] = res
	r.ver[res.node] = r.seq
	if old != nil {
		r.ver[old.node] = r.seq
	}
	return old
}

// drop removes uid's reservation (only res when res is not nil) and runs its tracker undo.
func (r *reservations) drop(uid types.UID, res *reservation) {
	r.mu.Lock()
	cur, ok := r.byID[uid]
	if ok && (res == nil || cur == res) {
		delete(r.byID, uid)
		r.seq++
		r.ver[cur.node] = r.seq
	}
	r.mu.Unlock()
	if ok && (res == nil || cur == res) && cur.undo != nil {
		cur.undo()
	}
}

func (r *reservations) get(uid types.UID) (*reservation, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	res, ok := r.byID[uid]
	return res, ok
}

// newerOn returns the reservations on node newer than seq whose pods are not in present.
func (r *reservations) newerOn(node string, seq uint64, present map[types.UID]bool) []*reservation {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.seq <= seq {
		return nil
	}
	var out []*reservation
	for uid, res := range r.byID {
		if res.node == node && res.seq > seq && !present[uid] {
			out = append(out, res)
		}
	}
	return out
}

// nodeUsage is what the pods on one node hold of one vendor's GPUs.
type nodeUsage struct {
	used map[string]allocation.Usage
	mig  map[string][]mig.Placement
}

func (u *nodeUsage) add(used map[string]allocation.Usage, placements map[string][]mig.Placement) {
	if u.used == nil {
		u.used = map[string]allocation.Usage{}
	}
	for gpu, x := range used {
		u.used[gpu] = u.used[gpu].Add(x)
	}
	if len(placements) == 0 {
		return
	}
	if u.mig == nil {
		u.mig = map[string][]mig.Placement{}
	}
	for gpu, ps := range placements {
		u.mig[gpu] = append(u.mig[gpu][:len(u.mig[gpu]):len(u.mig[gpu])], ps...)
	}
}

// podKeyOf is the tracker's key of pod.
func podKeyOf(pod *corev1.Pod) string { return pod.Namespace + "/" + pod.Name }
