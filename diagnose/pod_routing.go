package diagnose

// HAMi's Event reasons on pods (package extender records the same; diagnose does not import it).
const (
	eventFilteringSucceed = "FilteringSucceed"
	eventFilteringFailed  = "FilteringFailed"
	eventBindingSucceed   = "BindingSucceed"
	eventBindingFailed    = "BindingFailed"
	eventFailedScheduling = "FailedScheduling"
)

// checkRouting (P1) explains why the pod is not scheduled by HAMi's scheduler.
func (a *podAnalysis) checkRouting() {}

// checkScheduler (P2) checks that kube-scheduler can reach the extender.
func (a *podAnalysis) checkScheduler() {}

// checkLimits (P8) checks that a running pod runs with HAMi's limits.
func (a *podAnalysis) checkLimits() {}

// checkHandOver hands a pod stopped before S1 without FilteringFailed over to the node
// diagnosis of the candidate nodes.
func (a *podAnalysis) checkHandOver() {}
