package allocation

import (
	"math"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hamireg/hamireg/annotation"
)

// PercentageUnset is the [Request.MemoryPercentage] of a container that asks for no memory
// percentage (HAMi's sentinel 101).
const PercentageUnset = 101

// Request is what one container asks of one vendor's devices (HAMi's ContainerDeviceRequest).
type Request struct {
	// Count is the number of GPUs; 0 means the container asks for none.
	Count int32
	// Type is the vendor word, [Config.Vendor] ("NVIDIA").
	Type string
	// Memory is the memory in MiB on each GPU; 0 when the percentage applies.
	Memory int32
	// MemoryPercentage is the share of each GPU's memory, or [PercentageUnset].
	MemoryPercentage int32
	// Cores is the core percentage on each GPU.
	Cores int32
	// Sidecar is true for a native sidecar: an init container with restartPolicy Always
	// (only meaningful among the [PodRequest]'s first Init containers; see [PodRequest.Kind]).
	Sidecar bool
}

// PodRequest is what a pod asks, container by container: init containers first, then the
// regular containers, in the order of the pod spec (the order of the pod device entries).
// Which init containers are native sidecars is in [Request.Sidecar] ([PodRequest.Kind]).
type PodRequest struct {
	Containers []Request
	// Init is how many of Containers are init containers.
	Init int
}

// Any reports whether some container asks for a GPU.
func (r PodRequest) Any() bool {
	for _, c := range r.Containers {
		if c.Count > 0 {
			return true
		}
	}
	return false
}

// Requests reads what pod asks of NVIDIA GPUs, the way HAMi's scheduler reads it: each resource
// from the container's limits, else its requests; a container without the count resource asks
// for nothing even if it names memory or cores (the admission webhook fills the count in).
// Memory is multiplied by c.MemoryFactor; a container that asks for neither memory nor a
// percentage gets c.DefaultMemory or, when that is 0, percentage 100; cores default to
// c.DefaultCores. An init container with restartPolicy Always is marked [Request.Sidecar].
// With [VersionMaster] a memory value that is not a non-negative 32-bit integer
// makes the container ask for nothing, a percentage above 100 is 100 and one at or below 0 is
// unset; with [VersionV290] a value that is not an integer is ignored. c is completed with
// [Config.WithDefaults]; an invalid c reads as the chart's defaults.
func Requests(pod *corev1.Pod, c Config) PodRequest {
	c = c.orDefaults()
	if pod == nil {
		return PodRequest{}
	}
	r := PodRequest{Init: len(pod.Spec.InitContainers)}
	r.Containers = make([]Request, 0, len(pod.Spec.InitContainers)+len(pod.Spec.Containers))
	for i := range pod.Spec.InitContainers {
		req := containerRequest(&pod.Spec.InitContainers[i], c)
		req.Sidecar = isSidecar(&pod.Spec.InitContainers[i])
		r.Containers = append(r.Containers, req)
	}
	for i := range pod.Spec.Containers {
		r.Containers = append(r.Containers, containerRequest(&pod.Spec.Containers[i], c))
	}
	return r
}

func (c Config) orDefaults() Config {
	if d, err := c.WithDefaults(); err == nil {
		return d
	}
	if c.Vendor != "" && c.Vendor != annotation.VendorNVIDIA {
		// Never NVIDIA's resource names in place of another vendor's: nothing is asked.
		return Config{Vendor: c.Vendor, Version: c.Version, DefaultGPUNum: 1, MemoryFactor: 1,
			GPUSchedulerPolicy: DefaultGPUSchedulerPolicy, NodeSchedulerPolicy: DefaultNodeSchedulerPolicy}
	}
	d, _ := Config{Version: c.Version}.WithDefaults()
	return d
}

func containerRequest(ctr *corev1.Container, c Config) Request {
	count, ok := quantity(ctr, c.ResourceCount)
	if !ok {
		return Request{}
	}
	n, ok := count.AsInt64()
	if !ok || n <= 0 {
		return Request{}
	}
	req := Request{Count: clamp32(n), Type: c.Vendor, MemoryPercentage: PercentageUnset, Cores: c.DefaultCores}
	if q, ok := quantity(ctr, c.ResourceMemory); ok && c.ResourceMemory != "" {
		mem, isInt := q.AsInt64()
		switch {
		case c.Version == VersionMaster && (!isInt || mem < 0 || mem > math.MaxInt32):
			return Request{}
		case isInt:
			if c.MemoryFactor > 1 {
				mem *= int64(c.MemoryFactor)
			}
			req.Memory = clamp32(mem)
		}
	}
	if q, ok := quantity(ctr, c.ResourceMemoryPercentage); ok && c.ResourceMemoryPercentage != "" {
		if p, isInt := q.AsInt64(); isInt {
			req.MemoryPercentage = clamp32(p)
			if c.Version == VersionMaster {
				switch {
				case p > 100:
					req.MemoryPercentage = 100
				case p <= 0:
					req.MemoryPercentage = PercentageUnset
				}
			}
		}
	}
	if req.MemoryPercentage == PercentageUnset && req.Memory == 0 {
		if c.DefaultMemory != 0 {
			req.Memory = c.DefaultMemory
		} else {
			req.MemoryPercentage = 100
		}
	}
	if q, ok := quantity(ctr, c.ResourceCores); ok && c.ResourceCores != "" {
		if n, isInt := q.AsInt64(); isInt {
			req.Cores = clamp32(n)
		}
	}
	return req
}

// quantity returns the container's limit for name, else its request.
func quantity(ctr *corev1.Container, name string) (resource.Quantity, bool) {
	if q, ok := ctr.Resources.Limits[corev1.ResourceName(name)]; ok {
		return q, true
	}
	q, ok := ctr.Resources.Requests[corev1.ResourceName(name)]
	return q, ok
}

// clamp32 converts to int32, saturating instead of wrapping around.
func clamp32(n int64) int32 {
	return int32(max(math.MinInt32, min(math.MaxInt32, n)))
}
