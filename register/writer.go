package register

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
)

// Defaults of [Options].
const (
	// DefaultRetryInitial is the first retry delay after a failed sync.
	DefaultRetryInitial = time.Second
	// DefaultRetryMax caps the retry delay; HAMi retries every 5 s.
	DefaultRetryMax = 5 * time.Second
)

const (
	// FieldManager is the field manager named in the Writer's patches, so that
	// metadata.managedFields tells who wrote the annotation.
	FieldManager = "hamireg-register"
	// EventReasonFailed is the reason of the Warning Event recorded on the Node when a write
	// fails (kubectl describe node shows it).
	EventReasonFailed = "FailedRegisterAnnotation"
	// EventComponent is the source component of Events sent by the Writer's own broadcaster.
	EventComponent = "hamireg-register"
)

// maxEventMessage bounds the Event message (error messages from the API can be long).
const maxEventMessage = 1024

// Options configure a [Writer]. The zero value means the defaults documented on each field.
type Options struct {
	// Vendor selects the annotation key (Vendor.RegisterKey). Default: annotation.NVIDIA(),
	// key hami.io/node-nvidia-register. The vendor's format must be annotation.FormatJSON or,
	// for Hygon DCU and Iluvatar, annotation.FormatLegacy (written with
	// annotation.EncodeLegacy, which has no escaping: IDs and types must not contain ',' or ':').
	Vendor annotation.Vendor
	// Shape selects the wire shape. Default: annotation.ShapeMaster (HAMi master);
	// annotation.ShapeV290 writes HAMi v2.9.0's "devicepairscore":{}.
	Shape annotation.Shape
	// RetryInitial is the delay before the first retry of a failed sync; each further
	// failure doubles it up to RetryMax. Default: [DefaultRetryInitial] (1 s).
	RetryInitial time.Duration
	// RetryMax caps the retry delay. Default: [DefaultRetryMax] (5 s, HAMi's retry period).
	RetryMax time.Duration
	// Clock is the time source of Run's timers. Default: clock.RealClock{}.
	Clock clock.WithTicker
	// EventRecorder records the Warning Event [EventReasonFailed] on the Node when a write
	// fails. Default (nil): while Run runs, Events go through a broadcaster of Run's own to the
	// client's core/v1 Events API (source component [EventComponent]), stopped when Run
	// returns; Sync called outside Run then records none. To record none at all, pass a
	// recorder that drops them, such as &record.FakeRecorder{}.
	EventRecorder record.EventRecorder
	// Registerer, if set, receives the counters hamireg_register_writes_total,
	// hamireg_register_heals_total, hamireg_register_noops_total and
	// hamireg_register_failures_total{reason}, labelled with the vendor. Default: no metrics.
	Registerer prometheus.Registerer
}

// Stats are a Writer's counters since New, for tests and readiness checks.
type Stats struct {
	// Writes counts patches the API server accepted.
	Writes uint64
	// Heals counts the writes that restored a value this Writer had written and someone else
	// then edited or deleted (included in Writes).
	Heals uint64
	// NoOps counts syncs that found the annotation already right and sent nothing.
	NoOps uint64
	// Failures counts failed syncs (missing Node, API errors).
	Failures uint64
	// LastError is the error of the last sync, nil when it succeeded.
	LastError error
}

// Writer keeps one vendor's register annotation on one Node equal to the devices last given
// to [Writer.SetDevices]. See the package documentation for the behaviour; create it with
// [New].
type Writer struct {
	client   kubernetes.Interface
	node     string
	key      string
	scoreKey string // the vendor's topology score key; "" when it has none
	shape    annotation.Shape
	format   annotation.Format
	retryMin time.Duration
	retryMax time.Duration
	clock    clock.WithTicker
	recorder record.EventRecorder // from Options; may be nil
	metrics  *metrics             // nil without a Registerer

	running atomic.Bool
	// kick wakes Run for an immediate sync: new devices, drift seen on the watch, the Node
	// appearing. Capacity 1: requests coalesce.
	kick chan struct{}
	// desired is the encoded value of the devices last set, nil before the first SetDevices.
	desired atomic.Pointer[desiredValue]
	// setMu serialises SetDevices and SetCordon, which both build the next desired value;
	// it guards cordon, the UUIDs of the last SetCordon (sorted), nil before the first.
	setMu  sync.Mutex
	cordon *[]string
	// syncMu guards syncCh, closed and replaced after every sync and every SetDevices.
	syncMu sync.Mutex
	syncCh chan struct{}
	// expect is the value this Writer wrote last, or is writing now; the watch handler
	// ignores changes to it (they are the echo of its own write).
	expect atomic.Pointer[string]
	// writtenRV is the resourceVersion the API server gave the Node in answer to the last
	// successful patch. A copy of the Node from the watch with an older resourceVersion
	// predates that write: its value of the key is stale (see staleCopy).
	writtenRV atomic.Pointer[string]

	// mu serialises syncs and guards the fields below.
	mu sync.Mutex
	// written is the value of the last successful write or of a sync that found it in
	// place; nil before the first. Stored under mu; read anywhere.
	written atomic.Pointer[string]
	// store is the informer's cache of the Node while Run runs (nil otherwise: Sync GETs).
	store cache.Store
	// activeRecorder is recorder, or Run's own while Run runs; nil records nothing.
	activeRecorder record.EventRecorder

	// liveStore is store, readable without waiting for a sync in flight (Node).
	storeMu   sync.RWMutex
	liveStore cache.Store

	statsMu sync.Mutex
	stats   Stats
}

// desiredValue is the annotation value of a device list and how many devices it holds, and
// the topology score annotation value when the Writer manages it (hasScores).
type desiredValue struct {
	value     string
	scores    string
	hasScores bool
	n         int
	// hasCordon is set once SetCordon was called: cordon (sorted, trimmed, no duplicates)
	// are the UUIDs the Writer keeps in hami.io/device-cordon and records in CordonKey.
	hasCordon bool
	cordon    []string
	// base is state without the cordon part.
	base string
	// state is what observed gives for a Node that carries exactly this value.
	state string
}

// withCordon returns a copy of d that keeps cordon (nil: the Writer does not manage the
// cordon annotations).
func (d desiredValue) withCordon(cordon *[]string) *desiredValue {
	d.state, d.hasCordon, d.cordon = d.base, false, nil
	if cordon != nil {
		d.hasCordon, d.cordon = true, *cordon
		d.state = d.base + cordonSep + strings.Join(d.cordon, ",")
	}
	return &d
}

// absentScore stands for a missing score annotation in an observed state.
const absentScore = "\x01"

// observed is the state of a Node's annotations that the Writer compares with what it wants:
// the register value, followed by the score value when d manages the score annotation and the
// cordon part when it manages hami.io/device-cordon. present is whether the register annotation
// is there.
func (w *Writer) observed(annotations map[string]string, d *desiredValue) (state string, present bool) {
	reg, ok := annotations[w.key]
	if d == nil {
		return reg, ok
	}
	state = reg
	if d.hasScores {
		sc, sok := annotations[w.scoreKey]
		if !sok {
			sc = absentScore
		}
		state += "\x00" + sc
	}
	if d.hasCordon {
		state += cordonSep + observedCordon(annotations, d.cordon)
	}
	return state, ok
}

// cordonSep starts the cordon part of a state.
const cordonSep = "\x00cordon\x00"

// observedCordon is the cordon part of the state of a Node: the Writer's UUIDs joined when the
// Node's hami.io/device-cordon holds the UUIDs the Writer keeps for mine (in any order: an
// operator may have added some anywhere) and CordonKey records mine, else the two raw values,
// which no desired state equals.
func observedCordon(annotations map[string]string, mine []string) string {
	recorded, rok := annotations[CordonKey]
	if slices.Equal(splitCordon(recorded), mine) && (rok || len(mine) == 0) &&
		sameSet(splitCordon(annotations[allocation.KeyDeviceCordon]), mergeCordon(annotations, mine)) {
		return strings.Join(mine, ",")
	}
	return "\x02" + annotations[allocation.KeyDeviceCordon] + "\x03" + recorded
}

// sameSet reports whether a and b hold the same strings, ignoring order and repeats.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

// splitCordon parses a comma list of UUIDs as HAMi does: entries trimmed, empty ones dropped.
func splitCordon(value string) []string {
	var out []string
	for id := range strings.SplitSeq(value, ",") {
		if id = strings.TrimSpace(id); id != "" {
			out = append(out, id)
		}
	}
	return out
}

// normalCordon sorts uuids, trims them and drops empty entries and duplicates.
func normalCordon(uuids []string) []string {
	out := make([]string, 0, len(uuids))
	for _, u := range uuids {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// mergeCordon is the hami.io/device-cordon the Writer keeps on a Node with annotations: the
// operator's entries (those the Node's CordonKey does not record as the Writer's), in their
// order, then mine, sorted. A UUID both name appears once, as the Writer's.
func mergeCordon(annotations map[string]string, mine []string) []string {
	ours := map[string]bool{}
	for _, u := range splitCordon(annotations[CordonKey]) {
		ours[u] = true
	}
	for _, u := range mine {
		ours[u] = true
	}
	var out []string
	seen := map[string]bool{}
	for _, u := range splitCordon(annotations[allocation.KeyDeviceCordon]) {
		if !ours[u] && !seen[u] {
			seen[u] = true
			out = append(out, u)
		}
	}
	return append(out, mine...)
}

// nullable is value as a merge-patch value: null (remove the key) when empty.
func nullable(value string) any {
	if value == "" {
		return nil
	}
	return value
}

// New returns a Writer of the register annotation of node nodeName, which writes nothing until
// the first [Writer.SetDevices]. It validates its arguments and returns an error wrapping
// [ErrNoNodeName], [ErrInvalidNodeName] or [ErrInvalidOptions]; it starts nothing and sends no
// request. client needs the RBAC permissions listed in the package documentation.
func New(client kubernetes.Interface, nodeName string, opts Options) (*Writer, error) {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("new register writer: "+format+": %w", append(args, ErrInvalidOptions)...)
	}
	if client == nil {
		return nil, invalid("nil client")
	}
	if err := validateNodeName(nodeName); err != nil {
		return nil, fmt.Errorf("new register writer: %w", err)
	}
	vendor := cmp.Or(opts.Vendor, annotation.NVIDIA())
	if err := vendor.Validate(annotation.PartRegister); err != nil {
		return nil, fmt.Errorf("new register writer: %w", invalidVendorError{err})
	}
	if opts.Shape != annotation.ShapeMaster && opts.Shape != annotation.ShapeV290 {
		return nil, invalid("unknown shape %d", int(opts.Shape))
	}
	w := &Writer{
		client:   client,
		node:     nodeName,
		key:      vendor.RegisterKey,
		scoreKey: vendor.ScoreKey,
		format:   vendor.Format,
		shape:    opts.Shape,
		retryMin: opts.RetryInitial,
		retryMax: opts.RetryMax,
		clock:    opts.Clock,
		recorder: opts.EventRecorder,
		kick:     make(chan struct{}, 1),
		syncCh:   make(chan struct{}),
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{{"RetryInitial", &w.retryMin, DefaultRetryInitial}, {"RetryMax", &w.retryMax, DefaultRetryMax}} {
		if *d.v < 0 {
			return nil, invalid("negative %s %v", d.name, *d.v)
		}
		*d.v = cmp.Or(*d.v, d.def)
	}
	if w.retryMin > w.retryMax {
		return nil, invalid("RetryInitial %v exceeds RetryMax %v", w.retryMin, w.retryMax)
	}
	if w.clock == nil {
		w.clock = clock.RealClock{}
	}
	w.activeRecorder = w.recorder
	label := cmp.Or(vendor.Name, vendor.RegisterKey)
	m, err := newMetrics(opts.Registerer, label)
	if err != nil {
		return nil, fmt.Errorf("new register writer: %w", err)
	}
	w.metrics = m
	return w, nil
}

// NodeName returns the name of the Node the Writer writes to.
func (w *Writer) NodeName() string { return w.node }

// Key returns the annotation key the Writer writes.
func (w *Writer) Key() string { return w.key }

// SetDevices sets the devices the annotation must carry, in any order (they are written in
// canonical order), and makes a running [Writer.Run] sync at once. It never blocks on the API
// server; devices set while a write is in flight are written right after it. An unchanged
// device list sends nothing, and while writes fail it does not cut the retry backoff short.
func (w *Writer) SetDevices(devices []annotation.Device) {
	w.set(devices, nil, false)
}

// SetDevicesAndScores is [Writer.SetDevices] that also writes the topology score annotation
// (the vendor's ScoreKey, hami.io/node-nvidia-score) in the same merge patch, as HAMi's device
// plugin does with ENABLE_TOPOLOGY_SCORE=true: scores are encoded with
// annotation.EncodePairScores in the order of the written devices (entries for other UUIDs
// follow in the order given). The two values are written, checked and restored together.
// A later SetDevices stops managing the score annotation and leaves it as it is on the Node
// (as HAMi, which never removes it). For a vendor without a ScoreKey it is SetDevices.
func (w *Writer) SetDevicesAndScores(devices []annotation.Device, scores []annotation.PairScore) {
	w.set(devices, scores, w.scoreKey != "")
}

func (w *Writer) set(devices []annotation.Device, scores []annotation.PairScore, withScores bool) {
	devs := annotation.Canonical(devices)
	value := annotation.EncodeShape(devs, w.shape)
	if w.format == annotation.FormatLegacy {
		value = annotation.EncodeLegacy(devs)
	}
	base := desiredValue{value: value, n: len(devs), base: value}
	if withScores {
		base.hasScores = true
		base.scores = annotation.EncodePairScores(inDeviceOrder(devs, scores))
		base.base = value + "\x00" + base.scores
	}
	w.setMu.Lock()
	next := base.withCordon(w.cordon)
	prev := w.desired.Swap(next)
	w.setMu.Unlock()
	w.publish(prev, next)
}

// publish tells WaitForSync and Run of a new desired value that replaced prev.
func (w *Writer) publish(prev, next *desiredValue) {
	w.notifySync()
	if prev != nil && prev.state == next.state && w.Stats().LastError != nil {
		return // unchanged while failing: the retry backoff decides when to try again
	}
	w.wake()
}

// inDeviceOrder orders scores as devs, entries of other UUIDs after them in their order.
func inDeviceOrder(devs []annotation.Device, scores []annotation.PairScore) []annotation.PairScore {
	out := make([]annotation.PairScore, 0, len(scores))
	used := make([]bool, len(scores))
	for _, d := range devs {
		for i, s := range scores {
			if !used[i] && s.UUID == d.ID {
				out = append(out, s)
				used[i] = true
				break
			}
		}
	}
	for i, s := range scores {
		if !used[i] {
			out = append(out, s)
		}
	}
	return out
}

// wake makes Run sync now; requests made while a sync is pending coalesce into one.
func (w *Writer) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// notifySync closes and replaces syncCh: WaitForSync looks again.
func (w *Writer) notifySync() {
	w.syncMu.Lock()
	close(w.syncCh)
	w.syncCh = make(chan struct{})
	w.syncMu.Unlock()
}

// CordonKey is the Node annotation where the writer records which UUIDs of
// hami.io/device-cordon it added ([Writer.SetCordon]), so that it removes only its own and
// keeps an operator's.
const CordonKey = allocation.KeyAgentDeviceCordon

// SetCordon makes the writer keep the GPUs uuids in the Node's hami.io/device-cordon
// (HAMi master's extender then gives them no new pods), beside any UUIDs an operator put
// there, in the same merge patch as the register annotation; the UUIDs it added are recorded
// in [CordonKey]. SetCordon(nil) removes the writer's UUIDs and keeps the operator's.
//
// The Node then carries, in hami.io/device-cordon, the operator's entries first (those not
// recorded in CordonKey), in their order, and then uuids sorted, as one comma list; CordonKey
// holds uuids sorted. Either annotation is removed when it would be empty. An operator who
// adds or removes entries of their own is left alone; an entry of the writer's that someone
// removes, or a changed CordonKey, is restored like the register annotation. A UUID both the
// operator and the writer name counts as the writer's: it goes when the writer drops it.
// Like SetDevices, SetCordon never blocks, an unchanged list sends nothing, and nothing is
// written before the first SetDevices. A Writer that is never given SetCordon leaves both
// annotations alone.
func (w *Writer) SetCordon(uuids []string) {
	c := normalCordon(uuids)
	w.setMu.Lock()
	w.cordon = &c
	prev := w.desired.Load()
	if prev == nil {
		w.setMu.Unlock()
		return
	}
	next := prev.withCordon(w.cordon)
	w.desired.Store(next)
	w.setMu.Unlock()
	w.publish(prev, next)
}

// InSync reports whether the Node carried the devices last given to [Writer.SetDevices] at
// the Writer's last sync: written by it, or found in place. It is false before the first
// SetDevices and again after each SetDevices with a new device list until it is written.
func (w *Writer) InSync() bool {
	d, wr := w.desired.Load(), w.written.Load()
	return d != nil && wr != nil && d.state == *wr
}

// WaitForSync blocks until [Writer.InSync] is true (the Node carries the devices last set) or
// ctx ends, and then returns context.Cause(ctx). It does not poll: every sync and every
// SetDevices wakes it. A node program calls it before it registers with the kubelet, so that
// the scheduler learns a node's devices before the node's device count.
func (w *Writer) WaitForSync(ctx context.Context) error {
	for {
		w.syncMu.Lock()
		ch := w.syncCh
		w.syncMu.Unlock()
		if w.InSync() {
			return nil
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-ch:
		}
	}
}

// Node returns the copy of the Node from Run's watch, nil while Run is not running or the
// Node has not been listed (or does not exist). It costs no request; the copy is shared and
// read-only, and may lag the API server by the watch's latency.
func (w *Writer) Node() *corev1.Node {
	w.storeMu.RLock()
	store := w.liveStore
	w.storeMu.RUnlock()
	if store == nil {
		return nil
	}
	obj, ok, err := store.GetByKey(w.node)
	if err != nil || !ok {
		return nil
	}
	n, _ := obj.(*corev1.Node)
	return n
}

// Stats returns a snapshot of the Writer's counters.
func (w *Writer) Stats() Stats {
	w.statsMu.Lock()
	defer w.statsMu.Unlock()
	return w.stats
}

// Sync writes the annotation once if the Node's value differs from the devices last set.
// While [Writer.Run] runs, the Node is read from Run's watch (no request); otherwise Sync GETs
// it. It returns nil when the value is right (written or already there), [ErrNoDevices]
// before the first [Writer.SetDevices], or a [*WriteError] (classes [ErrForbidden],
// [ErrNodeNotFound], [ErrAPI]). It is safe to call concurrently with Run; syncs are
// serialised.
func (w *Writer) Sync(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	err := w.syncLocked(ctx)
	w.statsMu.Lock()
	w.stats.LastError = err
	w.statsMu.Unlock()
	w.notifySync()
	return err
}

func (w *Writer) syncLocked(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	d := w.desired.Load()
	if d == nil {
		return fmt.Errorf("sync register annotation of node %q: %w", w.node, ErrNoDevices)
	}
	want := d.state
	written := w.written.Load()

	node, err := w.liveNode(ctx)
	if err != nil {
		w.failed(ctx, reasonOf(err))
		return err
	}
	live, present := w.observed(node.Annotations, d)
	if written != nil && w.staleCopy(node) {
		// The watch has not delivered our last patch yet: what we wrote is on the Node.
		live, present = *written, true
	}
	if present && live == want {
		if written == nil || *written != want {
			w.written.Store(&want)
			w.expect.Store(&want)
		}
		w.metrics.noop()
		w.count(func(s *Stats) { s.NoOps++ })
		logger.V(3).Info("Device info unchanged, skipping annotation update")
		return nil
	}

	heal := written != nil && *written == want
	logger.Info(fmt.Sprintf("Updating node annotations with %d device(s)", d.n))
	logger.V(3).Info("Annotation content", "value", d.value, "scores", d.scores, "heal", heal)
	annotations := map[string]any{w.key: d.value}
	if d.hasScores {
		annotations[w.scoreKey] = d.scores
	}
	if d.hasCordon {
		annotations[allocation.KeyDeviceCordon] = nullable(strings.Join(mergeCordon(node.Annotations, d.cordon), ","))
		annotations[CordonKey] = nullable(strings.Join(d.cordon, ","))
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return fmt.Errorf("encode patch of node %q: %w", w.node, err)
	}
	w.expect.Store(&want)
	updated, err := w.client.CoreV1().Nodes().Patch(ctx, w.node, types.MergePatchType, body, metav1.PatchOptions{FieldManager: FieldManager})
	if err != nil {
		w.expect.Store(written)
		we := classify("patch", w.node, w.key, err)
		if ctx.Err() == nil {
			w.failed(ctx, reasonOf(we))
			w.event(node, we)
		}
		return we
	}
	w.written.Store(&want)
	if updated != nil {
		rv := updated.ResourceVersion
		w.writtenRV.Store(&rv)
	}
	w.metrics.write(heal)
	w.count(func(s *Stats) {
		s.Writes++
		if heal {
			s.Heals++
		}
	})
	return nil
}

// liveNode returns the Node from Run's watch cache, or GETs it when Run is not running.
func (w *Writer) liveNode(ctx context.Context) (*corev1.Node, error) {
	if w.store != nil {
		obj, ok, err := w.store.GetByKey(w.node)
		if err != nil {
			return nil, &WriteError{Verb: "get", Node: w.node, Key: w.key, Kind: ErrAPI, Err: err}
		}
		node, isNode := obj.(*corev1.Node)
		if !ok || !isNode {
			return nil, &WriteError{Verb: "get", Node: w.node, Key: w.key, Kind: ErrNodeNotFound}
		}
		return node, nil
	}
	node, err := w.client.CoreV1().Nodes().Get(ctx, w.node, metav1.GetOptions{})
	if err != nil {
		return nil, classify("get", w.node, w.key, err)
	}
	return node, nil
}

// staleCopy reports whether node is a copy older than the Node the Writer's last patch
// produced, going by resourceVersion (comparable between versions of one object since
// Kubernetes 1.35, KEP-5504). When either version is not a well-formed number, as with fake
// clientsets, the copy is taken as current.
func (w *Writer) staleCopy(node *corev1.Node) bool {
	rv := w.writtenRV.Load()
	if rv == nil {
		return false
	}
	c, err := resourceversion.CompareResourceVersion(node.ResourceVersion, *rv)
	return err == nil && c < 0
}

func reasonOf(err error) string {
	switch {
	case errors.Is(err, ErrForbidden):
		return reasonForbidden
	case errors.Is(err, ErrNodeNotFound):
		return reasonNodeNotFound
	default:
		return reasonAPI
	}
}

func (w *Writer) failed(ctx context.Context, reason string) {
	if ctx.Err() != nil {
		return // cancelled, not failed
	}
	w.metrics.failure(reason)
	w.count(func(s *Stats) { s.Failures++ })
}

func (w *Writer) count(f func(*Stats)) {
	w.statsMu.Lock()
	f(&w.stats)
	w.statsMu.Unlock()
}

// event records a Warning Event on node for a failed write.
func (w *Writer) event(node *corev1.Node, err error) {
	if w.activeRecorder == nil {
		return
	}
	msg := err.Error()
	if len(msg) > maxEventMessage {
		msg = msg[:maxEventMessage-3] + "..."
	}
	w.activeRecorder.Event(node, corev1.EventTypeWarning, EventReasonFailed, msg)
}

// Run keeps the annotation equal to the devices last set until ctx is done, then returns nil
// after every goroutine it started has ended. It watches only its own Node (field selector
// metadata.name) and, once the watch has listed it, syncs at the first [Writer.SetDevices]
// and at every later one, whenever the annotation on the Node changes to anything but what
// the Writer wrote (drift), and when the Node appears. A failed sync is retried after
// RetryInitial, doubling up to RetryMax; a missing Node is waited for on the watch instead.
// Errors are logged, counted, and recorded as Events on the Node; see [Writer.Stats] for the
// last one. Calling Run while another Run of w has not returned gives [ErrAlreadyRunning].
func (w *Writer) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return fmt.Errorf("run register writer of node %q: %w", w.node, ErrAlreadyRunning)
	}
	defer w.running.Store(false)

	logger := klog.LoggerWithValues(klog.FromContext(ctx), "node", klog.KRef("", w.node), "key", w.key)
	ctx = klog.NewContext(ctx, logger)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	logger.Info("Starting register annotation writer")

	recorder := w.recorder
	if recorder == nil {
		b := record.NewBroadcaster(record.WithContext(ctx))
		defer b.Shutdown()
		b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: w.client.CoreV1().Events("")})
		recorder = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: EventComponent, Host: w.node})
	}

	informer := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(w.listWatch(), w.client),
		&corev1.Node{}, cache.SharedIndexInformerOptions{})
	reg, err := cache.NewTypedSharedIndexInformer[*corev1.Node](informer).AddTypedEventHandler(w.handler(logger), cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return fmt.Errorf("run register writer: add node event handler: %w", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { informer.RunWithContext(ctx) })
	defer func() {
		cancel(nil)
		wg.Wait()
		w.mu.Lock()
		w.store = nil
		w.activeRecorder = w.recorder
		w.mu.Unlock()
		w.storeMu.Lock()
		w.liveStore = nil
		w.storeMu.Unlock()
	}()

	// WaitFor is told of the sync, where WaitForCacheSync polls every 100 ms: in a synctest
	// bubble the first sync follows the list at once, without fake time passing. The
	// registration's checker also waits for the first Add to reach the handler.
	if !cache.WaitFor(ctx, "", reg.HasSyncedChecker()) {
		return nil // cancelled before the first list
	}
	w.mu.Lock()
	w.store = informer.GetStore()
	w.activeRecorder = recorder
	w.mu.Unlock()
	w.storeMu.Lock()
	w.liveStore = informer.GetStore()
	w.storeMu.Unlock()
	// The retry timer is armed only after a failure, so a fake clock has a waiter exactly then.
	timer := w.clock.NewTimer(w.retryMin)
	timer.Stop()
	defer timer.Stop()
	var retry time.Duration
	for {
		if w.desired.Load() == nil {
			logger.V(2).Info("Waiting for the first device list")
			select {
			case <-ctx.Done():
				return nil
			case <-w.kick:
			}
			continue
		}
		select { // this sync covers every request made so far
		case <-w.kick:
		default:
		}
		err := w.Sync(ctx)
		if ctx.Err() != nil {
			return nil
		}
		armed := false
		switch {
		case err == nil:
			retry = 0
		case errors.Is(err, ErrNodeNotFound):
			retry = 0
			logger.Info("Node not found, waiting for it to appear", "reason", err.Error())
		default:
			retry = min(max(2*retry, w.retryMin), w.retryMax)
			logger.Error(err, "Failed to register annotation", "retryIn", retry)
			timer.Reset(retry)
			armed = true
		}
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C():
		case <-w.kick:
			if armed && !timer.Stop() {
				select { // a fake clock's timer may have fired into its buffer
				case <-timer.C():
				default:
				}
			}
		}
	}
}

// listWatch lists and watches only the Writer's own Node. A Forbidden answer is logged with
// the permission to grant, and kept as the last error; the reflector retries on its own.
func (w *Writer) listWatch() *cache.ListWatch {
	selector := fields.OneTermEqualSelector("metadata.name", w.node).String()
	nodes := w.client.CoreV1().Nodes()
	denied := func(ctx context.Context, verb string, err error) {
		if err == nil || !apierrors.IsForbidden(err) {
			return
		}
		we := classify(verb, w.node, w.key, err)
		w.failed(ctx, reasonForbidden)
		w.statsMu.Lock()
		w.stats.LastError = we
		w.statsMu.Unlock()
		klog.FromContext(ctx).Error(we, "Cannot watch the Node")
	}
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = selector
			list, err := nodes.List(ctx, opts)
			denied(ctx, "list", err)
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = selector
			wi, err := nodes.Watch(ctx, opts)
			denied(ctx, "watch", err)
			return wi, err
		},
	}
}

// handler turns watch events of the Node into rescans: when the Node appears, and when the
// annotation changes to anything but what this Writer wrote.
func (w *Writer) handler(logger klog.Logger) cache.TypedResourceEventHandler[*corev1.Node] {
	return cache.TypedResourceEventHandlerFuncs[*corev1.Node]{
		AddFunc: func(n *corev1.Node) {
			if n.Name == w.node {
				logger.V(4).Info("Node observed")
				w.wake()
			}
		},
		UpdateFunc: func(o, n *corev1.Node) {
			if n.Name != w.node {
				return
			}
			d := w.desired.Load()
			ov, op := w.observed(o.Annotations, d)
			nv, np := w.observed(n.Annotations, d)
			if ov == nv && op == np {
				return
			}
			if exp := w.expect.Load(); exp != nil && np && nv == *exp {
				return // the echo of our own write
			}
			if w.staleCopy(n) {
				return // a change from before our last write, which has overwritten it
			}
			logger.V(2).Info("Register annotation changed on the Node, restoring it", "present", np)
			w.wake()
		},
		DeleteFunc: func(cache.DeletedObject[*corev1.Node]) {
			logger.V(2).Info("Node deleted; waiting for it to appear again")
		},
	}
}

// invalidVendorError is a vendor that lacks what the writer needs: its text is the vendor's, and
// it is both annotation.ErrIncompleteVendor and the writer's [ErrInvalidOptions].
type invalidVendorError struct{ err error }

func (e invalidVendorError) Error() string   { return e.err.Error() }
func (e invalidVendorError) Unwrap() []error { return []error{e.err, ErrInvalidOptions} }
