package nodelock

import (
	"context"
	"errors"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// QueueOptions configures a [Queue].
type QueueOptions struct {
	// Clock measures the waits. Default: clock.RealClock{}.
	Clock clock.WithTicker
}

// Queue is the scheduler's side of waiting for a node lock, shared by every bind of a
// process: the binds of one node queue for that node's turn (first come, first served), and
// the one whose turn it is tries [Locker.Acquire], and while another pod holds the lock waits
// for a change of the node rather than on a timer. The Node informer's handler
// ([Queue.NodeHandler]) wakes it when the node's lock annotation changes or the Node is added
// or deleted, the pod informer's ([Queue.PodGone]) when a pod of the node is deleted (a lock
// whose owner is gone may be taken over); then it tries again.
//
// A turn lasts until the caller's done function: the lock admits one pod per node until that
// pod's Allocate anyway, so the next bind of the node then finds the lock in the informer's copy
// of the Node and waits without a request. The extender's bind and the scheduler plugin's
// PreBind both use it. A Queue holds one channel per node with a bind waiting or in its turn,
// and is safe for concurrent use.
type Queue struct {
	locker *Locker
	clock  clock.WithTicker

	mu    sync.Mutex
	gates map[string]chan struct{} // node → its bind token (capacity 1)
	woken map[string]chan struct{} // node → closed at the node's next change
}

// NewQueue returns a Queue that takes locks with l.
func NewQueue(l *Locker, opts QueueOptions) *Queue {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Queue{locker: l, clock: opts.Clock, gates: map[string]chan struct{}{}, woken: map[string]chan struct{}{}}
}

// Acquire waits for node's turn, then takes node's lock for pod, waiting up to wait (from the
// call) while another live pod holds it. done ends the turn; call it once the bind has written
// what the device plugin reads (calling it more than once is harmless). wait <= 0 neither
// queues nor waits: one try. On ctx's end or at the deadline it returns the last
// [Locker.Acquire] error (wrapping [ErrLocked] when the node stayed locked), or ctx's error
// when no try was made; the turn is then already given back.
func (q *Queue) Acquire(ctx context.Context, node string, pod types.NamespacedName, wait time.Duration) (done func(), err error) {
	deadline := q.clock.Now().Add(wait)
	done = func() {}
	if wait > 0 {
		gate := q.gate(node)
		t := q.clock.NewTimer(wait)
		select {
		case gate <- struct{}{}:
			t.Stop()
			var once sync.Once
			done = func() { once.Do(func() { <-gate }) }
		case <-t.C(): // no turn within wait: one try anyway, as at the deadline
		case <-ctx.Done():
			t.Stop()
			return nil, context.Cause(ctx)
		}
	}
	for {
		changed := q.changed(node) // before the try: a change during it wakes the wait
		err := q.locker.Acquire(ctx, node, pod)
		if err == nil {
			return done, nil
		}
		if !errors.Is(err, ErrLocked) || !q.clock.Now().Before(deadline) {
			done()
			return nil, err
		}
		klog.FromContext(ctx).V(4).Info("Node locked by another pod, waiting", "node", node, "err", err.Error())
		t := q.clock.NewTimer(deadline.Sub(q.clock.Now()))
		select {
		case <-ctx.Done():
			t.Stop()
			done()
			return nil, err
		case <-changed:
			t.Stop()
		case <-t.C(): // one last try at the deadline
		}
	}
}

// Notify wakes the binds waiting for node's lock: it may have changed.
func (q *Queue) Notify(node string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ch, ok := q.woken[node]; ok {
		close(ch)
		delete(q.woken, node)
	}
}

// NodeHandler is the handler to register on the Node informer whose lister the [Locker] reads
// (Options.Nodes): a Node added or deleted, or its lock annotation changed, wakes the node's
// waiting binds. The informer updates its store before it calls handlers, so a woken bind reads
// the change.
func (q *Queue) NodeHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if n, ok := obj.(*corev1.Node); ok {
				q.Notify(n.Name)
			}
		},
		UpdateFunc: func(o, n any) {
			on, ok1 := o.(*corev1.Node)
			nn, ok2 := n.(*corev1.Node)
			if ok1 && ok2 && on.Annotations[Key] != nn.Annotations[Key] {
				q.Notify(nn.Name)
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if n, ok := obj.(*corev1.Node); ok {
				q.Notify(n.Name)
			}
		},
	}
}

// PodGone wakes the binds waiting on the node of a deleted pod (its spec.nodeName, and the node
// its hami.io/vgpu-node annotation names): a lock whose owner no longer exists may be taken
// over. Call it from the pod informer's delete handler; nil is ignored.
func (q *Queue) PodGone(pod *corev1.Pod) {
	if pod == nil {
		return
	}
	if node := pod.Annotations[keyVGPUNode]; node != "" {
		q.Notify(node)
	}
	if pod.Spec.NodeName != "" {
		q.Notify(pod.Spec.NodeName)
	}
}

// keyVGPUNode is HAMi's pod annotation naming the node the scheduler chose
// (allocation.KeyNode; nodelock does not import allocation).
const keyVGPUNode = "hami.io/vgpu-node"

// changed returns the channel closed at node's next [Queue.Notify]. Take it before reading the
// lock, so that a change between the read and the wait is not missed.
func (q *Queue) changed(node string) <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	ch, ok := q.woken[node]
	if !ok {
		ch = make(chan struct{})
		q.woken[node] = ch
	}
	return ch
}

// gate returns node's bind token.
func (q *Queue) gate(node string) chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	g, ok := q.gates[node]
	if !ok {
		g = make(chan struct{}, 1)
		q.gates[node] = g
	}
	return g
}
