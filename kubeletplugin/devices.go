package kubeletplugin

import (
	"strconv"

	"github.com/hamireg/hamireg/annotation"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// VirtualDeviceID is HAMi's id of the i-th virtual device of the GPU with that UUID:
// "<uuid>-<i>".
func VirtualDeviceID(uuid string, i int) string { return uuid + "-" + strconv.Itoa(i) }

// VirtualDevices returns what ListAndWatch publishes for devices: for each GPU, in canonical
// order (annotation.Compare), Count virtual devices (splitCount when Count is 0) with ids
// [VirtualDeviceID], the GPU's health and its NUMA node as topology. It is what the kubelet
// counts: capacity = all of them, allocatable = the healthy ones.
func VirtualDevices(devices []annotation.Device, splitCount int32) []*pluginapi.Device {
	devices = annotation.Canonical(devices)
	n := 0
	for _, d := range devices {
		n += int(splitOf(d, splitCount))
	}
	out := make([]*pluginapi.Device, 0, n)
	for _, d := range devices {
		health := pluginapi.Unhealthy
		if d.Health {
			health = pluginapi.Healthy
		}
		for i := range int(splitOf(d, splitCount)) {
			out = append(out, &pluginapi.Device{
				ID:       VirtualDeviceID(d.ID, i),
				Health:   health,
				Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(d.Numa)}}},
			})
		}
	}
	return out
}

func splitOf(d annotation.Device, def int32) int32 {
	if d.Count > 0 {
		return d.Count
	}
	return max(def, 0)
}
