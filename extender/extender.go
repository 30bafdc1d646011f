package extender

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/schedcache"
)

// Extender is a HAMi-compatible kube-scheduler extender: /filter places a GPU pod on a node
// and its GPUs and writes HAMi's pod annotations, /bind takes the node lock and binds, /webhook
// mutates GPU pods on admission. Create it with [New], run it with [Extender.Run], serve
// [Extender.Handler].
type Extender struct {
	client kubernetes.Interface
	cache  *schedcache.Cache
	opts   Options
	locker *nodelock.Locker
	// lockQueue orders the binds of each node and wakes those waiting for its lock, from the
	// Node and pod informers.
	lockQueue *nodelock.Queue
	usage     *usageIndex
	// allocationKeys are the pod annotations the webhook guards (AllocationAnnotationKeys).
	allocationKeys []string
	// metrics are the Prometheus collectors (Options.Registerer); nil records nothing.
	metrics *metrics

	pods      cache.SharedIndexInformer
	podLister corev1listers.PodLister
	ownPods   bool
	quotas    cache.SharedIndexInformer
	ownQuotas bool
	// classes and classLister read the DeviceClasses (Options.DeviceClasses); nil without.
	classes     cache.SharedIndexInformer
	classLister resourcelisters.DeviceClassLister
	// quotaWarned holds the warnings last recorded per ResourceQuota (only the quota
	// handler uses it).
	quotaWarned map[string]string

	running   atomic.Bool
	ready     chan struct{}
	readyOnce sync.Once

	// filterMu makes a filter's decision and its assumed usage one step, so that two filters
	// never choose the same free capacity.
	filterMu sync.Mutex
	stats    struct{ filters, binds, bindErrors, admissions atomic.Uint64 }
	// probeMismatches counts the filters in which Fit disagreed with an allocation.Probe (a
	// bug: the filter then decided with Fit alone).
	probeMismatches atomic.Uint64
}

var _ schedcache.Runnable = (*Extender)(nil)

// Stats are counters for tests and debugging.
type Stats struct {
	// Filters counts /filter calls that decided (not bad requests); Binds successful binds,
	// BindErrors failed ones; Admissions webhook reviews answered.
	Filters, Binds, BindErrors, Admissions uint64
	// Pods is the number of pods whose GPUs count against a node (informed or assumed).
	Pods uint64
}

// New returns an extender that reads nodes from c (which the caller runs, with its Handshaker
// under leader election) and writes through client. It starts nothing: call [Extender.Run].
func New(client kubernetes.Interface, c *schedcache.Cache, opts Options) (*Extender, error) {
	if client == nil || c == nil {
		return nil, fmt.Errorf("new extender: nil client or node cache: %w", ErrInvalidOptions)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("new extender: %w", err)
	}
	e := &Extender{client: client, cache: c, opts: opts, ready: make(chan struct{}),
		usage: newUsageIndex(opts.Vendor, opts.Config), allocationKeys: AllocationAnnotationKeys(opts.Vendor)}
	pods := opts.Pods
	if pods == nil {
		e.ownPods = true
		pods = informers.NewSharedInformerFactory(client, 0).Core().V1().Pods()
		if err := pods.Informer().SetTransform(trimPod); err != nil {
			return nil, fmt.Errorf("new extender: %w", err)
		}
	}
	e.pods, e.podLister = pods.Informer(), pods.Lister()
	if e.metrics, err = newMetrics(opts.Registerer, e); err != nil {
		return nil, fmt.Errorf("new extender: %w", err)
	}
	quotas := opts.ResourceQuotas
	if quotas == nil {
		e.ownQuotas = true
		quotas = informers.NewSharedInformerFactory(client, 0).Core().V1().ResourceQuotas()
		if err := quotas.Informer().SetTransform(trimQuota); err != nil {
			return nil, fmt.Errorf("new extender: %w", err)
		}
	}
	e.quotas, e.quotaWarned = quotas.Informer(), map[string]string{}
	if opts.DeviceClasses != nil {
		// Registered with the caller's factory now, so that its Start runs it.
		e.classes, e.classLister = opts.DeviceClasses.Informer(), opts.DeviceClasses.Lister()
	}
	// The informers' copies spare the lock's reads: a free node costs the lock one patch.
	e.locker, err = nodelock.New(client.CoreV1(), nodelock.Options{Timeout: opts.NodeLockTimeout, Clock: opts.Clock,
		Nodes: opts.Nodes, Pods: e.podLister})
	if err != nil {
		return nil, fmt.Errorf("new extender: %w: %w", ErrInvalidOptions, err)
	}
	e.lockQueue = nodelock.NewQueue(e.locker, nodelock.QueueOptions{Clock: opts.Clock})
	return e, nil
}

// reservationInvalid logs and records on the pod that its MIG reservation does not decode or
// does not match its devices: the pod's devices then occupy every placement of their MIG GPUs
// (allocation's rule c) until it is corrected or the pod is gone.
func (e *Extender) reservationInvalid(logger klog.Logger, pod *corev1.Pod, err error) {
	logger.Error(err, "MIG reservation unusable, its devices occupy every placement of their MIG GPUs", "pod", klog.KObj(pod))
	if e.opts.EventRecorder != nil {
		e.opts.EventRecorder.Eventf(pod, corev1.EventTypeWarning, EventMIGReservationInvalid, "%s unusable, its devices occupy every placement of their MIG GPUs: %v", mig.KeyAllocations, err)
	}
}

// trimPod drops what neither usage nor bind reads and what dominates a Pod's size.
func trimPod(obj any) (any, error) {
	if p, ok := obj.(*corev1.Pod); ok {
		p.ManagedFields = nil
	}
	return obj, nil
}

// finished reports whether a pod's phase is Succeeded or Failed.
func finished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// trimQuota drops what the quota state does not read.
func trimQuota(obj any) (any, error) {
	if q, ok := obj.(*corev1.ResourceQuota); ok {
		q.ManagedFields, q.Status = nil, corev1.ResourceQuotaStatus{}
	}
	return obj, nil
}

// Run counts usage from the pod informer and quota limits from the ResourceQuota informer
// until ctx is done: it registers its handlers (on the pod and quota informers, and on the node
// cache's Node informer to wake binds waiting for a node lock), starts the informers the
// extender owns, and closes readiness once the pods, the quotas and the node cache synced. It
// returns nil on cancellation, after every goroutine it started ended, and
// [ErrAlreadyRunning] when called twice.
func (e *Extender) Run(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return fmt.Errorf("run extender: %w", ErrAlreadyRunning)
	}
	logger := klog.FromContext(ctx)
	e.usage.migFailed = func(pod *corev1.Pod, err error) { e.reservationInvalid(logger, pod, err) }
	reg, err := cache.NewTypedSharedIndexInformer[*corev1.Pod](e.pods).AddTypedEventHandler(cache.TypedResourceEventHandlerFuncs[*corev1.Pod]{
		AddFunc: e.usage.Observe,
		UpdateFunc: func(o, p *corev1.Pod) {
			if finished(p) && !finished(o) {
				// A finished pod gives up its node lock (nodelock's Takeover): wake the binds
				// waiting there.
				defer e.lockQueue.PodGone(p)
			}
			if !e.usage.Changed(o, p) {
				return // status and other updates: nothing usage reads changed
			}
			e.usage.Observe(p)
		},
		DeleteFunc: func(obj cache.DeletedObject[*corev1.Pod]) {
			if key := obj.GetKey(); key != "" {
				e.usage.Delete(key)
			}
			e.lockQueue.PodGone(obj.OptionalObj)
		},
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return fmt.Errorf("run extender: add pod event handler: %w", err)
	}
	defer func() { _ = e.pods.RemoveEventHandler(reg) }()
	nodeReg, err := e.cache.Informer().AddEventHandlerWithOptions(e.lockQueue.NodeHandler(), cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return fmt.Errorf("run extender: add node event handler: %w", err)
	}
	defer func() { _ = e.cache.Informer().RemoveEventHandler(nodeReg) }()
	qreg, err := cache.NewTypedSharedIndexInformer[*corev1.ResourceQuota](e.quotas).AddTypedEventHandler(cache.TypedResourceEventHandlerFuncs[*corev1.ResourceQuota]{
		AddFunc:    e.observeQuota,
		UpdateFunc: func(_, q *corev1.ResourceQuota) { e.observeQuota(q) },
		DeleteFunc: func(obj cache.DeletedObject[*corev1.ResourceQuota]) {
			// A tombstone carries the key (HAMi v2.9.0 drops it and keeps the limit forever).
			if ns, name, err := cache.SplitMetaNamespaceKey(obj.GetKey()); err == nil && name != "" {
				e.usage.DeleteQuota(ns, name)
				delete(e.quotaWarned, obj.GetKey())
			}
		},
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return fmt.Errorf("run extender: add resource quota event handler: %w", err)
	}
	defer func() { _ = e.quotas.RemoveEventHandler(qreg) }()
	var wg sync.WaitGroup
	defer wg.Wait()
	if e.ownPods {
		wg.Go(func() { e.pods.RunWithContext(ctx) })
	}
	if e.ownQuotas {
		wg.Go(func() { e.quotas.RunWithContext(ctx) })
	}
	synced := []cache.DoneChecker{reg.HasSyncedChecker(), qreg.HasSyncedChecker()}
	if e.classes != nil {
		synced = append(synced, e.classes.HasSyncedChecker())
	}
	if !cache.WaitFor(ctx, "", synced...) || e.cache.WaitForSync(ctx) != nil {
		return nil
	}
	e.readyOnce.Do(func() { close(e.ready) })
	logger.V(2).Info("Extender ready", "pods", e.Stats().Pods)
	<-ctx.Done()
	return nil
}

// Ready returns a channel that is closed once the pod usage and the node cache have synced.
func (e *Extender) Ready() <-chan struct{} { return e.ready }

// Stats returns the extender's counters.
func (e *Extender) Stats() Stats {
	pods := uint64(e.usage.Len())
	return Stats{Filters: e.stats.filters.Load(), Binds: e.stats.binds.Load(), BindErrors: e.stats.bindErrors.Load(),
		Admissions: e.stats.admissions.Load(), Pods: pods}
}

// Routes of [Extender.Handler].
const (
	PathFilter  = "/filter"
	PathBind    = "/bind"
	PathWebhook = "/webhook"
	PathHealthz = "/healthz"
	PathReadyz  = "/readyz"
)

// Handler returns the extender's HTTP routes: POST /filter and /bind (kube-scheduler's
// extender API, verbs filter and bind), POST /webhook (the mutating admission webhook), GET
// /healthz, the liveness probe, which answers 200 whenever the handler serves (a slow first
// sync is not a reason to restart the process), and GET /readyz, the readiness probe, which
// answers 200 once [Extender.Ready] is closed and 503 before.
func (e *Extender) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(PathFilter, e.serveFilter)
	mux.HandleFunc(PathBind, e.serveBind)
	mux.HandleFunc(PathWebhook, e.serveWebhook)
	mux.HandleFunc(PathHealthz, func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok"))
	})
	mux.HandleFunc(PathReadyz, func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-e.ready:
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("ok"))
		default:
			http.Error(w, "node cache or pod usage not synced", http.StatusServiceUnavailable)
		}
	})
	return mux
}

// waitReady waits for readiness with the request's context, as HAMi's filter waits for its
// cache (without polling).
func (e *Extender) waitReady(ctx context.Context) error {
	select {
	case <-e.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrNotReady, context.Cause(ctx))
	}
}

// ClusterRoleRules returns the RBAC rules the extender needs, no more: pods list and watch (usage),
// get (a bind of a pod the informer has not delivered yet), patch (the filter's and bind's
// annotations); pods/binding create; resourcequotas list and watch (the quota on GPU memory
// and cores; HAMi's own scheduler needs the same); Events create and patch; and the node lock's rules
// (nodelock.ClusterRoleRules: nodes get and patch, pods get); deviceclasses get, list and
// watch (Options.DeviceClasses, the extended-resource mapping). The node cache and its
// Handshaker need schedcache.ClusterRoleRules besides.
func ClusterRoleRules() []rbacv1.PolicyRule {
	return append([]rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods/binding"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"resourcequotas"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"deviceclasses"}, Verbs: []string{"get", "list", "watch"}},
	}, nodelock.ClusterRoleRules()...)
}

func podKey(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}
