package allocation

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/mig"
)

// Usage is what pods hold of one GPU: how many of its split slots, how much memory (MiB) and how
// many core percent. Sums are 64-bit so that no set of annotations can wrap them around.
type Usage struct {
	Used, Usedmem, Usedcores int64
}

// Add returns u plus o.
func (u Usage) Add(o Usage) Usage {
	return Usage{Used: u.Used + o.Used, Usedmem: u.Usedmem + o.Usedmem, Usedcores: u.Usedcores + o.Usedcores}
}

// Sub returns u minus o.
func (u Usage) Sub(o Usage) Usage {
	return Usage{Used: u.Used - o.Used, Usedmem: u.Usedmem - o.Usedmem, Usedcores: u.Usedcores - o.Usedcores}
}

// Usage sums what pd holds per physical GPU ([ContainerDevice.GPU]): every device entry takes
// one slot, its memory and its cores, as HAMi counts it.
func (pd PodDevices) Usage() map[string]Usage {
	out := map[string]Usage{}
	for _, c := range pd {
		for _, d := range c {
			out[d.GPU()] = out[d.GPU()].Add(Usage{Used: 1, Usedmem: int64(d.Usedmem), Usedcores: int64(d.Usedcores)})
		}
	}
	return out
}

// DeviceUsage is a GPU of a node with what pods hold of it (HAMi's DeviceUsage: Count is the
// split count, Devmem the total memory, Devcore the total cores).
type DeviceUsage struct {
	annotation.Device
	Usage
	// PairScores are the GPU's topology scores to the other GPUs of its node, by their UUID
	// (the node's hami.io/node-nvidia-score entry for this GPU, HAMi's DevicePairScore); nil
	// when the node publishes none. Only the topology-aware policy reads them; see
	// [SetPairScores].
	PairScores map[string]int
	// MIG are the placements pods hold on the GPU, when it is in [ModeMIG]: one per device
	// entry of a pod whose reservation is known ([PodDevices.MIGUsage]; see [SetMIGUsage]).
	// Fit treats a GPU with more device entries (Used) than placements as fully occupied.
	MIG []mig.Placement
}

// WithUsage pairs a node's devices, in the order of its register annotation, with what pods
// hold of each (by UUID; a GPU absent from used holds nothing).
func WithUsage(devices []annotation.Device, used map[string]Usage) []DeviceUsage {
	out := make([]DeviceUsage, len(devices))
	for i, d := range devices {
		out[i] = DeviceUsage{Device: d, Usage: used[d.ID]}
	}
	return out
}

// PodNode returns the node whose GPUs pod's devices count against, as HAMi's scheduler counts
// them: the node named by the pod's [KeyNode] annotation (not spec.nodeName), while the pod has
// not Succeeded or Failed. Terminating pods still count. A pod without the annotation, such as
// one placed by another scheduler, counts nowhere.
func PodNode(pod *corev1.Pod) (string, bool) {
	if pod == nil {
		return "", false
	}
	node := pod.Annotations[KeyNode]
	if node == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return "", false
	}
	return node, true
}

// Allocated returns the devices the scheduler recorded for pod under vendor v: the value of
// v.AllocatedKey (for NVIDIA hami.io/vgpu-devices-allocated; the to-allocate key is the device
// plugin's work queue and is not used for usage). ok is false when the pod has no such
// annotation.
func Allocated(pod *corev1.Pod, v annotation.Vendor, ver Version) (pd PodDevices, ok bool, err error) {
	if pod == nil || v.AllocatedKey == "" {
		return nil, false, nil
	}
	value, ok := pod.Annotations[v.AllocatedKey]
	if !ok {
		return nil, false, nil
	}
	pd, err = DecodePodDevices(value, ver)
	return pd, true, err
}
