package usage

import (
	"iter"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/mig"
)

// Options configure a [Tracker]. The zero value is HAMi's chart with master's rules and NVIDIA's
// annotation keys.
type Options struct {
	// Vendor names the pod annotation of the allocated devices usage is read from. The zero
	// value means annotation.NVIDIA().
	Vendor annotation.Vendor
	// Config gives the HAMi version whose rules apply (device list decoding, a limit of 0),
	// the accounting of init containers and native sidecars (Config.Accounting, see
	// allocation.EffectiveUsage) and the resource names of the quota keys. The zero value is
	// HAMi's chart, master, with the Kubernetes rule for init containers and sidecars.
	Config allocation.Config
	// DecodeFailed, when set, is called (outside the tracker's lock, on the informer's
	// goroutine) for a pod whose device annotation does not decode; the pod then holds
	// nothing. It is also called, with an error wrapping mig.ErrMalformed, for a pod whose
	// MIG reservation (mig.KeyAllocations) does not decode or does not match its devices; the
	// pod then holds its devices with unknown placements, which occupy every placement of a
	// MIG GPU (allocation's rule c). A metric, a log line or an Event belongs here.
	DecodeFailed func(pod *corev1.Pod, err error)
}

// Placement is what one pod holds: the node it counts against, what it holds of each GPU there
// (by UUID), and what it holds against its namespace's quota.
type Placement struct {
	Node  string
	GPUs  map[string]allocation.Usage
	Quota allocation.QuotaAmount
	// Devices are the pod's device entries the usage was summed from, one per container,
	// with the MIG slots of its reservation.
	Devices allocation.PodDevices
	// MIG are the MIG placements the pod holds, by GPU UUID ([allocation.PodDevices.MIGUsage]
	// of Devices); nil when none.
	MIG map[string][]mig.Placement
	// MIGAllocations is the pod's MIG reservation (mig.KeyAllocations) with the runtime
	// identity the node recorded, when it decodes and applies to Devices; nil otherwise.
	MIGAllocations []mig.Allocation
}

// podEntry is one pod's contribution: what the informer last showed, else what a scheduler
// assumed before the informer caught up.
type podEntry struct {
	namespace         string
	informed, assumed *Placement
	// shrunk is true once the pod's init phase was seen over (HAMi v2.10.0 keeps it so).
	shrunk bool
}

func (p *podEntry) effective() *Placement {
	if p.informed != nil {
		return p.informed
	}
	return p.assumed
}

type nodeEntry struct {
	used map[string]allocation.Usage
	mig  map[string][]mig.Placement // GPU → placements held; never appended to in place
	pods map[string]map[string]bool // GPU → pod keys
	ver  uint64
}

type namespaceEntry struct {
	used   allocation.QuotaAmount
	pods   map[string]allocation.QuotaAmount // pod key → what it holds
	quotas map[string]*corev1.ResourceQuota  // by name
	limits allocation.QuotaLimits
}

// Tracker keeps what pods hold of each node's GPUs and of each namespace's quota,
// incrementally from pod events (add, update, delete: only the nodes and the namespace a pod
// was and is placed on change), together with what a scheduler assumed for pods whose
// annotations it has not seen yet. It also keeps each namespace's quota limits from its
// ResourceQuota objects. All methods are safe for concurrent use; [Tracker.Lock] gives one
// consistent view across nodes for a decision.
type Tracker struct {
	vendor       annotation.Vendor
	cfg          allocation.Config
	decodeFailed func(*corev1.Pod, error)

	mu         sync.Mutex
	pods       map[string]*podEntry // by namespace/name
	nodes      map[string]*nodeEntry
	namespaces map[string]*namespaceEntry
	ver        uint64
}

// New returns an empty tracker.
func New(opts Options) *Tracker {
	if opts.Vendor.Name == "" {
		opts.Vendor = annotation.NVIDIA()
	}
	cfg, err := opts.Config.WithDefaults()
	if err != nil {
		cfg, _ = allocation.Config{Version: opts.Config.Version}.WithDefaults()
	}
	return &Tracker{vendor: opts.Vendor, cfg: cfg, decodeFailed: opts.DecodeFailed, pods: map[string]*podEntry{}, nodes: map[string]*nodeEntry{},
		namespaces: map[string]*namespaceEntry{}}
}

// Key is the tracker's key of a pod: "namespace/name" (the informers' key).
func Key(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}

// PlacementOf reads what pod holds from its annotations, as HAMi's pod cache does: the node of
// hami.io/vgpu-node and the devices of the vendor's allocated list, with the MIG slots of its
// mig.KeyAllocations reservation ([allocation.WithMIG]; one that does not decode or apply is
// reported to Options.DecodeFailed and leaves the devices without slots); false when it holds
// nothing: no node, Succeeded or Failed, no or undecodable device list. A pod whose bind
// failed keeps holding its devices until a scheduler places it again (Assume replaces them)
// or it is deleted, as HAMi counts it: every HAMi component then sees the same usage.
//
// What it holds of each GPU and against its quota is [allocation.PodUsage] under the
// tracker's accounting: its init containers and native sidecars counted by their kinds
// (the pod's spec), and its steady state once its init phase is over
// ([allocation.InitDone]). The tracker itself, with [allocation.AccountingHAMi] and HAMi
// master, shrinks a pod only on an update, once and for good, as HAMi v2.10.0 does.
func (t *Tracker) PlacementOf(pod *corev1.Pod) (Placement, bool) {
	return t.placementOf(pod, allocation.InitDone(pod, t.cfg))
}

func (t *Tracker) placementOf(pod *corev1.Pod, initDone bool) (Placement, bool) {
	node, ok := allocation.PodNode(pod)
	if !ok {
		return Placement{}, false
	}
	pd, ok, err := allocation.Allocated(pod, t.vendor, t.cfg.Version)
	if err != nil && t.decodeFailed != nil {
		t.decodeFailed(pod, err)
	}
	if err != nil || !ok {
		return Placement{}, false
	}
	var reservation []mig.Allocation
	if value, has := pod.Annotations[mig.KeyAllocations]; has {
		allocs, err := mig.DecodeAllocations(value)
		if err == nil {
			pd, err = allocation.WithMIG(pd, allocs)
		}
		if err == nil {
			reservation = allocs
		}
		if err != nil && t.decodeFailed != nil {
			t.decodeFailed(pod, err)
		}
	}
	p, ok := t.placement(node, pd, pod, initDone)
	if ok {
		p.MIGAllocations = reservation
	}
	return p, ok
}

func (t *Tracker) placement(node string, pd allocation.PodDevices, pod *corev1.Pod, initDone bool) (Placement, bool) {
	used := allocation.EffectiveUsage(pd, allocation.Kinds(pod), initDone, t.cfg)
	if len(used) == 0 {
		return Placement{}, false
	}
	return Placement{Node: node, GPUs: used, Quota: allocation.UsageQuota(used), Devices: pd, MIG: pd.MIGUsage()}, true
}

// hamiShrink reports whether the tracker shrinks pods only on updates, for good (HAMi v2.10.0).
func (t *Tracker) hamiShrink() bool {
	return t.cfg.EffectiveAccounting() == allocation.AccountingHAMi && t.cfg.Version == allocation.VersionMaster
}

// Changed reports whether an update from o to n touches what the tracker reads: the phase, the
// node, the bind phase, the vendor's allocated devices, the MIG reservation, and whether the
// pod's init phase is over (allocation.InitDone; with AccountingHAMi and HAMi master: n's is
// over and the tracker has not shrunk the pod yet). An informer's update handler can skip the
// others.
func (t *Tracker) Changed(o, n *corev1.Pod) bool {
	return t.initChanged(o, n) || o.Status.Phase != n.Status.Phase || o.Spec.NodeName != n.Spec.NodeName ||
		o.Annotations[allocation.KeyNode] != n.Annotations[allocation.KeyNode] ||
		o.Annotations[allocation.KeyBindPhase] != n.Annotations[allocation.KeyBindPhase] ||
		o.Annotations[t.vendor.AllocatedKey] != n.Annotations[t.vendor.AllocatedKey] ||
		o.Annotations[mig.KeyAllocations] != n.Annotations[mig.KeyAllocations]
}

// initChanged is Changed's test of the init phase.
func (t *Tracker) initChanged(o, n *corev1.Pod) bool {
	if len(n.Spec.InitContainers) == 0 {
		return false
	}
	if !t.hamiShrink() {
		return allocation.InitDone(o, t.cfg) != allocation.InitDone(n, t.cfg)
	}
	if !allocation.InitDone(n, t.cfg) {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := t.pods[Key(n.Namespace, n.Name)]
	return cur == nil || !cur.shrunk
}

// Observe applies a pod add or update from an informer. A pod that holds nothing by its
// annotations keeps what was assumed for it (the informer has not caught up with the
// scheduler's patch yet), unless it terminated. What the pod holds follows its init phase
// (see [Tracker.PlacementOf]).
func (t *Tracker) Observe(pod *corev1.Pod) {
	terminated := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	key := Key(pod.Namespace, pod.Name)
	initDone := allocation.InitDone(pod, t.cfg)
	if t.hamiShrink() && len(pod.Spec.InitContainers) > 0 {
		// HAMi v2.10.0 shrinks a pod it knows on an update (onUpdatePod), never on an add,
		// and never grows it back.
		t.mu.Lock()
		cur := t.pods[key]
		initDone = cur != nil && (cur.shrunk || initDone)
		t.mu.Unlock()
	}
	p, ok := t.placementOf(pod, initDone)
	t.mu.Lock()
	defer t.mu.Unlock()
	defer func() {
		if cur := t.pods[key]; cur != nil && ok {
			cur.shrunk = initDone
		}
	}()
	if terminated {
		t.setLocked(key, pod.Namespace, nil, nil)
		return
	}
	var informed, assumed *Placement
	if ok {
		informed = &p
	} else if cur := t.pods[key]; cur != nil {
		assumed = cur.assumed
	}
	t.setLocked(key, pod.Namespace, informed, assumed)
}

// Delete applies a pod delete from an informer (key as [Key]).
func (t *Tracker) Delete(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.setLocked(key, "", nil, nil)
}

// Assume records that a scheduler placed pod on node with devices pd (one entry per container,
// init containers first, with the MIG slots it chose), so that the next decision counts it,
// and the MIG placements it took, before the informer delivers the pod's annotations. It replaces whatever the pod held (a re-scheduled pod counts once). It
// returns a function that undoes it, for a failed patch or bind; the undo does nothing once an
// informer showed the pod placed or the pod was assumed again.
func (t *Tracker) Assume(pod *corev1.Pod, node string, pd allocation.PodDevices) (undo func()) {
	v := t.Lock()
	defer v.Unlock()
	return v.Assume(pod, node, pd)
}

// Node returns what the pods hold on node, GPU UUID → usage, in a new map.
func (t *Tracker) Node(node string) map[string]allocation.Usage {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]allocation.Usage{}
	if n := t.nodes[node]; n != nil {
		for k, v := range n.used {
			out[k] = v
		}
	}
	return out
}

// PodsOnGPU returns the keys of the pods holding part of a GPU of node, sorted.
func (t *Tracker) PodsOnGPU(node, gpu string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.nodes[node]
	if n == nil {
		return nil
	}
	out := make([]string, 0, len(n.pods[gpu]))
	for k := range n.pods[gpu] {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// MIG returns the MIG placements the pods hold on node, GPU UUID → placements, in a new map
// (the slices are shared: do not modify them).
func (t *Tracker) MIG(node string) map[string][]mig.Placement {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string][]mig.Placement{}
	if n := t.nodes[node]; n != nil {
		for k, v := range n.mig {
			out[k] = v
		}
	}
	return out
}

// Pod returns what a pod holds (informed, else assumed).
func (t *Tracker) Pod(key string) (Placement, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.pods[key]; p != nil {
		if e := p.effective(); e != nil {
			return *e, true
		}
	}
	return Placement{}, false
}

// Len is the number of pods that hold something.
func (t *Tracker) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pods)
}

// NamespaceUsage returns what a namespace's pods hold against its quota, in total and by pod
// key.
func (t *Tracker) NamespaceUsage(namespace string) (allocation.QuotaAmount, map[string]allocation.QuotaAmount) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ns := t.namespaces[namespace]
	if ns == nil {
		return allocation.QuotaAmount{}, map[string]allocation.QuotaAmount{}
	}
	out := make(map[string]allocation.QuotaAmount, len(ns.pods))
	for k, v := range ns.pods {
		out[k] = v
	}
	return ns.used, out
}

// SetQuota applies a ResourceQuota add or update: the namespace's limits become the tightest
// of its objects ([allocation.QuotaLimitsFrom]). It returns the warnings about this object.
func (t *Tracker) SetQuota(rq *corev1.ResourceQuota) []*allocation.QuotaError {
	_, warnings := allocation.QuotaLimitsFrom([]*corev1.ResourceQuota{rq}, t.cfg)
	t.mu.Lock()
	defer t.mu.Unlock()
	ns := t.namespaceLocked(rq.Namespace)
	if ns.quotas == nil {
		ns.quotas = map[string]*corev1.ResourceQuota{}
	}
	ns.quotas[rq.Name] = rq
	t.limitsLocked(ns)
	return warnings
}

// DeleteQuota applies a ResourceQuota delete: the namespace's other objects still limit it.
func (t *Tracker) DeleteQuota(namespace, name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ns := t.namespaces[namespace]
	if ns == nil {
		return
	}
	delete(ns.quotas, name)
	t.limitsLocked(ns)
	t.pruneLocked(namespace, ns)
}

func (t *Tracker) limitsLocked(ns *namespaceEntry) {
	list := make([]*corev1.ResourceQuota, 0, len(ns.quotas))
	for _, q := range ns.quotas {
		list = append(list, q)
	}
	ns.limits, _ = allocation.QuotaLimitsFrom(list, t.cfg)
}

// Quota returns a namespace's limits and what its pods hold, not counting the pod self (a
// key; "" counts every pod): what [allocation.FitOptions].Quota takes for self.
func (t *Tracker) Quota(namespace, self string) allocation.Quota {
	v := t.Lock()
	defer v.Unlock()
	return v.Quota(namespace, self)
}

// Lock locks the tracker and returns a view of it, consistent across nodes and namespaces until
// [View.Unlock]: a scheduler decides on it and assumes its choice before anything else
// changes. The informer handlers wait meanwhile; keep it short.
func (t *Tracker) Lock() *View {
	t.mu.Lock()
	return &View{t: t}
}

// View is a locked [Tracker]. Its methods must not be used after Unlock.
type View struct{ t *Tracker }

// Unlock unlocks the tracker.
func (v *View) Unlock() { v.t.mu.Unlock() }

// Pod returns what a pod holds (informed, else assumed), shared: do not modify it.
func (v *View) Pod(key string) (*Placement, bool) {
	if p := v.t.pods[key]; p != nil {
		if e := p.effective(); e != nil {
			return e, true
		}
	}
	return nil, false
}

// Node returns what the pods hold on node, GPU UUID → usage, shared (do not modify it, do not
// keep it past Unlock), and the node's version: a number that changes whenever that usage
// changes, for memoising decisions per node.
func (v *View) Node(node string) (map[string]allocation.Usage, uint64) {
	n := v.t.nodeLocked(node)
	return n.used, n.ver
}

// MIG returns the MIG placements the pods hold on node, GPU UUID → placements, shared (do not
// modify it, do not keep it past Unlock; nil when none): what [allocation.SetMIGUsage] takes.
// It changes with the version [View.Node] returns.
func (v *View) MIG(node string) map[string][]mig.Placement {
	if n := v.t.nodes[node]; n != nil {
		return n.mig
	}
	return nil
}

// Pods yields every pod that holds something, by key, with what it holds (informed, else
// assumed), shared: do not modify it.
func (v *View) Pods() iter.Seq2[string, *Placement] {
	return func(yield func(string, *Placement) bool) {
		for key, p := range v.t.pods {
			if e := p.effective(); e != nil && !yield(key, e) {
				return
			}
		}
	}
}

// Nodes yields every node on which pods hold something, with what they hold of each GPU,
// shared: do not modify it.
func (v *View) Nodes() iter.Seq2[string, map[string]allocation.Usage] {
	return func(yield func(string, map[string]allocation.Usage) bool) {
		for name, n := range v.t.nodes {
			if len(n.used) > 0 && !yield(name, n.used) {
				return
			}
		}
	}
}

// Namespace is what the tracker knows of one namespace: its quota limits, what its pods hold
// against them, and how many pods hold something.
type Namespace struct {
	Name   string
	Limits allocation.QuotaLimits
	Used   allocation.QuotaAmount
	Pods   int
}

// Namespaces yields every namespace with a pod that holds something or a ResourceQuota.
func (v *View) Namespaces() iter.Seq[Namespace] {
	return func(yield func(Namespace) bool) {
		for name, ns := range v.t.namespaces {
			if !yield(Namespace{Name: name, Limits: ns.limits, Used: ns.used, Pods: len(ns.pods)}) {
				return
			}
		}
	}
}

// Quota is [Tracker.Quota] in the view.
func (v *View) Quota(namespace, self string) allocation.Quota {
	ns := v.t.namespaces[namespace]
	if ns == nil {
		return allocation.Quota{}
	}
	q := allocation.Quota{Limits: ns.limits, Used: ns.used}
	if p, ok := v.Pod(self); ok && self != "" && v.t.pods[self].namespace == namespace {
		q.Used = q.Used.Sub(p.Quota)
	}
	return q
}

// Assume is [Tracker.Assume] in the view; the undo locks the tracker itself (call it after
// Unlock).
func (v *View) Assume(pod *corev1.Pod, node string, pd allocation.PodDevices) (undo func()) {
	t := v.t
	key := Key(pod.Namespace, pod.Name)
	var informed, prev *Placement
	if cur := t.pods[key]; cur != nil {
		informed, prev = cur.informed, cur.assumed
	}
	initDone := allocation.InitDone(pod, t.cfg) && !t.hamiShrink()
	p, ok := t.placement(node, pd, pod, initDone)
	var assumed *Placement
	if ok {
		assumed = &p
	}
	t.setLocked(key, pod.Namespace, nil, assumed)
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if c := t.pods[key]; c != nil && c.assumed == assumed && c.informed == nil {
			t.setLocked(key, pod.Namespace, informed, prev)
		}
	}
}

// setLocked replaces a pod's contribution and updates the node and namespace totals it
// changes.
func (t *Tracker) setLocked(key, namespace string, informed, assumed *Placement) {
	var before *Placement
	cur := t.pods[key]
	if cur != nil {
		before = cur.effective()
		if namespace == "" {
			namespace = cur.namespace
		}
	}
	next := &podEntry{namespace: namespace, informed: informed, assumed: assumed}
	after := next.effective()
	if after == nil {
		delete(t.pods, key)
	} else {
		t.pods[key] = next
	}
	if before == after {
		return
	}
	if before != nil {
		t.addLocked(key, cur.namespace, before, -1)
	}
	if after != nil {
		t.addLocked(key, namespace, after, 1)
	}
}

func (t *Tracker) addLocked(key, namespace string, p *Placement, sign int64) {
	n := t.nodeLocked(p.Node)
	for gpu, use := range p.GPUs {
		cur := n.used[gpu]
		pods := n.pods[gpu]
		if sign > 0 {
			cur = cur.Add(use)
			if pods == nil {
				pods = map[string]bool{}
				n.pods[gpu] = pods
			}
			pods[key] = true
		} else {
			cur = cur.Sub(use)
			delete(pods, key)
			if len(pods) == 0 {
				delete(n.pods, gpu)
			}
		}
		if cur == (allocation.Usage{}) {
			delete(n.used, gpu)
		} else {
			n.used[gpu] = cur
		}
	}
	for gpu, ps := range p.MIG {
		if sign > 0 {
			if n.mig == nil {
				n.mig = map[string][]mig.Placement{}
			}
			n.mig[gpu] = append(slices.Clip(n.mig[gpu]), ps...)
			continue
		}
		n.mig[gpu] = withoutPlacements(n.mig[gpu], ps)
		if len(n.mig[gpu]) == 0 {
			delete(n.mig, gpu)
		}
	}
	t.ver++
	n.ver = t.ver
	ns := t.namespaceLocked(namespace)
	if sign > 0 {
		ns.used = ns.used.Add(p.Quota)
		ns.pods[key] = ns.pods[key].Add(p.Quota)
		return
	}
	ns.used = ns.used.Sub(p.Quota)
	if left := ns.pods[key].Sub(p.Quota); left == (allocation.QuotaAmount{}) {
		delete(ns.pods, key)
	} else {
		ns.pods[key] = left
	}
	t.pruneLocked(namespace, ns)
}

// nodeLocked returns a node's entry, creating an empty one with a new version.
func (t *Tracker) nodeLocked(name string) *nodeEntry {
	n := t.nodes[name]
	if n == nil {
		t.ver++
		n = &nodeEntry{used: map[string]allocation.Usage{}, pods: map[string]map[string]bool{}, ver: t.ver}
		t.nodes[name] = n
	}
	return n
}

func (t *Tracker) namespaceLocked(name string) *namespaceEntry {
	ns := t.namespaces[name]
	if ns == nil {
		ns = &namespaceEntry{pods: map[string]allocation.QuotaAmount{}}
		t.namespaces[name] = ns
	}
	return ns
}

// pruneLocked drops a namespace entry that holds nothing (HAMi keeps one per namespace ever
// seen until restart).
func (t *Tracker) pruneLocked(name string, ns *namespaceEntry) {
	if len(ns.pods) == 0 && len(ns.quotas) == 0 {
		delete(t.namespaces, name)
	}
}

// withoutPlacements returns a new slice of held without one occurrence of each of ps.
func withoutPlacements(held, ps []mig.Placement) []mig.Placement {
	out := slices.Clone(held)
	for _, p := range ps {
		if i := slices.Index(out, p); i >= 0 {
			out = slices.Delete(out, i, i+1)
		}
	}
	return out
}
