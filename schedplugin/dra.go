package schedplugin

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/dra"
)

// ReasonDRANode starts the Filter's reason for a DRA node (see [Plugin.Filter]) that a pod
// asking for a share of a GPU cannot use.
const ReasonDRANode = "node serves the GPU count through DRA"

// draNode returns the DeviceClass through which kube-scheduler serves the count resource of
// cfg on node (the extended-resource mapping, dra.ServedThroughDRA: a class names the resource
// in spec.extendedResourceName and the node's allocatable has none of it), nil when the node
// is not such a DRA node or the framework has no DRA manager.
func (p *Plugin) draNode(cfg allocation.Config, node *corev1.Node) *resourcev1.DeviceClass {
	if node == nil {
		return nil
	}
	dm := p.h.SharedDRAManager()
	if dm == nil {
		return nil
	}
	resolver := dm.DeviceClassResolver()
	if resolver == nil {
		return nil
	}
	res := corev1.ResourceName(cfg.ResourceCount)
	class := resolver.GetDeviceClass(res)
	if class == nil || !dra.ServedThroughDRA(res, node.Status.Allocatable, []*resourcev1.DeviceClass{class}) {
		return nil
	}
	return class
}

// draReason is the Filter's reason for a share on a DRA node, with the fix.
func draReason(class *resourcev1.DeviceClass, cfg allocation.Config, shared string) string {
	return fmt.Sprintf("%s: DeviceClass %s maps %s and the node's allocatable has none, so its claim takes whole GPUs and cannot carry %s; "+
		"write a ResourceClaim of DeviceClass %s with capacity requests (memory, cores) and name it in spec.resourceClaims, or ask whole GPUs",
		ReasonDRANode, class.Name, cfg.ResourceCount, shared, class.Name)
}
