package extender

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/nodelock"
)

// lockSignals tells a bind waiting for a node lock when to try again: one channel per node,
// closed when the node's lock may have changed and then replaced (any number of waiters, as
// schedcache.Term). A channel exists only from a waiter's first look until the next change of
// that node, so the map holds at most the nodes that binds waited for.
type lockSignals struct {
	mu    sync.Mutex
	chans map[string]chan struct{}
}

// changed returns the channel that is closed at node's next change. Take it before reading the
// lock, so that a change between the read and the wait is not missed.
func (s *lockSignals) changed(node string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.chans == nil {
		s.chans = map[string]chan struct{}{}
	}
	ch, ok := s.chans[node]
	if !ok {
		ch = make(chan struct{})
		s.chans[node] = ch
	}
	return ch
}

// notify wakes the waiters of node.
func (s *lockSignals) notify(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch, ok := s.chans[node]; ok {
		close(ch)
		delete(s.chans, node)
	}
}

// watchNodeLocks registers the handler that wakes waiting binds on the node cache's Node
// informer: a Node added or deleted, or its lock annotation changed. The informer updates its
// store before it calls handlers, so a woken bind reads the change (nodelock reads
// Options.Nodes, the same informer's lister in the usual setup).
func (e *Extender) watchNodeLocks(logger klog.Logger) (cache.ResourceEventHandlerRegistration, error) {
	return cache.NewTypedSharedIndexInformer[*corev1.Node](e.cache.Informer()).AddTypedEventHandler(cache.TypedResourceEventHandlerFuncs[*corev1.Node]{
		AddFunc: func(n *corev1.Node) { e.locks.notify(n.Name) },
		UpdateFunc: func(o, n *corev1.Node) {
			if o.Annotations[nodelock.Key] != n.Annotations[nodelock.Key] {
				e.locks.notify(n.Name)
			}
		},
		DeleteFunc: func(obj cache.DeletedObject[*corev1.Node]) { e.locks.notify(obj.GetName()) },
	}, cache.HandlerOptions{Logger: &logger})
}

// podGone wakes the binds waiting on the node of a deleted pod: a lock whose owner no longer
// exists may be taken over (nodelock reads the owner from the same pod informer).
func (e *Extender) podGone(p *corev1.Pod) {
	if p == nil {
		return
	}
	if node, ok := p.Annotations[allocation.KeyNode]; ok {
		e.locks.notify(node)
	}
	if p.Spec.NodeName != "" {
		e.locks.notify(p.Spec.NodeName)
	}
}
