package schedcache

import corev1 "k8s.io/api/core/v1"

// TrimNode is the informer transform that [New] installs on the Node informer unless
// Options.KeepNodeFields is set. It drops what neither the cache nor a scheduler extender reads
// and what dominates the memory of a real Node object:
//
//   - metadata.managedFields (server-side apply bookkeeping, often larger than the rest), and
//   - status.images (every image on the node with its digests and size; up to 50 entries as the
//     kubelet reports them).
//
// Everything else (labels, annotations, capacity, allocatable, conditions, addresses, taints)
// is kept. The object is modified in place, which client-go allows for transforms: the
// reflector hands over a freshly decoded object. Objects other than *corev1.Node (such as a
// cache.DeletedFinalStateUnknown tombstone) are returned unchanged.
//
// Because the transform applies to the whole shared informer, set KeepNodeFields when the same
// informer also feeds code that reads images (kube-scheduler's ImageLocality plugin) or
// managedFields, and install TrimNode yourself where it fits.
func TrimNode(obj any) (any, error) {
	if node, ok := obj.(*corev1.Node); ok {
		node.ManagedFields = nil
		node.Status.Images = nil
	}
	return obj, nil
}
