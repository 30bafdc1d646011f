package extender

import (
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/hamireg/hamireg/allocation"
)

// failedResult is the answer when no candidate fits: each candidate with its reason, in
// FailedAndUnresolvableNodes when removing pods from it cannot make the pod fit
// (allocation.Unresolvable: unregistered nodes, and fit reasons about the GPUs themselves),
// else in FailedNodes, where kube-scheduler's preemption may free it. HAMi puts every
// candidate in FailedNodes; the two maps together are HAMi's.
func failedResult(failed map[string]string) *extenderv1.ExtenderFilterResult {
	res := &extenderv1.ExtenderFilterResult{}
	for node, reason := range failed {
		m := &res.FailedNodes
		if allocation.Unresolvable(reason) {
			m = &res.FailedAndUnresolvableNodes
		}
		if *m == nil {
			*m = extenderv1.FailedNodesMap{}
		}
		(*m)[node] = reason
	}
	return res
}
