// Package usage is the scheduler's incremental record of what pods hold: per node and GPU
// (split slots, memory, cores), which pods share a GPU, and per namespace what the pods hold
// against the namespace's ResourceQuota on GPU memory and cores, with the namespace's limits
// read from its ResourceQuota objects. Package extender keeps its filter's usage in a
// [Tracker], and so does the kube-scheduler framework plugin (module schedplugin). Both serve
// HAMi's scheduler metric families from their tracker with [NewHAMiCollector] (byte-exact per
// HAMi version; the registered nodes come from schedcache's Snapshot.Registered) and
// [NewBuildInfoCollector].
//
// Lifecycle: [New] returns an empty tracker, which the caller feeds from informers: pod adds
// and updates to [Tracker.Observe] (skip updates for which [Tracker.Changed] is false), pod
// deletes to [Tracker.Delete], ResourceQuota adds and updates to [Tracker.SetQuota], deletes
// to [Tracker.DeleteQuota]. A scheduler that places a pod calls [Tracker.Assume] before it
// answers (or in Reserve), so that the next decision counts the pod before the informer
// delivers its annotations, and calls the returned undo when the patch or the bind fails
// (Unreserve). A pod whose bind failed after its annotations were written keeps holding them,
// as HAMi counts it, until it is assumed again or deleted. For a decision that must see every
// node and the namespace as of one moment and assume its choice before anything else changes,
// [Tracker.Lock] returns a [View]:
//
//	v := tracker.Lock()
//	q := v.Quota(pod.Namespace, usage.Key(pod.Namespace, pod.Name)) // without the pod itself
//	used, _ := v.Node(node)
//	devs := allocation.SetMIGUsage(allocation.WithUsage(devices, used), v.MIG(node)) // MIG placements held
//	_, _, fits := allocation.FitWith(devs, req, pod.Annotations, nil, cfg, allocation.FitOptions{Quota: &q})
//	var undo func()
//	if fits {
//		undo = v.Assume(pod, node, pd)
//	}
//	v.Unlock()
//
// Usage is read as HAMi's scheduler reads it: from the pod's hami.io/vgpu-node annotation and
// the vendor's allocated device list, while the pod has not Succeeded or Failed, and, for
// MIG, the placements of its hami.io/vgpu-mig-allocations reservation ([View.MIG],
// [Tracker.MIG]). A pod's init containers and native sidecars count by Config.Accounting
// (allocation.EffectiveUsage): by default the Kubernetes rule per GPU, shrinking to the app
// containers and sidecars once every regular init container exited 0; with
// allocation.AccountingHAMi exactly as HAMi's version counts them. Where HAMi is wrong, the
// tracker differs (each in a test):
//
//   - A pod assumed with MIG devices holds their placements at once (HAMi's cache keeps the
//     chosen devices without the reservation, and the next filter marks the GPU unhealthy).
//   - A reservation that does not decode, or names a device the pod's list does not have, is
//     reported to [Options].DecodeFailed and the pod keeps its devices with unknown
//     placements, which allocation's fit counts as occupying the whole MIG GPU (HAMi drops the
//     error and marks the GPU unhealthy for every pod). A reservation naming a GPU that is not
//     in MIG mode is kept, and only MIG GPUs read it.
//   - A re-scheduled pod counts once: Assume replaces what it held, and [View.Quota] leaves the
//     pod itself out (HAMi v2.9.0 counts it twice and then refuses it, until restart).
//   - Several ResourceQuota objects of a namespace combine as the tightest limit, and deleting
//     one leaves the others in force (HAMi keeps the object delivered last, and deleting
//     either removes the limit). A fractional limit limits to its integer part (HAMi ignores
//     it); see [allocation.QuotaLimitsFrom].
//   - A pod whose bind failed before it got a node (bind-phase "failed" without
//     spec.nodeName) holds nothing until it is placed again (HAMi counts it until then).
//   - A namespace's entry goes when it holds nothing and has no quota (HAMi keeps one for every
//     namespace it saw, until restart).
//
// Concurrency: every method is safe for concurrent use; a View holds the tracker's lock.
package usage
