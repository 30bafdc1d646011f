package register

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

	"github.com/hamireg/hamireg/annotation"
)

// DeviceSource supplies the devices of the node, in any order. [Writer] calls it on every
// rescan, from one goroutine at a time. An error skips the rescan and is retried with backoff.
type DeviceSource interface {
	Devices(ctx context.Context) ([]annotation.Device, error)
}

// DeviceSourceFunc adapts a function to [DeviceSource].
type DeviceSourceFunc func(ctx context.Context) ([]annotation.Device, error)

// Devices calls f.
func (f DeviceSourceFunc) Devices(ctx context.Context) ([]annotation.Device, error) { return f(ctx) }

var _ DeviceSource = DeviceSourceFunc(nil)

// Defaults of [Options].
const (
	// DefaultPeriod is the rescan period, HAMi's 30 s.
	DefaultPeriod = 30 * time.Second
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
	// key hami.io/node-nvidia-register. The vendor's format must be annotation.FormatJSON.
	Vendor annotation.Vendor
	// Shape selects the wire shape. Default: annotation.ShapeMaster (HAMi master);
	// annotation.ShapeV290 writes HAMi v2.9.0's "devicepairscore":{}.
	Shape annotation.Shape
	// Period is how often Run rescans the device source. Default: [DefaultPeriod] (30 s).
	Period time.Duration
	// RetryInitial is the delay before the first retry of a failed sync; each further
	// failure doubles it up to RetryMax. Default: [DefaultRetryInitial] (1 s).
	RetryInitial time.Duration
	// RetryMax caps the retry delay. Default: [DefaultRetryMax] (5 s, HAMi's retry period).
	RetryMax time.Duration
	// Clock is the time source of Run's timers. Default: clock.RealClock{}.
	Clock clock.Clock
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
	// Failures counts failed syncs (device source, missing Node, API errors).
	Failures uint64
	// LastError is the error of the last sync, nil when it succeeded.
	LastError error
}

// Writer keeps one vendor's register annotation on one Node equal to what its device source
// reports. See the package documentation for the behaviour; create it with [New].
type Writer struct {
	client   kubernetes.Interface
	node     string
	source   DeviceSource
	key      string
	shape    annotation.Shape
	period   time.Duration
	retryMin time.Duration
	retryMax time.Duration
	clock    clock.Clock
	recorder record.EventRecorder // from Options; may be nil
	metrics  *metrics             // nil without a Registerer

	running atomic.Bool
	// rescan wakes Run for an immediate sync: drift seen on the watch, the Node appearing,
	// or a caller's Rescan. Capacity 1: requests coalesce.
	rescan chan struct{}
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
	// place; nil before the first.
	written *string
	// store is the informer's cache of the Node while Run runs (nil otherwise: Sync GETs).
	store cache.Store
	// activeRecorder is recorder, or Run's own while Run runs; nil records nothing.
	activeRecorder record.EventRecorder

	statsMu sync.Mutex
	stats   Stats
}

// New returns a Writer of the register annotation of node nodeName with the devices from
// source. It validates its arguments and returns an error wrapping [ErrNoNodeName],
// [ErrInvalidNodeName] or [ErrInvalidOptions]; it starts nothing and sends no request.
// client needs the RBAC permissions listed in the package documentation.
func New(client kubernetes.Interface, nodeName string, source DeviceSource, opts Options) (*Writer, error) {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("new register writer: "+format+": %w", append(args, ErrInvalidOptions)...)
	}
	if client == nil {
		return nil, invalid("nil client")
	}
	if source == nil {
		return nil, invalid("nil device source")
	}
	if err := validateNodeName(nodeName); err != nil {
		return nil, fmt.Errorf("new register writer: %w", err)
	}
	vendor := cmp.Or(opts.Vendor, annotation.NVIDIA())
	if vendor.RegisterKey == "" {
		return nil, invalid("vendor %q has no register annotation", vendor.Name)
	}
	if vendor.Format != annotation.FormatJSON {
		return nil, invalid("vendor %q uses the %s format; only JSON is written", vendor.Name, vendor.Format)
	}
	if opts.Shape != annotation.ShapeMaster && opts.Shape != annotation.ShapeV290 {
		return nil, invalid("unknown shape %d", int(opts.Shape))
	}
	w := &Writer{
		client:   client,
		node:     nodeName,
		source:   source,
		key:      vendor.RegisterKey,
		shape:    opts.Shape,
		period:   opts.Period,
		retryMin: opts.RetryInitial,
		retryMax: opts.RetryMax,
		clock:    opts.Clock,
		recorder: opts.EventRecorder,
		rescan:   make(chan struct{}, 1),
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{{"Period", &w.period, DefaultPeriod}, {"RetryInitial", &w.retryMin, DefaultRetryInitial}, {"RetryMax", &w.retryMax, DefaultRetryMax}} {
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

// Rescan asks Run to rescan the device source and sync now instead of at the next period,
// e.g. when the source has learnt that a GPU's health changed. It never blocks; requests made
// while a sync is pending coalesce into one. Without a running Run it has no effect beyond
// the first sync every Run does anyway.
func (w *Writer) Rescan() {
	select {
	case w.rescan <- struct{}{}:
	default:
	}
}

// Stats returns a snapshot of the Writer's counters.
func (w *Writer) Stats() Stats {
	w.statsMu.Lock()
	defer w.statsMu.Unlock()
	return w.stats
}

// Sync rescans the device source once and writes the annotation if the Node's value differs.
// While [Writer.Run] runs, the Node is read from Run's watch (no request); otherwise Sync GETs
// it. It returns nil when the value is right (written or already there), the device source's
// error, or a [*WriteError] (classes [ErrForbidden], [ErrNodeNotFound], [ErrAPI]). It is safe
// to call concurrently with Run; syncs are serialised.
func (w *Writer) Sync(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	err := w.syncLocked(ctx)
	w.statsMu.Lock()
	w.stats.LastError = err
	w.statsMu.Unlock()
	return err
}

func (w *Writer) syncLocked(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	devs, err := w.source.Devices(ctx)
	if err != nil {
		w.failed(ctx, reasonDeviceSource)
		return fmt.Errorf("scan devices of node %q: %w", w.node, err)
	}
	devs = annotation.Canonical(devs)
	want := annotation.EncodeShape(devs, w.shape)

	node, err := w.liveNode(ctx)
	if err != nil {
		w.failed(ctx, reasonOf(err))
		return err
	}
	live, present := node.Annotations[w.key]
	if w.written != nil && w.staleCopy(node) {
		// The watch has not delivered our last patch yet: what we wrote is on the Node.
		live, present = *w.written, true
	}
	if present && live == want {
		if w.written == nil || *w.written != want {
			w.written = &want
			w.expect.Store(&want)
		}
		w.metrics.noop()
		w.count(func(s *Stats) { s.NoOps++ })
		logger.V(3).Info("Device info unchanged, skipping annotation update")
		return nil
	}

	heal := w.written != nil && *w.written == want
	logger.Info(fmt.Sprintf("Updating node annotations with %d device(s)", len(devs)))
	logger.V(3).Info("Annotation content", "value", want, "heal", heal)
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{w.key: want}}})
	if err != nil {
		return fmt.Errorf("encode patch of node %q: %w", w.node, err)
	}
	w.expect.Store(&want)
	updated, err := w.client.CoreV1().Nodes().Patch(ctx, w.node, types.MergePatchType, body, metav1.PatchOptions{FieldManager: FieldManager})
	if err != nil {
		w.expect.Store(w.written)
		we := classify("patch", w.node, w.key, err)
		if ctx.Err() == nil {
			w.failed(ctx, reasonOf(we))
			w.event(node, we)
		}
		return we
	}
	w.written = &want
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

// Run keeps the annotation right until ctx is done, then returns nil after every goroutine it
// started has ended. It watches only its own Node (field selector metadata.name), syncs once
// the watch has listed it, then again every Period, whenever the annotation on the Node
// changes to anything but what the Writer wrote (drift), when the Node appears, and on
// [Writer.Rescan]. A failed
// sync is retried after RetryInitial, doubling up to RetryMax; a missing Node is waited for
// on the watch instead. Errors are logged, counted, and recorded as Events on the Node; see
// [Writer.Stats] for the last one. Calling Run while another Run of w has not returned gives
// [ErrAlreadyRunning].
func (w *Writer) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return fmt.Errorf("run register writer of node %q: %w", w.node, ErrAlreadyRunning)
	}
	defer w.running.Store(false)

	logger := klog.LoggerWithValues(klog.FromContext(ctx), "node", klog.KRef("", w.node), "key", w.key)
	ctx = klog.NewContext(ctx, logger)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	logger.Info("Starting register annotation writer", "period", w.period)

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
	select { // the first sync covers whatever the initial list reported
	case <-w.rescan:
	default:
	}

	// The timer is armed only while Run waits, so a fake clock has a waiter exactly then.
	timer := w.clock.NewTimer(w.period)
	timer.Stop()
	defer timer.Stop()
	var retry time.Duration
	for {
		err := w.Sync(ctx)
		if ctx.Err() != nil {
			return nil
		}
		next := w.period
		switch {
		case err == nil:
			retry = 0
		case errors.Is(err, ErrNodeNotFound):
			retry = 0
			logger.Info("Node not found, waiting for it to appear", "reason", err.Error())
		default:
			retry = min(max(2*retry, w.retryMin), w.retryMax)
			next = retry
			logger.Error(err, "Failed to register annotation", "retryIn", next)
		}
		timer.Reset(next)
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C():
		case <-w.rescan:
			if !timer.Stop() {
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
				w.Rescan()
			}
		},
		UpdateFunc: func(o, n *corev1.Node) {
			if n.Name != w.node {
				return
			}
			ov, op := o.Annotations[w.key]
			nv, np := n.Annotations[w.key]
			if ov == nv && op == np {
				return
			}
			if exp := w.expect.Load(); exp != nil && np && nv == *exp {
				return // the echo of our own write
			}
			if w.staleCopy(n) {
				return // a change from before our last write, which has overwritten it
			}
			logger.V(2).Info("Register annotation changed on the Node, rescanning", "present", np)
			w.Rescan()
		},
		DeleteFunc: func(cache.DeletedObject[*corev1.Node]) {
			logger.V(2).Info("Node deleted; waiting for it to appear again")
		},
	}
}
