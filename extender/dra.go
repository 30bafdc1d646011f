package extender

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/dra"
)

// ReasonDRANode starts the filter's reason for a DRA node (one that serves the vendor's count
// resource through DRA, see [Extender.Filter]) that a pod asking for a share of a GPU cannot
// use.
const ReasonDRANode = "node serves the GPU count through DRA"

// mapping is what the extended-resource mapping (KEP-5004) says of the vendor's count
// resource at one moment: the class that maps it, and the classes it was read from.
type mapping struct {
	resource corev1.ResourceName
	class    *resourcev1.DeviceClass // nil: no class maps the resource
	classes  []*resourcev1.DeviceClass
}

// mapping reads the DeviceClasses (Options.DeviceClasses); a zero class without them.
func (e *Extender) mapping() mapping {
	m := mapping{resource: corev1.ResourceName(e.opts.Config.ResourceCount)}
	if e.classLister == nil {
		return m
	}
	classes, err := e.classLister.List(labels.Everything())
	if err != nil {
		return m
	}
	m.classes, m.class = classes, dra.MappingClass(m.resource, classes)
	return m
}

// draNode reports whether node serves m's resource through DRA (dra.ServedThroughDRA),
// reading the Node from the node cache's informer; a Node the informer does not hold (another
// label selector) is not a DRA node.
func (e *Extender) draNode(m mapping, node string) bool {
	if m.class == nil {
		return false
	}
	obj, ok, err := e.cache.Informer().GetIndexer().GetByKey(node)
	if err != nil || !ok {
		return false
	}
	n, ok := obj.(*corev1.Node)
	return ok && dra.ServedThroughDRA(m.resource, n.Status.Allocatable, m.classes)
}

// splitDRA splits the candidates into those fitted HAMi's way and the DRA nodes.
func (e *Extender) splitDRA(m mapping, names []string) (fitted, draNodes []string) {
	if m.class == nil {
		return names, nil
	}
	fitted = make([]string, 0, len(names))
	for _, n := range names {
		if e.draNode(m, n) {
			draNodes = append(draNodes, n)
		} else {
			fitted = append(fitted, n)
		}
	}
	return fitted, draNodes
}

// toDRA answers a filter in which no candidate fitted HAMi's way (d) but some serve the count
// resource through DRA: a whole-GPU ask passes them, untouched, for kube-scheduler's
// DynamicResources plugin, which already allocated its claim there; a shared ask fails them
// with the fix.
func (e *Extender) toDRA(ctx context.Context, pod *corev1.Pod, m mapping, d decision, draNodes []string) *extenderv1.ExtenderFilterResult {
	logger := klog.FromContext(ctx)
	res := failedResult(d.failed)
	whole, shared := allocation.WholeGPUs(pod, e.opts.Config)
	if whole {
		slices.Sort(draNodes)
		res.NodeNames = &draNodes
		logger.V(3).Info("Pod left to kube-scheduler's DRA path", "pod", klog.KObj(pod), "nodes", draNodes, "deviceClass", m.class.Name)
		if e.opts.EventRecorder != nil {
			e.opts.EventRecorder.Eventf(pod, corev1.EventTypeNormal, EventFilteringSucceed, "node(s) %s serve %s through DRA (DeviceClass %s), %d nodes not fit",
				strings.Join(draNodes, ","), m.resource, m.class.Name, len(d.failed))
		}
		return res
	}
	reason := fmt.Sprintf("%s: DeviceClass %s maps %s and the node's allocatable has none, so its claim takes whole GPUs and cannot carry %s; "+
		"write a ResourceClaim of DeviceClass %s with capacity requests (memory, cores) and name it in spec.resourceClaims, or ask whole GPUs",
		ReasonDRANode, m.class.Name, m.resource, shared, m.class.Name)
	if res.FailedAndUnresolvableNodes == nil {
		res.FailedAndUnresolvableNodes = extenderv1.FailedNodesMap{}
	}
	failed := make(map[string]string, len(d.failed)+len(draNodes))
	for n, r := range d.failed {
		failed[n] = r
	}
	for _, n := range draNodes {
		res.FailedAndUnresolvableNodes[n] = reason
		failed[n] = reason
	}
	logger.V(2).Info("No node fits the pod; its share of a GPU cannot be served by the DRA nodes", "pod", klog.KObj(pod), "draNodes", len(draNodes), "resource", shared)
	e.recordFailure(pod, failed)
	return res
}

// bindDRA binds a pod to a DRA node: a plain Binding, without HAMi's bind annotations and
// without the node lock (no device plugin Allocate releases it there: the kubelet's DRA
// manager prepares the claim kube-scheduler allocated).
func (e *Extender) bindDRA(ctx context.Context, pod *corev1.Pod, node string) error {
	name := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}
	if err := e.client.CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("bind %s to DRA node %s: create binding: %w", name, node, err)
	}
	return nil
}
