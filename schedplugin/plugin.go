package schedplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/utils/clock"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/schedcache"
	"github.com/hamireg/hamireg/usage"
)

// Name is the plugin's name in a KubeSchedulerConfiguration.
const Name = "HAMiGPU"

// ErrClosed means the plugin's cluster-wide state was closed.
var ErrClosed = errors.New("HAMiGPU plugin closed")

// NewFactory returns the plugin factory for app.WithPlugin(schedplugin.Name, schedplugin.NewFactory()).
// Every profile's plugin made by one factory shares the cluster-wide state (tracker, reservations,
// node cache, lock queue).
func NewFactory() func(ctx context.Context, args runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	f := &factory{}
	return f.new
}

// factory holds the cluster-wide state once the first profile built it.
type factory struct {
	mu     sync.Mutex
	shared *shared
}

func (f *factory) new(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args, err := decodeArgs(obj)
	if err != nil {
		return nil, fmt.Errorf("new %s plugin: %w", Name, err)
	}
	s, err := args.settings()
	if err != nil {
		return nil, fmt.Errorf("new %s plugin: %w", Name, err)
	}
	if h == nil || h.ClientSet() == nil || h.SharedInformerFactory() == nil {
		return nil, fmt.Errorf("new %s plugin: %w: the handle has no client or informer factory", Name, ErrInvalidArgs)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.shared == nil || f.shared.closed() {
		sh, err := newShared(ctx, h, s)
		if err != nil {
			return nil, fmt.Errorf("new %s plugin: %w", Name, err)
		}
		f.shared = sh
	} else if why := f.shared.settings.sameShared(s); why != "" {
		return nil, fmt.Errorf("new %s plugin: %w: profiles share one state and must agree: %s", Name, ErrInvalidArgs, why)
	}
	f.shared.refs.Add(1)
	return &Plugin{h: h, sh: f.shared, s: s}, nil
}

// shared is the cluster-wide state of every profile's plugin.
type shared struct {
	settings settings
	cache    *schedcache.Cache
	trackers []*usage.Tracker // one per vendor, parallel to settings.vendors
	locker   *nodelock.Locker
	locks    *nodelock.Queue
	clock    clock.Clock
	synced   []cache.InformerSynced

	res      reservations
	decoded  sync.Map // types.UID → *decodedPod
	memo     sync.Map // node name → *fitMemo
	usage    sync.Map // node name → *usageMemo
	foreign  foreignPods
	quotaRej quotaRejects

	cancel context.CancelCauseFunc
	wg     sync.WaitGroup
	// unregister removes HAMi's metric families from kube-scheduler's registry.
	unregister func()
	refs       atomic.Int32 // profiles not yet closed
	done       atomic.Bool
}

// decodedPod memoises what a pod's annotations say it holds, per resourceVersion and vendor.
type decodedPod struct {
	rv     string
	vendor int
	p      usage.Placement
	ok     bool
}

func newShared(ctx context.Context, h fwk.Handle, s settings) (*shared, error) {
	logger := klog.FromContext(ctx)
	factory := h.SharedInformerFactory()
	vendors := make([]annotation.Vendor, len(s.vendors))
	for i := range s.vendors {
		vendors[i] = s.vendors[i].vendor
	}
	c, err := schedcache.New(factory.Core().V1().Nodes(), schedcache.Options{Vendors: vendors, KeepNodeFields: true})
	if err != nil {
		return nil, err
	}
	sh := &shared{settings: s, cache: c, clock: clock.RealClock{}}
	for _, vc := range s.vendors {
		sh.trackers = append(sh.trackers, usage.New(usage.Options{Vendor: vc.vendor, Config: vc.cfg}))
	}
	pods, nodes := factory.Core().V1().Pods(), factory.Core().V1().Nodes()
	sh.locker, err = nodelock.New(h.ClientSet().CoreV1(), nodelock.Options{Nodes: nodes.Lister(), Pods: pods.Lister()})
	if err != nil {
		return nil, err
	}
	sh.locks = nodelock.NewQueue(sh.locker, nodelock.QueueOptions{})
	opts := cache.HandlerOptions{Logger: &logger}
	podReg, err := pods.Informer().AddEventHandlerWithOptions(sh.podHandler(), opts)
	if err != nil {
		return nil, err
	}
	quotaReg, err := factory.Core().V1().ResourceQuotas().Informer().AddEventHandlerWithOptions(sh.quotaHandler(logger), opts)
	if err != nil {
		return nil, err
	}
	nodeReg, err := nodes.Informer().AddEventHandlerWithOptions(sh.locks.NodeHandler(), opts)
	if err != nil {
		return nil, err
	}
	// A deleted node's fit memo goes with it.
	if _, err := nodes.Informer().AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{DeleteFunc: func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			sh.memo.Delete(key)
			sh.usage.Delete(key)
		}
	}}, opts); err != nil {
		return nil, err
	}
	sh.synced = []cache.InformerSynced{podReg.HasSynced, quotaReg.HasSynced, nodeReg.HasSynced, c.HasSynced}
	handshakes, err := handshakeWriter(h.ClientSet(), c, s.handshake)
	if err != nil {
		return nil, err
	}
	sh.unregister = registerMetrics(logger, legacyregistry.Registerer(), sh.collectors())
	runCtx, cancel := context.WithCancelCause(ctx)
	sh.cancel = cancel
	sh.wg.Go(func() {
		if err := c.Run(runCtx); err != nil {
			logger.Error(err, "HAMiGPU node cache stopped")
		}
	})
	if handshakes != nil {
		sh.wg.Go(func() {
			if err := handshakes.Run(runCtx); err != nil {
				logger.Error(err, "HAMiGPU handshake writer stopped")
			}
		})
	}
	return sh, nil
}

// handshakeWriter is the writer of the nodes' handshakes that hs asks for: a Handshaker on c,
// under a LeaseFollower of kube-scheduler's Lease for HandshakeLease (this replica's identity
// is its host name, as kube-scheduler's is "<host name>_<uuid>"); nil for HandshakeOff.
func handshakeWriter(client kubernetes.Interface, c *schedcache.Cache, hs HandshakeArgs) (schedcache.Runnable, error) {
	if hs.Mode == HandshakeOff {
		return nil, nil
	}
	w, err := schedcache.NewHandshaker(client, c, schedcache.HandshakerOptions{})
	if err != nil || hs.Mode == HandshakeAlways {
		return w, err
	}
	id, err := os.Hostname()
	if err != nil || id == "" {
		return nil, fmt.Errorf("handshake mode %s: host name for the leader identity: %q, %w", hs.Mode, id, err)
	}
	return schedcache.NewLeaseFollower(client, w, schedcache.FollowerOptions{Namespace: hs.LeaseNamespace, Name: hs.LeaseName, Identity: id})
}

// registerMetrics registers cs on reg (kube-scheduler's legacyregistry, which its /metrics
// serves) and returns what unregisters them. Collectors already registered there (a second
// factory in one process, as in tests) are left to the first and logged.
func registerMetrics(logger klog.Logger, reg prometheus.Registerer, cs []prometheus.Collector) func() {
	var done []prometheus.Collector
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			logger.V(2).Info("HAMi's scheduler metrics not registered on kube-scheduler's /metrics", "err", err)
			continue
		}
		done = append(done, c)
	}
	return func() {
		for _, c := range done {
			reg.Unregister(c)
		}
	}
}

func (sh *shared) closed() bool { return sh.done.Load() }

// close stops the node cache and waits for it.
func (sh *shared) close() {
	sh.done.Store(true)
	sh.cancel(ErrClosed)
	sh.wg.Wait()
	sh.unregister()
}

// waitSynced waits for the informers the plugin reads and the node cache.
func (sh *shared) waitSynced(ctx context.Context) error {
	for _, ok := range sh.synced {
		if !ok() {
			if !cache.WaitForCacheSync(ctx.Done(), sh.synced...) {
				return fmt.Errorf("wait for %s informers: %w", Name, context.Cause(ctx))
			}
			return nil
		}
	}
	return nil
}

// podHandler feeds the trackers, drops reservations and decodes of deleted pods and wakes
// binds waiting for a lock that a deleted pod held.
func (sh *shared) podHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if pod, ok := obj.(*corev1.Pod); ok {
				for _, t := range sh.trackers {
					t.Observe(pod)
				}
				sh.foreign.observe(pod)
			}
		},
		UpdateFunc: func(o, n any) {
			op, ok1 := o.(*corev1.Pod)
			np, ok2 := n.(*corev1.Pod)
			if !ok1 || !ok2 {
				return
			}
			for _, t := range sh.trackers {
				if t.Changed(op, np) {
					t.Observe(np)
				}
			}
			sh.foreign.observe(np)
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			pod, ok := obj.(*corev1.Pod)
			if !ok {
				return
			}
			for _, t := range sh.trackers {
				t.Delete(usage.Key(pod.Namespace, pod.Name))
			}
			sh.res.drop(pod.UID, nil)
			sh.foreign.forget(pod.UID)
			sh.decoded.Delete(pod.UID)
			sh.quotaRej.forget(pod)
			sh.locks.PodGone(pod)
		},
	}
}

// quotaHandler feeds the trackers' quota limits and activates the pods rejected for quota in
// the namespace of a changed ResourceQuota.
func (sh *shared) quotaHandler(logger klog.Logger) cache.ResourceEventHandler {
	set := func(obj any) {
		q, ok := obj.(*corev1.ResourceQuota)
		if !ok {
			return
		}
		for _, t := range sh.trackers {
			t.SetQuota(q)
		}
		sh.quotaRej.activate(logger, q.Namespace)
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, n any) { set(n) },
		DeleteFunc: func(obj any) {
			key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
			if err != nil {
				return
			}
			ns, name, err := cache.SplitMetaNamespaceKey(key)
			if err != nil {
				return
			}
			for _, t := range sh.trackers {
				t.DeleteQuota(ns, name)
			}
			sh.quotaRej.activate(logger, ns)
		},
	}
}

// placement is what pod holds by its annotations under vendor i, memoised per resourceVersion.
func (sh *shared) placement(pod *corev1.Pod, i int) (usage.Placement, bool) {
	if v, ok := sh.decoded.Load(pod.UID); ok {
		if d := v.(*decodedPod); d.rv == pod.ResourceVersion && d.vendor == i && pod.ResourceVersion != "" {
			return d.p, d.ok
		}
	}
	p, ok := sh.trackers[i].PlacementOf(pod)
	sh.decoded.Store(pod.UID, &decodedPod{rv: pod.ResourceVersion, vendor: i, p: p, ok: ok})
	return p, ok
}

// quotaRejects are the pods a Filter or Reserve rejected for their namespace's quota, by
// namespace, with the handle to activate them through when the quota changes (the plugin's
// ResourceQuota queueing: a typed handler calling Handle.Activate).
type quotaRejects struct {
	mu   sync.Mutex
	pods map[string]map[types.UID]quotaRejected
}

type quotaRejected struct {
	pod *corev1.Pod
	h   fwk.Handle
}

func (q *quotaRejects) add(h fwk.Handle, pod *corev1.Pod) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.pods == nil {
		q.pods = map[string]map[types.UID]quotaRejected{}
	}
	ns := q.pods[pod.Namespace]
	if ns == nil {
		ns = map[types.UID]quotaRejected{}
		q.pods[pod.Namespace] = ns
	}
	ns[pod.UID] = quotaRejected{pod: pod, h: h}
}

func (q *quotaRejects) forget(pod *corev1.Pod) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ns := q.pods[pod.Namespace]; ns != nil {
		delete(ns, pod.UID)
		if len(ns) == 0 {
			delete(q.pods, pod.Namespace)
		}
	}
}

// activate moves the namespace's quota-rejected pods to activeQ and forgets them.
func (q *quotaRejects) activate(logger klog.Logger, namespace string) {
	q.mu.Lock()
	ns := q.pods[namespace]
	delete(q.pods, namespace)
	q.mu.Unlock()
	byHandle := map[fwk.Handle]map[string]*corev1.Pod{}
	for _, r := range ns {
		m := byHandle[r.h]
		if m == nil {
			m = map[string]*corev1.Pod{}
			byHandle[r.h] = m
		}
		m[usage.Key(r.pod.Namespace, r.pod.Name)] = r.pod
	}
	for h, pods := range byHandle {
		h.Activate(logger, pods)
	}
}

// Plugin is one profile's HAMiGPU plugin. Build it with [NewFactory].
type Plugin struct {
	h         fwk.Handle
	sh        *shared
	s         settings
	closeOnce sync.Once
}

var (
	_ fwk.PreFilterPlugin     = (*Plugin)(nil)
	_ fwk.FilterPlugin        = (*Plugin)(nil)
	_ fwk.PreScorePlugin      = (*Plugin)(nil)
	_ fwk.ScorePlugin         = (*Plugin)(nil)
	_ fwk.ReservePlugin       = (*Plugin)(nil)
	_ fwk.PreBindPlugin       = (*Plugin)(nil)
	_ fwk.EnqueueExtensions   = (*Plugin)(nil)
	_ fwk.SignPlugin          = (*Plugin)(nil)
	_ fwk.PreFilterExtensions = (*Plugin)(nil)
	_ fwk.ScoreExtensions     = (*Plugin)(nil)
)

// Name implements fwk.Plugin.
func (p *Plugin) Name() string { return Name }

// Close implements io.Closer: the last profile's Close stops the shared node cache and waits
// for its goroutines.
func (p *Plugin) Close() error {
	p.closeOnce.Do(func() {
		p.sh.release()
	})
	return nil
}

func (sh *shared) release() {
	if sh.refs.Add(-1) == 0 {
		sh.close()
	}
}

// vendorOf returns the index of the first configured vendor pod asks for, with its request;
// -1 when it asks for none, and an error message when it asks for two.
func (p *Plugin) vendorOf(pod *corev1.Pod) (int, allocation.PodRequest, string) {
	found := -1
	var req allocation.PodRequest
	for i, vc := range p.s.vendors {
		r := allocation.Requests(pod, vc.cfg)
		if !r.Any() {
			continue
		}
		if found >= 0 {
			return found, req, fmt.Sprintf("pod asks for devices of two vendors, %s and %s: HAMi places one vendor per pod",
				p.s.vendors[found].vendor.Name, vc.vendor.Name)
		}
		found, req = i, r
	}
	return found, req, ""
}

// foreignPods are the pods placed on a node (hami.io/vgpu-node) but not bound to it: placed by
// another scheduler (HAMi's own, in a mixed cluster), or by this one and not bound yet. The
// scheduler's NodeInfo holds only bound and assumed pods, so Filter adds those that are absent
// from it. A pod whose bind failed holds nothing until it is placed again (as the tracker).
type foreignPods struct {
	mu     sync.RWMutex
	byNode map[string]map[types.UID]*corev1.Pod
	nodeOf map[types.UID]string
	seq    uint64
	ver    map[string]uint64
}

func (f *foreignPods) observe(pod *corev1.Pod) {
	node := pod.Annotations[allocation.KeyNode]
	terminal := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	failed := pod.Annotations[allocation.KeyBindPhase] == string(allocation.PhaseFailed)
	keep := node != "" && pod.Spec.NodeName == "" && !terminal && !failed
	f.mu.Lock()
	defer f.mu.Unlock()
	old, had := f.nodeOf[pod.UID]
	if !keep && !had {
		return
	}
	if f.byNode == nil {
		f.byNode, f.nodeOf, f.ver = map[string]map[types.UID]*corev1.Pod{}, map[types.UID]string{}, map[string]uint64{}
	}
	if had {
		f.removeLocked(pod.UID, old)
	}
	if keep {
		m := f.byNode[node]
		if m == nil {
			m = map[types.UID]*corev1.Pod{}
			f.byNode[node] = m
		}
		m[pod.UID] = pod
		f.nodeOf[pod.UID] = node
		f.seq++
		f.ver[node] = f.seq
	}
}

func (f *foreignPods) forget(uid types.UID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if node, ok := f.nodeOf[uid]; ok {
		f.removeLocked(uid, node)
	}
}

func (f *foreignPods) removeLocked(uid types.UID, node string) {
	delete(f.byNode[node], uid)
	if len(f.byNode[node]) == 0 {
		delete(f.byNode, node)
	}
	delete(f.nodeOf, uid)
	f.seq++
	f.ver[node] = f.seq
}

// on returns the foreign pods of node and the node's version (it changes with them).
func (f *foreignPods) on(node string) ([]*corev1.Pod, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	m := f.byNode[node]
	if len(m) == 0 {
		return nil, f.ver[node]
	}
	out := make([]*corev1.Pod, 0, len(m))
	for _, p := range m {
		out = append(out, p)
	}
	return out, f.ver[node]
}

// version is node's version alone.
func (f *foreignPods) version(node string) uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.ver[node]
}
