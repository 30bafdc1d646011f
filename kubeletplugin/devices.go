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

// MIGDevicePrefix starts the UUID of an NVIDIA MIG device ("MIG-<uuid>", or
// "MIG-GPU-<uuid>/<gi>/<ci>" from older drivers). [VirtualDevices] publishes a device whose ID
// has it as it is: one device, not split, with its NUMA node (see there).
const MIGDevicePrefix = "MIG-"

// VirtualDevices returns what ListAndWatch publishes for devices, in canonical order
// (annotation.Compare), as HAMi v2.10.0's device plugin does:
//
//   - A GPU is published as Count virtual devices (the split count; none when Count is 0 or
//     negative) with ids [VirtualDeviceID] and the GPU's health. With numaTopology each carries
//     the GPU's NUMA node as topology, so that the kubelet's Topology Manager can align it;
//     without (HAMi's default, and all v2.9.0 does) none does.
//   - A device whose ID starts with [MIGDevicePrefix] (a MIG device a source publishes by its
//     MIG UUID) is published once, with its own ID, whatever its Count, and carries its NUMA
//     node whether or not numaTopology is set (HAMi sends MIG devices as built).
//   - A device whose Numa is negative has no known NUMA node: no topology, even with
//     numaTopology or as a MIG device (HAMi's "no numa_node in sysfs" case).
//
// It is what the kubelet counts: capacity = all of them, allocatable = the healthy ones. An
// empty or nil device list gives an empty list (HAMi v2.9.0 panics there).
func VirtualDevices(devices []annotation.Device, numaTopology bool) []*pluginapi.Device {
	devices = annotation.Canonical(devices)
	n := 0
	for _, d := range devices {
		if isMIGDevice(d) {
			n++
		} else {
			n += int(max(d.Count, 0))
		}
	}
	out := make([]*pluginapi.Device, 0, n)
	for _, d := range devices {
		health := pluginapi.Unhealthy
		if d.Health {
			health = pluginapi.Healthy
		}
		if isMIGDevice(d) {
			out = append(out, &pluginapi.Device{ID: d.ID, Health: health, Topology: topology(d)})
			continue
		}
		for i := range int(max(d.Count, 0)) {
			v := &pluginapi.Device{ID: VirtualDeviceID(d.ID, i), Health: health}
			if numaTopology {
				v.Topology = topology(d)
			}
			out = append(out, v)
		}
	}
	return out
}

func isMIGDevice(d annotation.Device) bool { return strings.HasPrefix(d.ID, MIGDevicePrefix) }

// topology is d's NUMA node as the kubelet reads it, nil when unknown (Numa negative). Each
// virtual device gets its own value: the kubelet may keep what it receives.
func topology(d annotation.Device) *pluginapi.TopologyInfo {
	if d.Numa < 0 {
		return nil
	}
	return &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(d.Numa)}}}
}
