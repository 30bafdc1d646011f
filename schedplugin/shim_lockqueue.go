package schedplugin

import (
	"context"
	"errors"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/nodelock"
)

// lockQueue is a stand-in for nodelock.Queue until it lands on main: a per-node FIFO gate in
// front of the Locker and a wake-up channel per node.
type lockQueue struct {
	locker *nodelock.Locker
	clock  clock.Clock

	mu    sync.Mutex
	gates map[string]chan struct{}
	chans map[string]chan struct{}
}

func newLockQueue(l *nodelock.Locker, clk clock.Clock) *lockQueue {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &lockQueue{locker: l, clock: clk, gates: map[string]chan struct{}{}, chans: map[string]chan struct{}{}}
}

func (q *lockQueue) gate(node string) chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	g, ok := q.gates[node]
	if !ok {
		g = make(chan struct{}, 1)
		q.gates[node] = g
	}
	return g
}

func (q *lockQueue) changed(node string) <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	ch, ok := q.chans[node]
	if !ok {
		ch = make(chan struct{})
		q.chans[node] = ch
	}
	return ch
}

// Notify wakes the binds waiting for node's lock.
func (q *lockQueue) Notify(node string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ch, ok := q.chans[node]; ok {
		close(ch)
		delete(q.chans, node)
	}
}

// Acquire queues behind the other binds of node, then takes the lock for pod, waiting up to
// wait for it to be released; done ends the bind's turn.
func (q *lockQueue) Acquire(ctx context.Context, node string, pod types.NamespacedName, wait time.Duration) (func(), error) {
	deadline := q.clock.Now().Add(wait)
	done := func() {}
	gate := q.gate(node)
	t := q.clock.NewTimer(wait)
	select {
	case gate <- struct{}{}:
		var once sync.Once
		done = func() { once.Do(func() { <-gate }) }
	case <-t.C():
	case <-ctx.Done():
	}
	t.Stop()
	for {
		changed := q.changed(node)
		err := q.locker.Acquire(ctx, node, pod)
		if err == nil {
			return done, nil
		}
		if !errors.Is(err, nodelock.ErrLocked) || !q.clock.Now().Before(deadline) || ctx.Err() != nil {
			done()
			return nil, err
		}
		t := q.clock.NewTimer(deadline.Sub(q.clock.Now()))
		select {
		case <-ctx.Done():
			t.Stop()
			done()
			return nil, err
		case <-changed:
		case <-t.C():
		}
		t.Stop()
	}
}

// NodeHandler wakes waiters on a Node add, delete or lock change.
func (q *lockQueue) NodeHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if n, ok := obj.(*corev1.Node); ok {
				q.Notify(n.Name)
			}
		},
		UpdateFunc: func(o, n any) {
			on, ok1 := o.(*corev1.Node)
			nn, ok2 := n.(*corev1.Node)
			if ok1 && ok2 && on.Annotations[nodelock.Key] != nn.Annotations[nodelock.Key] {
				q.Notify(nn.Name)
			}
		},
		DeleteFunc: func(obj any) {
			if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
				q.Notify(key)
			}
		},
	}
}

// PodGone wakes the waiters of a deleted pod's node(s).
func (q *lockQueue) PodGone(pod *corev1.Pod) {
	if pod == nil {
		return
	}
	if n := pod.Annotations[allocation.KeyNode]; n != "" {
		q.Notify(n)
	}
	if pod.Spec.NodeName != "" {
		q.Notify(pod.Spec.NodeName)
	}
}
