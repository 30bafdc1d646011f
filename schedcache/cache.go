package schedcache

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	coreinformers "k8s.io/client-go/informers/core/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/handshake"
)

// Event reasons the cache records on Nodes.
const (
	// ReasonRegisterMalformed: the register annotation does not decode (Warning).
	ReasonRegisterMalformed = "RegisterAnnotationMalformed"
	// ReasonRegisterInvalid: the register annotation holds a null device (Warning).
	ReasonRegisterInvalid = "RegisterAnnotationInvalid"
	// ReasonRegisterEmpty: the register annotation lists no devices (Warning).
	ReasonRegisterEmpty = "RegisterAnnotationEmpty"
	// ReasonRegisterRemoved: a register annotation that was present is gone (Warning).
	ReasonRegisterRemoved = "RegisterAnnotationRemoved"
	// ReasonDeviceUnhealthy: the handshake expired with nothing allocatable, or allocatable
	// dropped to 0; the node's devices were removed and its handshake cleaned up (Warning).
	ReasonDeviceUnhealthy = "DeviceUnhealthy"
	// ReasonScoreMalformed: the topology score annotation (hami.io/node-nvidia-score) does
	// not decode; the node stays registered without scores (Warning). HAMi's scheduler drops
	// the whole node instead.
	ReasonScoreMalformed = "TopologyScoreAnnotationMalformed"
)

// stateNone marks a vendor entry that has no state yet.
const stateNone State = -1

// Cache is the scheduler-side node cache. Create it with [New], run it with [Cache.Run], read it
// with [Cache.Node] and [Cache.Snapshot] from any goroutine. It knows nothing about leader
// election: it is warm on every replica, and the handshake writes it decides are made by a
// [Handshaker] while one runs (on the leader).
type Cache struct {
	informer cache.SharedIndexInformer
	lister   corev1listers.NodeLister
	opts     Options
	vendors  []annotation.Vendor
	metrics  *metrics
	running  atomic.Bool

	qmu    sync.RWMutex
	events workqueue.TypedInterface[string]
	writer *writer // the running Handshaker's queue; nil while none runs

	// cycleMu serialises the goroutines that change entries: the event worker, the tick and
	// the term changes. Readers never take it; it is never held across an API call.
	cycleMu  sync.Mutex
	entries  map[string]*nodeEntry
	counts   [][]int // [vendor][state]
	interned map[string]string

	// mu guards the published NodeInfos; writers hold it only to assign map entries.
	mu         sync.RWMutex
	nodes      map[string]*NodeInfo
	registered map[string]*NodeInfo
	gen        atomic.Uint64
	snapMu     sync.Mutex
	snap       atomic.Pointer[Snapshot]

	wmu     sync.Mutex
	pending map[writeKey]*pendingWrite

	synced     atomic.Bool
	syncedOnce sync.Once
	syncedCh   chan struct{}

	stats struct {
		decodes, decodeFailures, eventsQueued, eventsFiltered, cycles atomic.Uint64
		stamps, cleanups, writeErrors, skippedNotLeader               atomic.Uint64
	}
}

// nodeEntry is the cycle-owned state of one node.
type nodeEntry struct {
	name     string
	uid      types.UID
	selected bool
	cordon   string // the Node's hami.io/device-cordon
	vendors  []vendorEntry
	info     *NodeInfo
}

// vendorEntry is the cycle-owned state of one vendor on one node.
type vendorEntry struct {
	// Raw annotation values at the last decode; the decode is reused while they are equal.
	decoded          bool
	regRaw, scoreRaw string
	regOK, scoreOK   bool
	devices          []annotation.Device
	scores           []map[string]int // parallel to devices; nil without usable scores
	scoreErr         error
	decodeState      State
	decodeErr        error
	decodeReason     string
	hsInit, hsOK     bool
	hsRaw            string
	hs               handshake.Value
	allocatable      int64
	reported         int64
	zeroSince        time.Time // when a stamp was first decided with allocatable 0
	registered       bool
	state            State
	reason           string
	err              error
	everPresent      bool
}

// Stats are counters for tests, benchmarks and debugging.
type Stats struct {
	// Decodes counts register annotation decodes; DecodeFailures those that failed.
	Decodes, DecodeFailures uint64
	// EventsQueued counts Node updates that changed a relevant field; EventsFiltered those
	// dropped because nothing relevant changed.
	EventsQueued, EventsFiltered uint64
	// Cycles counts tick and term cycles.
	Cycles uint64
	// Stamps and Cleanups count successful handshake writes; WriteErrors failed ones.
	Stamps, Cleanups, WriteErrors uint64
	// SkippedNotLeader counts writes not made because this replica does not lead.
	SkippedNotLeader uint64
	// Nodes is the number of known nodes, Registered those with a registered vendor.
	Nodes, Registered uint64
	// PendingWrites is the number of handshake writes decided but not yet made.
	PendingWrites uint64
}

// New returns a cache over the Node informer nodes (from a shared informer factory; a factory
// with a label selector keeps other nodes out of memory). Unless opts.KeepNodeFields is set, it
// installs [TrimNode] as the informer's transform, so it must be called before the informer
// starts. New starts nothing: start the informer factory and call [Cache.Run]. The cache itself
// makes no API calls; handshake writes need a [Handshaker].
func New(nodes coreinformers.NodeInformer, opts Options) (*Cache, error) {
	if nodes == nil {
		return nil, fmt.Errorf("new schedcache: nil node informer: %w", ErrInvalidOptions)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("new schedcache: %w", err)
	}
	c := &Cache{
		informer:   nodes.Informer(),
		lister:     nodes.Lister(),
		opts:       opts,
		vendors:    slices.Clone(opts.Vendors),
		entries:    map[string]*nodeEntry{},
		interned:   map[string]string{},
		nodes:      map[string]*NodeInfo{},
		registered: map[string]*NodeInfo{},
		pending:    map[writeKey]*pendingWrite{},
		syncedCh:   make(chan struct{}),
	}
	c.counts = make([][]int, len(c.vendors))
	for i := range c.counts {
		c.counts[i] = make([]int, len(States()))
	}
	if !opts.KeepNodeFields {
		if err := c.informer.SetTransform(TrimNode); err != nil {
			return nil, fmt.Errorf("new schedcache: set node transform (set KeepNodeFields for a started informer): %w: %w", ErrInvalidOptions, err)
		}
	}
	if c.metrics, err = newMetrics(opts.Registerer, c.queueLen); err != nil {
		return nil, fmt.Errorf("new schedcache: %w", err)
	}
	return c, nil
}

// Run keeps the cache in step with the informer until ctx is done: it applies node events and
// re-evaluates handshakes every Tick, deciding the handshake writes that a running [Handshaker]
// makes. The informer must be started by the caller (before or after Run). Run returns nil on
// cancellation, after every goroutine it started has ended, and [ErrAlreadyRunning] when called
// twice.
func (c *Cache) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return fmt.Errorf("run schedcache: %w", ErrAlreadyRunning)
	}
	logger := klog.FromContext(ctx)
	selector := ""
	if c.opts.NodeSelector != nil {
		selector = c.opts.NodeSelector.String()
	}
	logger.Info("Using label selector for list nodes", "selector", selector)

	events := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{})
	c.qmu.Lock()
	c.events = events
	c.qmu.Unlock()
	defer c.synced.Store(false) // a stopped cache is no longer kept up to date
	defer events.ShutDown()

	reg, err := cache.NewTypedSharedIndexInformer[*corev1.Node](c.informer).AddTypedEventHandler(cache.TypedResourceEventHandlerFuncs[*corev1.Node]{
		AddFunc:    c.onAdd,
		UpdateFunc: c.onUpdate,
		DeleteFunc: c.onDelete,
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return fmt.Errorf("run schedcache: add node event handler: %w", err)
	}
	defer func() { _ = c.informer.RemoveEventHandler(reg) }()

	var wg sync.WaitGroup
	wg.Go(func() {
		<-ctx.Done()
		events.ShutDown()
	})
	wg.Go(func() { c.eventWorker(ctx, events) })
	c.cycleLoop(ctx, reg)
	wg.Wait()
	return nil
}

// cycleLoop waits for the informer, applies every node once, then runs the tick until ctx is
// done.
func (c *Cache) cycleLoop(ctx context.Context, reg cache.ResourceEventHandlerRegistration) {
	logger := klog.FromContext(ctx)
	// WaitFor is told of the sync (WaitForCacheSync polls every 100 ms), so readiness follows
	// the first list at once.
	if !cache.WaitFor(ctx, "", reg.HasSyncedChecker()) {
		return
	}
	c.fullSync(ctx)
	c.synced.Store(true)
	c.syncedOnce.Do(func() { close(c.syncedCh) })
	logger.V(2).Info("Node cache synced", "nodes", c.Stats().Nodes)

	ticker := c.opts.Clock.NewTicker(c.opts.Tick)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
			logger.V(5).Info("Ticker triggered")
			c.cycle(ctx)
		}
	}
}

// HasSynced reports whether the cache is in step with the informer: the informer synced, every
// node was applied once, and Run has not returned. It fits client-go's cache.InformerSynced.
func (c *Cache) HasSynced() bool { return c.synced.Load() }

// Synced returns a channel that is closed once the cache first synced (and never reopened), so
// that any number of goroutines can wait for readiness without polling; see also
// [Cache.WaitForSync].
func (c *Cache) Synced() <-chan struct{} { return c.syncedCh }

// WaitForSync blocks until the cache first synced and returns nil, or returns the cause of
// ctx's end when that comes first.
func (c *Cache) WaitForSync(ctx context.Context) error {
	select {
	case <-c.syncedCh:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for the node cache: %w", context.Cause(ctx))
	}
}

// Node returns the cache's view of one node, registered or not. The NodeInfo is immutable and
// shared. It never waits for handshake writes or decoding.
func (c *Cache) Node(name string) (*NodeInfo, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n, ok := c.nodes[name]
	return n, ok
}

// Snapshot returns a consistent view of every node the cache knows, registered or not, taken at
// one point in time. While nothing changes it returns the same *Snapshot without copying; after
// a change the first call copies the node set once. It never waits for handshake writes or
// decoding.
func (c *Cache) Snapshot() *Snapshot {
	if s := c.snap.Load(); s != nil && s.generation == c.gen.Load() {
		return s
	}
	c.snapMu.Lock()
	defer c.snapMu.Unlock()
	c.mu.RLock()
	gen := c.gen.Load()
	if s := c.snap.Load(); s != nil && s.generation == gen {
		c.mu.RUnlock()
		return s
	}
	nodes := maps.Clone(c.nodes)
	sorted := slices.SortedFunc(maps.Values(c.registered), func(a, b *NodeInfo) int { return strings.Compare(a.Name, b.Name) })
	c.mu.RUnlock()
	if nodes == nil {
		nodes = map[string]*NodeInfo{}
	}
	s := &Snapshot{generation: gen, nodes: nodes, sorted: sorted}
	c.snap.Store(s)
	return s
}

// Stats returns the cache's counters.
func (c *Cache) Stats() Stats {
	s := Stats{
		Decodes: c.stats.decodes.Load(), DecodeFailures: c.stats.decodeFailures.Load(),
		EventsQueued: c.stats.eventsQueued.Load(), EventsFiltered: c.stats.eventsFiltered.Load(),
		Cycles: c.stats.cycles.Load(), Stamps: c.stats.stamps.Load(), Cleanups: c.stats.cleanups.Load(),
		WriteErrors: c.stats.writeErrors.Load(), SkippedNotLeader: c.stats.skippedNotLeader.Load(),
	}
	c.mu.RLock()
	s.Nodes, s.Registered = uint64(len(c.nodes)), uint64(len(c.registered))
	c.mu.RUnlock()
	c.wmu.Lock()
	for _, w := range c.pending {
		if !w.done {
			s.PendingWrites++
		}
	}
	c.wmu.Unlock()
	return s
}

func (c *Cache) queueLen(name string) float64 {
	c.qmu.RLock()
	defer c.qmu.RUnlock()
	switch {
	case name == "events" && c.events != nil:
		return float64(c.events.Len())
	case name == "writes" && c.writer != nil:
		return float64(c.writer.queue.Len())
	}
	return 0
}

// --- events ---

func (c *Cache) enqueue(name string) {
	c.qmu.RLock()
	q := c.events
	c.qmu.RUnlock()
	if q != nil {
		q.Add(name)
	}
}

func (c *Cache) onAdd(n *corev1.Node) {
	c.stats.eventsQueued.Add(1)
	c.enqueue(n.Name)
}

func (c *Cache) onUpdate(o, n *corev1.Node) {
	if !c.relevantChange(o, n) {
		c.stats.eventsFiltered.Add(1)
		return
	}
	c.stats.eventsQueued.Add(1)
	c.enqueue(n.Name)
}

// onDelete also receives the informer's tombstones (DeletedFinalStateUnknown, possibly
// without an object): the key is what the cache goes by.
func (c *Cache) onDelete(obj cache.DeletedObject[*corev1.Node]) {
	key := obj.GetKey()
	if key == "" {
		return
	}
	c.stats.eventsQueued.Add(1)
	c.enqueue(key)
}

// relevantChange reports whether an update touches what the cache reads: the vendors' register,
// score and handshake annotations, their allocatable counts, hami.io/device-cordon, the labels
// the selector reads, or the node's identity.
func (c *Cache) relevantChange(o, n *corev1.Node) bool {
	if o == n {
		return false
	}
	if o.UID != n.UID {
		return true
	}
	if c.opts.NodeSelector != nil && c.opts.NodeSelector.Matches(labels.Set(o.Labels)) != c.opts.NodeSelector.Matches(labels.Set(n.Labels)) {
		return true
	}
	if annotationChanged(o, n, allocation.KeyDeviceCordon) {
		return true
	}
	for i := range c.vendors {
		v := &c.vendors[i]
		if annotationChanged(o, n, v.RegisterKey) || annotationChanged(o, n, v.HandshakeKey) ||
			(v.ScoreKey != "" && annotationChanged(o, n, v.ScoreKey)) ||
			allocatable(o, v.ResourceName) != allocatable(n, v.ResourceName) {
			return true
		}
	}
	return false
}

func annotationChanged(o, n *corev1.Node, key string) bool {
	a, okA := o.Annotations[key]
	b, okB := n.Annotations[key]
	return okA != okB || a != b
}

func allocatable(n *corev1.Node, resource string) int64 {
	q, ok := n.Status.Allocatable[corev1.ResourceName(resource)]
	if !ok {
		return 0
	}
	return q.Value()
}

func (c *Cache) eventWorker(ctx context.Context, q workqueue.TypedInterface[string]) {
	for {
		name, shutdown := q.Get()
		if shutdown {
			return
		}
		c.reconcile(ctx, name)
		q.Done(name)
	}
}

// reconcile applies the lister's current Node (never the event's object) to the cache.
func (c *Cache) reconcile(ctx context.Context, name string) {
	node, err := c.lister.Get(name)
	c.cycleMu.Lock()
	defer c.cycleMu.Unlock()
	if err != nil {
		if apierrors.IsNotFound(err) {
			c.forget(ctx, name)
		}
		return
	}
	c.apply(ctx, node)
}

// fullSync applies every node the lister holds and forgets the ones it no longer holds.
func (c *Cache) fullSync(ctx context.Context) {
	nodes, err := c.lister.List(labels.Everything())
	if err != nil {
		klog.FromContext(ctx).Error(err, "Failed to list nodes with selector")
		return
	}
	c.cycleMu.Lock()
	defer c.cycleMu.Unlock()
	seen := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		seen[n.Name] = true
		c.apply(ctx, n)
	}
	for name := range c.entries {
		if !seen[name] {
			c.forget(ctx, name)
		}
	}
}

// cycle re-evaluates every node's handshakes at the current time without decoding anything.
func (c *Cache) cycle(ctx context.Context) {
	logger := klog.FromContext(ctx)
	c.cycleMu.Lock()
	defer c.cycleMu.Unlock()
	c.stats.cycles.Add(1)
	v5 := logger.V(5)
	if v5.Enabled() {
		v5.Info("Listed nodes", "nodeCount", len(c.entries))
	}
	now := c.opts.Clock.Now()
	for _, e := range c.entries {
		if v5.Enabled() {
			v5.Info("Processing node", "nodeName", e.name)
		}
		if !e.selected {
			continue
		}
		changed := false
		for i := range c.vendors {
			if e.vendors[i].decodeErr == nil && c.evaluate(ctx, e, i, now, false) {
				changed = true
			}
		}
		if changed {
			c.publish(e)
		}
	}
}

// forget removes a deleted node.
func (c *Cache) forget(ctx context.Context, name string) {
	e, ok := c.entries[name]
	if !ok {
		return
	}
	klog.FromContext(ctx).V(2).Info("Removing node from nodeManager", "nodeName", name)
	delete(c.entries, name)
	for i := range c.vendors {
		c.setCount(i, e.vendors[i].state, stateNone)
		c.dropPending(writeKey{node: name, vendor: i})
	}
	c.mu.Lock()
	delete(c.nodes, name)
	delete(c.registered, name)
	c.gen.Add(1)
	c.mu.Unlock()
}

// apply brings one node's entry up to date with the Node object.
func (c *Cache) apply(ctx context.Context, node *corev1.Node) {
	logger := klog.FromContext(ctx)
	if v5 := logger.V(5); v5.Enabled() {
		v5.Info("Processing node", "nodeName", node.Name)
	}
	e := c.entries[node.Name]
	if e == nil || e.uid != node.UID {
		if e != nil {
			c.forget(ctx, node.Name)
		}
		e = &nodeEntry{name: node.Name, uid: node.UID, vendors: make([]vendorEntry, len(c.vendors))}
		for i := range e.vendors {
			e.vendors[i].state = stateNone
		}
		c.entries[node.Name] = e
	}
	e.selected = c.opts.NodeSelector == nil || c.opts.NodeSelector.Matches(labels.Set(node.Labels))
	e.cordon = node.Annotations[allocation.KeyDeviceCordon]
	now := c.opts.Clock.Now()
	for i := range c.vendors {
		c.applyVendor(ctx, e, i, node, now)
	}
	c.publish(e)
}

func (c *Cache) applyVendor(ctx context.Context, e *nodeEntry, i int, node *corev1.Node, now time.Time) {
	v := &c.vendors[i]
	ve := &e.vendors[i]
	if !e.selected {
		if ve.registered {
			klog.FromContext(ctx).V(2).Info("Node no longer matches the selector, removing its devices", "node", klog.KObj(node), "deviceVendor", v.Name)
		}
		*ve = vendorEntry{state: ve.state, everPresent: ve.everPresent}
		c.dropPending(writeKey{node: e.name, vendor: i})
		c.setState(ctx, e, i, StateExcluded, ErrExcluded.Error(), ErrExcluded)
		return
	}
	regRaw, regOK := node.Annotations[v.RegisterKey]
	var scoreRaw string
	var scoreOK bool
	if v.ScoreKey != "" {
		scoreRaw, scoreOK = node.Annotations[v.ScoreKey]
	}
	changed := !ve.decoded || regOK != ve.regOK || regRaw != ve.regRaw || scoreOK != ve.scoreOK || scoreRaw != ve.scoreRaw
	if changed {
		c.decode(ctx, e, i, node, regRaw, regOK)
	}
	// Equal strings: point at the informer's current copy so the old object can be freed.
	ve.regRaw, ve.regOK, ve.scoreRaw, ve.scoreOK = regRaw, regOK, scoreRaw, scoreOK

	hsRaw, hsOK := node.Annotations[v.HandshakeKey]
	if !ve.hsInit || hsOK != ve.hsOK || hsRaw != ve.hsRaw {
		ve.hs = handshake.Parse(hsRaw, hsOK, c.opts.Handshake.Location)
		ve.hsInit = true
	}
	ve.hsRaw, ve.hsOK, ve.hs.Raw = hsRaw, hsOK, hsRaw
	ve.allocatable = allocatable(node, v.ResourceName)
	c.evaluate(ctx, e, i, now, changed)
}

// decode decodes a changed register annotation and logs and records what HAMi would.
func (c *Cache) decode(ctx context.Context, e *nodeEntry, i int, node *corev1.Node, raw string, present bool) {
	logger := klog.FromContext(ctx)
	v := &c.vendors[i]
	ve := &e.vendors[i]
	c.stats.decodes.Add(1)
	// The devices decide the registration alone: a score annotation that does not decode
	// costs the node its scores, not its devices (HAMi's scheduler drops the node).
	devicesOnly := *v
	devicesOnly.ScoreKey = ""
	verdict := annotation.Check(devicesOnly, node.Annotations)
	wasPresent := ve.everPresent
	ve.decoded = true
	ve.everPresent = ve.everPresent || present
	ve.devices, ve.decodeErr, ve.decodeReason = nil, nil, ""
	ve.scores, ve.scoreErr = nil, nil
	if verdict.Registers {
		ve.devices, ve.decodeState = c.compact(verdict.Devices), StateRegistered
		c.decodeScores(ctx, e, i, node)
		return
	}
	ve.decodeErr = verdict.Err
	ve.decodeReason = verdict.Err.Error()
	switch {
	case errors.Is(verdict.Err, annotation.ErrAbsent):
		ve.decodeState = StateAbsent
		logger.V(5).Info("Failed to get node devices", "nodeName", node.Name, "deviceVendor", v.Name, "err", verdict.Err)
		if wasPresent {
			c.warn(e, ReasonRegisterRemoved, "%s register annotation %s was removed: the node's %s devices are no longer schedulable", v.Name, v.RegisterKey, v.Name)
		}
		return
	case errors.Is(verdict.Err, annotation.ErrNoDevices):
		ve.decodeState = StateNoDevices
		msg := cmp.Or(verdict.HAMiLog, "no "+v.Name+" device found")
		logger.Info(msg, "node", klog.KObj(node), "deviceAnnotation", raw)
		c.warn(e, ReasonRegisterEmpty, "%s register annotation %s lists no devices (%q): the node has no schedulable %s devices", v.Name, v.RegisterKey, truncate(raw), v.Name)
	case errors.Is(verdict.Err, annotation.ErrInvalidElement):
		ve.decodeState = StateInvalidElement
		logger.Error(verdict.Err, "failed to decode node devices", "node", klog.KObj(node), "deviceAnnotation", truncate(raw))
		c.warn(e, ReasonRegisterInvalid, "%s register annotation %s holds an invalid device (HAMi's scheduler would crash on it); devices removed from scheduling: %v", v.Name, v.RegisterKey, verdict.Err)
	default:
		ve.decodeState = StateMalformed
		msg := cmp.Or(verdict.HAMiLog, "failed to decode node devices")
		logger.Error(verdict.Err, msg, "node", klog.KObj(node), "deviceAnnotation", truncate(raw))
		c.warn(e, ReasonRegisterMalformed, "%s register annotation does not decode; devices removed from scheduling: %v", v.Name, verdict.Err)
	}
	c.stats.decodeFailures.Add(1)
	c.metrics.decodeFailure(v.Name, ve.decodeState)
}

// decodeScores decodes the topology score annotation of a node whose devices registered, and
// logs and records a Warning Event once per value that does not decode (decode runs only when
// an annotation changed).
func (c *Cache) decodeScores(ctx context.Context, e *nodeEntry, i int, node *corev1.Node) {
	v := &c.vendors[i]
	ve := &e.vendors[i]
	if v.ScoreKey == "" {
		return
	}
	raw, ok := node.Annotations[v.ScoreKey]
	if !ok {
		return
	}
	scores, err := annotation.DecodePairScores(raw)
	if err != nil {
		ve.scoreErr = err
		klog.FromContext(ctx).Error(err, "failed to decode pair scores; the node stays registered without topology scores",
			"node", klog.KObj(node), "deviceVendor", v.Name, "scoreAnnotation", truncate(raw))
		c.warn(e, ReasonScoreMalformed, "%s topology score annotation %s does not decode; the node's devices stay schedulable, "+
			"topology-aware placement treats every pair as unscored: %v", v.Name, v.ScoreKey, err)
		c.stats.decodeFailures.Add(1)
		return
	}
	ve.scores = annotation.ScoresByDevice(ve.devices, scores)
}

// maxInterned bounds the strings shared between nodes' devices (models, modes, MIG profile
// names): a cluster has a handful; a hostile annotation must not grow the table.
const maxInterned = 1024

// compact makes decoded devices independent of the annotation string they were decoded from
// (the decoder returns substrings of it, which would pin every replaced Node's annotation),
// and shares the strings that repeat across GPUs and nodes.
func (c *Cache) compact(devs []annotation.Device) []annotation.Device {
	for i := range devs {
		d := &devs[i]
		d.ID = strings.Clone(d.ID)
		d.Type, d.Mode = c.intern(d.Type), c.intern(d.Mode)
		for j := range d.MIGProfiles {
			d.MIGProfiles[j].Name = c.intern(d.MIGProfiles[j].Name)
		}
	}
	return devs
}

func (c *Cache) intern(s string) string {
	if v, ok := c.interned[s]; ok {
		return v
	}
	s = strings.Clone(s)
	if len(c.interned) < maxInterned {
		c.interned[s] = s
	}
	return s
}

// truncate shortens an annotation value for logs and Events.
func truncate(s string) string {
	const limit = 256
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "…"
}

// evaluate makes the handshake decision for one decoded vendor of one node and derives its
// state; it reports whether the state changed. It allocates nothing while nothing changes.
func (c *Cache) evaluate(ctx context.Context, e *nodeEntry, i int, now time.Time, registerChanged bool) bool {
	ve := &e.vendors[i]
	k := writeKey{node: e.name, vendor: i}
	if ve.decodeErr != nil {
		if ve.registered {
			klog.FromContext(ctx).V(2).Info("Removing device from node", "nodeName", e.name, "deviceVendor", c.vendors[i].Name, "reason", ve.decodeReason)
		}
		ve.registered = false
		c.dropPending(k)
		return c.setState(ctx, e, i, ve.decodeState, ve.decodeReason, ve.decodeErr)
	}
	d := handshake.Decide(handshake.Input{
		Handshake: ve.hs, Allocatable: ve.allocatable, Reported: ve.reported,
		RegisterChanged: registerChanged, Registered: ve.registered, Now: now,
	}, c.opts.Handshake)
	ve.reported = d.Reported
	// Decide keeps a node with allocatable 0 out when it stamps; the stamp must not bring it
	// back once it is seen fresh either: the node stays out until allocatable returns (§13.13).
	// A stamp is recognised by its time: not before this cache first decided to stamp the node
	// with allocatable 0, so the leader's stamp counts on followers too.
	switch {
	case ve.allocatable > 0:
		ve.zeroSince = time.Time{}
	case d.Action == handshake.ActionStamp && ve.zeroSince.IsZero():
		ve.zeroSince = now.Truncate(time.Second)
	case d.Healthy && !ve.registered && !ve.zeroSince.IsZero() && ve.hs.State == handshake.StateRequesting &&
		ve.hs.TimeOK && !ve.hs.Time.Before(ve.zeroSince):
		d.Healthy = false
		d.Reason = "handshake stamped while allocatable is 0: the node is not added until allocatable returns"
	}
	switch d.Action {
	case handshake.ActionNone:
		c.dropPending(k)
	case handshake.ActionStamp:
		c.want(ctx, k, pendingWrite{action: handshake.ActionStamp, value: d.NewValue, basisRaw: ve.hsRaw, basisOK: ve.hsOK})
	case handshake.ActionCleanup:
		klog.FromContext(ctx).Error(nil, "Device is unhealthy, cleaning up node", "nodeName", e.name, "deviceVendor", c.vendors[i].Name, "reason", d.Reason)
		c.warn(e, ReasonDeviceUnhealthy, "%s devices removed from scheduling: %s", c.vendors[i].Name, d.Reason)
		c.want(ctx, k, pendingWrite{action: handshake.ActionCleanup, value: d.NewValue, delete: d.Delete, basisRaw: ve.hsRaw, basisOK: ve.hsOK})
	}
	ve.registered = d.Healthy
	if d.Healthy {
		return c.setState(ctx, e, i, StateRegistered, d.Reason, nil)
	}
	return c.setState(ctx, e, i, StateUnhealthy, d.Reason, ErrUnhealthy)
}

// setState records a vendor's state, keeping the per-state counts, and reports whether what
// readers see of it changed.
func (c *Cache) setState(ctx context.Context, e *nodeEntry, i int, s State, reason string, err error) bool {
	ve := &e.vendors[i]
	changed := ve.state != s || ve.reason != reason || ve.err != err //nolint:errorlint // identity
	if ve.state != s {
		if s != StateExcluded || ve.state != stateNone {
			klog.FromContext(ctx).V(3).Info("Registration state changed", "nodeName", e.name, "deviceVendor", c.vendors[i].Name,
				"from", ve.state.String(), "to", s.String(), "reason", reason)
		}
		c.setCount(i, ve.state, s)
		ve.state = s
	}
	ve.reason, ve.err = reason, err
	return changed
}

func (c *Cache) setCount(i int, from, to State) {
	if from == to {
		return
	}
	if from != stateNone {
		c.counts[i][from]--
		c.metrics.setNodes(c.vendors[i].Name, from, c.counts[i][from])
	}
	if to != stateNone {
		c.counts[i][to]++
		c.metrics.setNodes(c.vendors[i].Name, to, c.counts[i][to])
	}
}

// registration is what readers see of vendor i on entry e.
func (c *Cache) registration(e *nodeEntry, i int) Registration {
	ve := &e.vendors[i]
	r := Registration{Vendor: c.vendors[i].Name, State: ve.state, Reason: ve.reason, Err: ve.err,
		Allocatable: ve.allocatable, Handshake: ve.hsRaw}
	if ve.state == StateRegistered {
		r.Devices, r.PairScores = ve.devices, ve.scores
	}
	r.ScoreErr = ve.scoreErr
	return r
}

// publish makes an entry's current state visible to readers if it changed.
func (c *Cache) publish(e *nodeEntry) {
	if e.info != nil {
		same := e.info.Cordon == e.cordon
		for i := range c.vendors {
			r := c.registration(e, i)
			if !r.equal(&e.info.Registrations[i]) {
				same = false
				break
			}
		}
		if same {
			return
		}
	}
	info := &NodeInfo{Name: e.name, UID: e.uid, Cordon: e.cordon, Registrations: make([]Registration, len(c.vendors))}
	for i := range c.vendors {
		info.Registrations[i] = c.registration(e, i)
	}
	e.info = info
	c.mu.Lock()
	c.nodes[e.name] = info
	if info.Registered() {
		c.registered[e.name] = info
	} else {
		delete(c.registered, e.name)
	}
	c.gen.Add(1)
	c.mu.Unlock()
}

// warn records a Warning Event on the node, if a recorder was given.
func (c *Cache) warn(e *nodeEntry, reason, format string, args ...any) {
	if c.opts.EventRecorder == nil {
		return
	}
	ref := &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: e.name, UID: e.uid}
	c.opts.EventRecorder.Eventf(ref, corev1.EventTypeWarning, reason, format, args...)
}
