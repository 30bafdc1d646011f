package allocation

import "strings"

// Unresolvable reports whether a node that failed a pod with reason (a [Fit] reason or
// [ReasonNodeUnregistered] with the why after it) would still fail it with every other pod
// removed from the node: kube-scheduler's "unschedulable and unresolvable", for which
// preemption is not tried (the extender API's FailedAndUnresolvableNodes).
//
// The rule, by the words of the reason: a node without registered devices never fits; a node
// fits no better without pods when each word of its reason is about the GPUs themselves or the
// pod's own request, never about what other pods hold:
//
//   - unresolvable: [ReasonNodeInsufficientDevice] (fewer GPUs than a container asks for),
//     [ReasonCardTypeMismatch] (model or mode lists, vendor), [ReasonCardUUIDMismatch] (UUID
//     lists), [ReasonCardNotHealth], [ReasonCardCordoned], [ReasonCardNotFoundCustomFilterRule]
//     (a MIG GPU, never placed by the fit), and the two words that count GPUs which passed every
//     check but were too few, [ReasonNumaNotFit] and [ReasonAllocatedCardsInsufficientRequest]:
//     with fewer pods the same GPUs pass and the same ones fail.
//   - resolvable: [ReasonCardTimeSlicingExhausted], [ReasonCardInsufficientMemory],
//     [ReasonCardInsufficientCore], [ReasonCardComputeUnitsExhausted] and
//     [ReasonExclusiveDeviceAllocateConflict] depend on what pods hold; so do a quota
//     ("ResourceQuotaNotFit") and MIG placements ("CardMigTopologyInfeasible"). v2.9.0's
//     [ReasonNodeUnfitPod] says nothing, and a word this package does not know is taken as
//     resolvable too.
//
// One resolvable word makes the node resolvable. The rule errs only towards resolvable: a
// request larger than a whole GPU reads CardInsufficientMemory, and preemption is then tried in
// vain, but a node declared unresolvable never fits by removing pods (the fit checks what
// pods hold only after the per-GPU properties, so a GPU that fails on a property fails whatever
// it holds).
func Unresolvable(reason string) bool {
	if strings.HasPrefix(reason, ReasonNodeUnregistered) {
		return true
	}
	if reason == "" {
		return false
	}
	for part := range strings.SplitSeq(reason, ", ") {
		word := part
		if _, w, ok := strings.Cut(part, " "); ok {
			word = w
		}
		switch word {
		case ReasonNodeInsufficientDevice, ReasonCardTypeMismatch, ReasonCardUUIDMismatch, ReasonCardNotHealth,
			ReasonCardCordoned, ReasonCardNotFoundCustomFilterRule, ReasonNumaNotFit, ReasonAllocatedCardsInsufficientRequest:
		default:
			return false
		}
	}
	return true
}
