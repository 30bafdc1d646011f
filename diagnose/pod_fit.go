package diagnose

// checkFit (P3) recomputes the fit when the filter found no node.
func (a *podAnalysis) checkFit() {}
