package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// ErrPodsNotSynced means the agent's pod informer has not listed the node's pods yet (or
// stopped): what MIG's release and DRA's ownership check need to know about live pods is
// unknown, so they act on nothing.
var ErrPodsNotSynced = errors.New("node pods not synced")

// nodePods is the agent's one informer of the pods bound to its node (field selector
// spec.nodeName), started by Run only when MIG or DRA reads it. It replaces a LIST per read:
// one LIST and one WATCH per node, however often MIG reconciles or claims are prepared.
type nodePods struct {
	node     string
	informer cache.SharedIndexInformer
	// synced is set once the informer's first LIST is in its store.
	synced atomic.Bool
}

// newNodePods returns the pod informer of node a.node; it starts nothing.
func newNodePods(a *Agent) *nodePods {
	selector := fields.OneTermEqualSelector("spec.nodeName", a.node).String()
	inf := coreinformers.NewFilteredPodInformer(a.client, metav1.NamespaceAll, 0, cache.Indexers{},
		func(o *metav1.ListOptions) { o.FieldSelector = selector })
	// The agent reads annotations, phase, node and names: the managed fields are dropped so a
	// busy node's cache stays small.
	_ = inf.SetTransform(func(obj any) (any, error) {
		if p, ok := obj.(*corev1.Pod); ok {
			p.ManagedFields = nil
		}
		return obj, nil
	})
	return &nodePods{node: a.node, informer: inf}
}

// run runs the informer until ctx ends.
func (p *nodePods) run(ctx context.Context) {
	p.informer.RunWithContext(ctx)
}

// waitSynced blocks until the informer has synced or ctx ends; it reports whether it synced.
func (p *nodePods) waitSynced(ctx context.Context) bool {
	if !cache.WaitForCacheSync(ctx.Done(), p.informer.HasSynced) {
		return false
	}
	p.synced.Store(true)
	klog.FromContext(ctx).V(2).Info("Node pods synced", "pods", len(p.informer.GetStore().ListKeys()))
	return true
}

// live returns the pods of the node that are not finished (phase Succeeded or Failed), from
// the informer's cache; the error wraps [ErrPodsNotSynced] before the first LIST.
func (p *nodePods) live() ([]*corev1.Pod, error) {
	if !p.synced.Load() || !p.informer.HasSynced() {
		return nil, fmt.Errorf("read the pods of node %s: %w", p.node, ErrPodsNotSynced)
	}
	var out []*corev1.Pod
	for _, obj := range p.informer.GetStore().List() {
		pod, ok := obj.(*corev1.Pod)
		if !ok || pod.Spec.NodeName != p.node || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		out = append(out, pod)
	}
	return out, nil
}

// has reports whether the informer's cache holds the pod key, finished or not.
func (p *nodePods) has(key types.NamespacedName) bool {
	_, ok, err := p.informer.GetStore().GetByKey(key.Namespace + "/" + key.Name)
	return ok && err == nil
}
