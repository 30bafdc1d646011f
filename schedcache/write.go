package schedcache

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/handshake"
)

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

// writeLimiter limits handshake writes overall (token bucket) and backs off per node on errors.
func (c *Cache) writeLimiter() workqueue.TypedRateLimiter[writeKey] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[writeKey](5*time.Millisecond, 5*time.Minute),
		&workqueue.TypedBucketRateLimiter[writeKey]{Limiter: rate.NewLimiter(rate.Limit(c.opts.WriteQPS), c.opts.WriteBurst)},
	)
}

// want records a decided write and queues it when this replica leads. The same decision on
// the same handshake value is queued once, however many cycles repeat it.
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
	if !c.opts.Leader.IsLeader() {
		c.stats.skippedNotLeader.Add(1)
		if v5 := klog.FromContext(ctx).V(5); v5.Enabled() {
			v5.Info("Scheduler is not leader yet, skipping ...", "nodeName", k.node, "deviceVendor", c.vendors[k.vendor].Name, "action", w.action.String())
		}
		return
	}
	c.enqueueWrite(k)
}

// enqueueWrite queues k unless it is queued already.
func (c *Cache) enqueueWrite(k writeKey) {
	c.qmu.RLock()
	q := c.writes
	c.qmu.RUnlock()
	if q == nil {
		return
	}
	c.wmu.Lock()
	p := c.pending[k]
	if p == nil || p.done || p.queued {
		c.wmu.Unlock()
		return
	}
	p.queued = true
	c.wmu.Unlock()
	q.AddRateLimited(k)
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

func (c *Cache) writeWorker(ctx context.Context, q workqueue.TypedRateLimitingInterface[writeKey]) {
	for {
		k, shutdown := q.Get()
		if shutdown {
			return
		}
		if c.write(ctx, k) {
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
func (c *Cache) write(ctx context.Context, k writeKey) bool {
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
	if !c.opts.Leader.IsLeader() {
		c.stats.skippedNotLeader.Add(1)
		logger.V(5).Info("Scheduler is not leader yet, skipping ...", "action", w.action.String())
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
	_, err = c.client.CoreV1().Nodes().Patch(ctx, k.node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: c.opts.FieldManager})
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
