package schedcache

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/hamireg/hamireg/handshake"
)

// Handshaker makes the handshake writes a [Cache] decides: the leader-only part of HAMi's
// register loop (stamp "Requesting_<now>", clean up an expired node). The cache decides on
// every replica and keeps the decisions; a Handshaker makes them while its Run runs, so run it
// on the leader only: as the OnStartedLeading callback of client-go's leader election
// (`OnStartedLeading: func(ctx context.Context) { _ = h.Run(ctx) }`), through [Elector] or
// [LeaseFollower], or directly with HAMi's --leader-elect=false.
//
// Run may be called again after it returned (a new leadership term); a second concurrent Run,
// or a second Handshaker running on the same cache, returns [ErrAlreadyRunning].
type Handshaker struct {
	client  kubernetes.Interface
	cache   *Cache
	opts    HandshakerOptions
	running atomic.Bool
}

// writer is the running Handshaker's queue, attached to the cache while Run runs.
type writer struct {
	h     *Handshaker
	queue workqueue.TypedRateLimitingInterface[writeKey]
	// bucket limits first tries; retries go through the queue's rate limiter, which includes it.
	bucket workqueue.TypedRateLimiter[writeKey]
}

// NewHandshaker returns a Handshaker that writes the handshakes c decides through client. It
// starts nothing.
func NewHandshaker(client kubernetes.Interface, c *Cache, opts HandshakerOptions) (*Handshaker, error) {
	if client == nil || c == nil {
		return nil, fmt.Errorf("new handshaker: nil client or cache: %w", ErrInvalidOptions)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("new handshaker: %w", err)
	}
	return &Handshaker{client: client, cache: c, opts: opts}, nil
}

// Run makes the cache's handshake writes until ctx is done. It waits for the cache to sync,
// re-evaluates every node at once (a new leader writes from its first cycle, as HAMi's
// "Received leaderElection notification" does), queues every write decided and not made, and
// then every write the cache decides. It returns nil on cancellation, after its write workers
// ended; an interrupted write is retried by the next Run.
func (h *Handshaker) Run(ctx context.Context) error {
	if !h.running.CompareAndSwap(false, true) {
		return fmt.Errorf("run handshaker: %w", ErrAlreadyRunning)
	}
	defer h.running.Store(false)
	c := h.cache
	select {
	case <-ctx.Done():
		return nil
	case <-c.Synced():
	}
	w := &writer{h: h, bucket: &clockBucket{clock: c.opts.Clock, limiter: rate.NewLimiter(rate.Limit(h.opts.WriteQPS), h.opts.WriteBurst)}}
	w.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedMaxOfRateLimiter(
			workqueue.NewTypedItemExponentialFailureRateLimiter[writeKey](5*time.Millisecond, 5*time.Minute),
			w.bucket,
		),
		workqueue.TypedRateLimitingQueueConfig[writeKey]{Clock: c.opts.Clock})
	c.qmu.Lock()
	if c.writer != nil {
		c.qmu.Unlock()
		w.queue.ShutDown()
		return fmt.Errorf("run handshaker: another handshaker writes for this cache: %w", ErrAlreadyRunning)
	}
	c.writer = w
	c.qmu.Unlock()

	var wg sync.WaitGroup
	for range h.opts.WriteWorkers {
		wg.Go(func() { h.worker(ctx, w.queue) })
	}
	klog.FromContext(ctx).V(5).Info("Received leaderElection notification. We are just elected to leader")
	c.cycle(ctx)
	c.enqueuePending()
	<-ctx.Done()

	c.qmu.Lock()
	c.writer = nil
	c.qmu.Unlock()
	w.queue.ShutDown()
	wg.Wait()
	// What was queued and not written is queued again by the next Run.
	c.wmu.Lock()
	for _, p := range c.pending {
		p.queued = false
	}
	c.wmu.Unlock()
	return nil
}

// clockBucket is client-go's token bucket rate limiter on an injected clock.
type clockBucket struct {
	clock   clock.PassiveClock
	limiter *rate.Limiter
}

func (b *clockBucket) When(writeKey) time.Duration {
	now := b.clock.Now()
	return b.limiter.ReserveN(now, 1).DelayFrom(now)
}
func (b *clockBucket) Forget(writeKey)          {}
func (b *clockBucket) NumRequeues(writeKey) int { return 0 }

// writeKey names one handshake annotation: a node and the index of a vendor in Options.Vendors.
type writeKey struct {
	node   string
	vendor int
}

// pendingWrite is a handshake write that was decided and not yet confirmed by the informer.
type pendingWrite struct {
	action handshake.Action
	value  string
	delete bool
	// basisRaw/basisOK is the handshake value the decision was made on; the write is dropped
	// when the Node no longer carries it (a newer value is on its way to the cache).
	basisRaw string
	basisOK  bool
	queued   bool // in the write queue
	done     bool // written; kept until the informer delivers the new value
}

func (w *pendingWrite) sameDecision(o *pendingWrite) bool {
	return w.action == o.action && w.delete == o.delete && w.basisRaw == o.basisRaw && w.basisOK == o.basisOK
}

// want records a decided write and queues it when a Handshaker runs. The same decision on the
// same handshake value is queued once, however many cycles repeat it.
func (c *Cache) want(ctx context.Context, k writeKey, w pendingWrite) {
	c.wmu.Lock()
	p := c.pending[k]
	switch {
	case p == nil || !p.sameDecision(&w):
		p = &w
		c.pending[k] = p
	case !p.done:
		p.value = w.value // not written yet: write the latest decision's time
	}
	skip := p.done || p.queued
	c.wmu.Unlock()
	if skip {
		return
	}
	if !c.enqueueWrite(k) {
		c.stats.skippedNotLeader.Add(1)
		if v5 := klog.FromContext(ctx).V(5); v5.Enabled() {
			v5.Info("Scheduler is not leader yet, skipping ...", "nodeName", k.node, "deviceVendor", c.vendors[k.vendor].Name, "action", w.action.String())
		}
	}
}

// enqueueWrite queues k unless it is queued already; it reports false when no Handshaker runs.
// A first try waits only for the overall rate limit.
func (c *Cache) enqueueWrite(k writeKey) bool {
	c.qmu.RLock()
	w := c.writer
	c.qmu.RUnlock()
	if w == nil {
		return false
	}
	c.wmu.Lock()
	p := c.pending[k]
	if p == nil || p.done || p.queued {
		c.wmu.Unlock()
		return true
	}
	p.queued = true
	c.wmu.Unlock()
	w.queue.AddAfter(k, w.bucket.When(k))
	return true
}

// enqueuePending queues every write that is decided and not yet made (a new leader's first cycle).
func (c *Cache) enqueuePending() {
	c.wmu.Lock()
	keys := make([]writeKey, 0, len(c.pending))
	for k, p := range c.pending {
		if !p.done && !p.queued {
			keys = append(keys, k)
		}
	}
	c.wmu.Unlock()
	for _, k := range keys {
		c.enqueueWrite(k)
	}
}

func (c *Cache) dropPending(k writeKey) {
	c.wmu.Lock()
	delete(c.pending, k)
	c.wmu.Unlock()
}

func (h *Handshaker) worker(ctx context.Context, q workqueue.TypedRateLimitingInterface[writeKey]) {
	c := h.cache
	for {
		k, shutdown := q.Get()
		if shutdown {
			return
		}
		if h.write(ctx, k) {
			q.Forget(k)
		} else {
			c.wmu.Lock()
			if p := c.pending[k]; p != nil {
				p.queued = true
			}
			c.wmu.Unlock()
			q.AddRateLimited(k)
		}
		q.Done(k)
	}
}

// write makes one pending handshake write; it returns false when it should be retried.
func (h *Handshaker) write(ctx context.Context, k writeKey) bool {
	c := h.cache
	v := &c.vendors[k.vendor]
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "nodeName", k.node, "deviceVendor", v.Name)
	c.wmu.Lock()
	p := c.pending[k]
	var w pendingWrite
	if p != nil {
		p.queued = false
		w = *p
	}
	c.wmu.Unlock()
	if p == nil || w.done {
		return true
	}
	if ctx.Err() != nil { // the term ended: the next Run writes it
		return true
	}
	node, err := c.lister.Get(k.node)
	if err != nil {
		c.dropPending(k)
		return true
	}
	if cur, ok := node.Annotations[v.HandshakeKey]; cur != w.basisRaw || ok != w.basisOK {
		logger.V(5).Info("Handshake changed since the decision, leaving it to the next event", "handshake", cur)
		return true
	}
	var value any = w.value
	if w.delete {
		value = nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{v.HandshakeKey: value}}})
	if err != nil {
		logger.Error(err, "Failed to build handshake patch")
		return true
	}
	if w.action == handshake.ActionStamp {
		logger.V(5).Info("New timestamp for annotation", "key", v.HandshakeKey, "value", w.value)
	}
	logger.V(5).Info("Patching node annotations", "patch", string(patch))
	_, err = h.client.CoreV1().Nodes().Patch(ctx, k.node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: h.opts.FieldManager})
	c.metrics.write(v.Name, w.action.String(), err)
	switch {
	case apierrors.IsNotFound(err):
		c.dropPending(k)
		return true
	case err != nil && ctx.Err() != nil:
		return true
	case err != nil:
		c.stats.writeErrors.Add(1)
		logger.Error(fmt.Errorf("patch node %s handshake: %w", k.node, err), "Failed to patch node annotations")
		return false
	}
	if w.action == handshake.ActionCleanup {
		c.stats.cleanups.Add(1)
	} else {
		c.stats.stamps.Add(1)
	}
	c.wmu.Lock()
	if c.pending[k] == p {
		p.done = true
	}
	c.wmu.Unlock()
	return true
}
