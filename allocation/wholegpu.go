package allocation

import (
	corev1 "k8s.io/api/core/v1"
)

// WholeGPUs reports whether pod asks for c.ResourceCount in whole GPUs only: the ask that a
// claim kube-scheduler writes from a DeviceClass's extendedResourceName (KEP-5004) serves,
// one whole device per unit. Every container (init containers included) that asks for the
// count resource must ask no memory (c.ResourceMemory), a memory percentage
// (c.ResourceMemoryPercentage) of 100 or none, and cores (c.ResourceCores) of 100 or none
// (HAMi's webhook adds 100 to a whole-GPU ask). Each resource is read from the limits, else
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
		if _, ok := quantity(ctr, c.ResourceMemory); ok && c.ResourceMemory != "" {
			return false, c.ResourceMemory
		}
		for _, name := range []string{c.ResourceMemoryPercentage, c.ResourceCores} {
			if name == "" {
				continue
			}
			if q, ok := quantity(ctr, name); ok && q.CmpInt64(100) != 0 {
				return false, name
			}
		}
	}
	return asks, ""
}
