package allocation

import (
	corev1 "k8s.io/api/core/v1"
)

// WholeGPUs reports whether pod asks for c.ResourceCount in whole GPUs only: the ask that a
// claim kube-scheduler writes from a DeviceClass's extendedResourceName (KEP-5004) serves,
// one whole device per unit. Every container (init containers included) that asks for the
// count resource must ask a memory percentage (c.ResourceMemoryPercentage) of 100 or, without
// one, no memory (c.ResourceMemory) — HAMi's rule: the percentage decides when present — and
// cores (c.ResourceCores) of 100 or none (HAMi's webhook adds 100 to a whole-GPU ask). Each resource is read from the limits, else
// the requests, as [Requests] reads it; c's DefaultMemory and DefaultCores do not apply (the
// claim gives the whole GPU whatever the chart's defaults). Otherwise it returns false and
// the first resource, in container order, that makes the ask a share. A pod that asks for no
// GPU is not a whole-GPU ask (false, ""). c is completed with [Config.WithDefaults].
func WholeGPUs(pod *corev1.Pod, c Config) (bool, string) {
	c = c.orDefaults()
	if pod == nil {
		return false, ""
	}
	asks := false
	ctrs := make([]*corev1.Container, 0, len(pod.Spec.InitContainers)+len(pod.Spec.Containers))
	for i := range pod.Spec.InitContainers {
		ctrs = append(ctrs, &pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		ctrs = append(ctrs, &pod.Spec.Containers[i])
	}
	for _, ctr := range ctrs {
		q, ok := quantity(ctr, c.ResourceCount)
		if !ok || q.Sign() <= 0 {
			continue
		}
		asks = true
		// HAMi's rule: a memory percentage decides when present, else any memory is a share.
		if pct, ok := quantity(ctr, c.ResourceMemoryPercentage); ok && c.ResourceMemoryPercentage != "" {
			if pct.CmpInt64(100) != 0 {
				return false, c.ResourceMemoryPercentage
			}
		} else if _, ok := quantity(ctr, c.ResourceMemory); ok && c.ResourceMemory != "" {
			return false, c.ResourceMemory
		}
		if q, ok := quantity(ctr, c.ResourceCores); ok && c.ResourceCores != "" && q.CmpInt64(100) != 0 {
			return false, c.ResourceCores
		}
	}
	return asks, ""
}
