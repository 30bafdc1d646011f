package diagnose

// checkLock (P4) reads the node lock on the pod's node and says whether it stops the pod.
func (a *podAnalysis) checkLock() {}

// checkAllocateWait (P5) explains a bound pod whose Allocate did not come.
func (a *podAnalysis) checkAllocateWait() {}

// checkAdmission (P6) explains a pod the kubelet failed at admission.
func (a *podAnalysis) checkAdmission() {}

// checkStaleAssignment (P7) explains a filtered pod that was never bound.
func (a *podAnalysis) checkStaleAssignment() {}
