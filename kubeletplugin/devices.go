package kubeletplugin

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/hamireg/hamireg/annotation"
)

// ErrInvalidDeviceID means a string is not a virtual device id of the form "<uuid>-<i>" that
// [VirtualDeviceID] makes.
var ErrInvalidDeviceID = errors.New("invalid virtual device id")

// VirtualDeviceID is HAMi's id of the i-th virtual device of the GPU with that UUID:
// "<uuid>-<i>".
func VirtualDeviceID(uuid string, i int) string { return uuid + "-" + strconv.Itoa(i) }

// ParseVirtualDeviceID is the inverse of [VirtualDeviceID]: it splits "<uuid>-<i>" at the last
// dash into the GPU's UUID and the replica index, so that VirtualDeviceID(uuid, i) == id. An id
// without a dash, with an empty UUID, or whose index is not a decimal number in canonical form
// (no sign, no leading zero) gives an error wrapping [ErrInvalidDeviceID]; the kubelet only
// ever sends ids the plugin published.
func ParseVirtualDeviceID(id string) (uuid string, i int, err error) {
	cut := strings.LastIndexByte(id, '-')
	if cut <= 0 {
		return "", 0, fmt.Errorf("parse device id %q: no \"-<replica>\" suffix: %w", id, ErrInvalidDeviceID)
	}
	uuid, num := id[:cut], id[cut+1:]
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 || strconv.Itoa(n) != num {
		return "", 0, fmt.Errorf("parse device id %q: replica %q is not a non-negative decimal: %w", id, num, ErrInvalidDeviceID)
	}
	return uuid, n, nil
}

// VirtualDevices returns what ListAndWatch publishes for devices: for each GPU, in canonical
// order (annotation.Compare), Count virtual devices (the split count; none when Count is 0 or
// negative) with ids [VirtualDeviceID], the GPU's health and its NUMA node as topology. It is
// what the kubelet counts: capacity = all of them, allocatable = the healthy ones.
func VirtualDevices(devices []annotation.Device) []*pluginapi.Device {
	devices = annotation.Canonical(devices)
	n := 0
	for _, d := range devices {
		n += int(max(d.Count, 0))
	}
	out := make([]*pluginapi.Device, 0, n)
	for _, d := range devices {
		health := pluginapi.Unhealthy
		if d.Health {
			health = pluginapi.Healthy
		}
		for i := range int(max(d.Count, 0)) {
			out = append(out, &pluginapi.Device{
				ID:       VirtualDeviceID(d.ID, i),
				Health:   health,
				Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(d.Numa)}}},
			})
		}
	}
	return out
}
