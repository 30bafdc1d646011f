package monitor

import (
	"context"
	"math"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/allocation"
)

// EnvTaskPriority is the container variable HAMi-core takes its region's priority from
// (HAMi's admission webhook sets it from the nvidia.com/priority limit).
const EnvTaskPriority = "CUDA_TASK_PRIORITY"

// DefaultTaskPriority is HAMi-core's priority when CUDA_TASK_PRIORITY is not set.
const DefaultTaskPriority int32 = 1

// SpecPriority returns the priority the pod spec gives container c, the value HAMi-core
// should hold in the container's region: the container's nvidia.com/priority limit (as
// HAMi's webhook passes it on), else its CUDA_TASK_PRIORITY variable read as HAMi-core
// reads it (C's atoi: leading digits, "high" is 0), else [DefaultTaskPriority]. A variable
// set from a reference (valueFrom) cannot be resolved here and counts as not set.
func SpecPriority(c *corev1.Container) int32 {
	if q, ok := c.Resources.Limits[corev1.ResourceName(allocation.DefaultResourcePriority)]; ok {
		// The webhook writes the decimal value; HAMi-core's atoi keeps its low 32 bits.
		return int32(q.Value()) // HAMi-core's (int) cast
	}
	for i := len(c.Env) - 1; i >= 0; i-- { // the last definition wins, as in the container
		if e := &c.Env[i]; e.Name == EnvTaskPriority {
			if e.ValueFrom != nil {
				break
			}
			return atoi(e.Value)
		}
	}
	return DefaultTaskPriority
}

// atoi is glibc's atoi, (int)strtol(s, NULL, 10): leading white space, an optional sign,
// decimal digits up to the first other byte (none: 0), saturated to the range of a 64-bit
// long, then cast to a 32-bit int (the low 32 bits).
func atoi(s string) int32 {
	i := 0
	for i < len(s) && (s[i] == ' ' || s[i] >= '\t' && s[i] <= '\r') {
		i++
	}
	neg := false
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	var v uint64
	over := false
	for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		d := uint64(s[i] - '0')
		if v > (math.MaxUint64-d)/10 {
			over = true
			continue
		}
		v = v*10 + d
	}
	var l int64
	switch {
	case neg && (over || v > 1<<63):
		l = math.MinInt64
	case neg:
		l = int64(-v) // two's complement of v <= 2^63
	case over || v > math.MaxInt64:
		l = math.MaxInt64
	default:
		l = int64(v)
	}
	return int32(l) // C's (int) cast of a long
}

// specIndex finds the pod spec's priority of a container from the node's pods.
type specIndex struct {
	pods map[types.UID]*corev1.Pod
}

// specPriorities indexes the node's pods by UID for one round; when the pods cannot be
// listed every container's spec priority is unknown this round.
func (m *Monitor) specPriorities(ctx context.Context) specIndex {
	pods, err := m.pods.NodePods()
	if err != nil {
		klog.FromContext(ctx).V(4).Info("Pod specs not available, priorities not cross-checked this round", "err", err)
		return specIndex{}
	}
	idx := specIndex{pods: make(map[types.UID]*corev1.Pod, len(pods))}
	for _, p := range pods {
		if p != nil {
			idx.pods[p.UID] = p
		}
	}
	return idx
}

// of returns c's spec priority; ok is false when its pod or container is not on the node.
func (s specIndex) of(c *Container) (p int32, ok bool) {
	pod := s.pods[c.PodUID]
	if pod == nil {
		return 0, false
	}
	for _, list := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range list {
			if list[i].Name == c.Name {
				return SpecPriority(&list[i]), true
			}
		}
	}
	return 0, false
}
