package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/annotation"
)

// NodeCapacity is the device memory and cores of a node's healthy devices, as
// [Options.NodeCapacity] writes them into the Node's status.
type NodeCapacity struct {
	// MemoryMiB is the sum of the healthy devices' Devmem: MiB after the memory scaling the
	// register annotation carries (Options.MemoryScaling of nvmlscan, deviceMemoryScaling).
	MemoryMiB int64
	// Cores is the sum of the healthy devices' Devcore (100 per whole GPU, after core
	// scaling).
	Cores int64
}

// NodeCapacityOf sums the memory and cores of the healthy devices of devices (those with
// Health set): what [Options.NodeCapacity] publishes for the devices the kubelet counts.
func NodeCapacityOf(devices []annotation.Device) NodeCapacity {
	var c NodeCapacity
	for _, d := range devices {
		if d.Health {
			c.MemoryMiB += int64(max(d.Devmem, 0))
			c.Cores += int64(max(d.Devcore, 0))
		}
	}
	return c
}

// capacityWriter keeps the vendor's memory and core resources in the Node's status capacity
// and allocatable (Options.NodeCapacity). Only the scan loop calls it.
type capacityWriter struct {
	nodes     typedcorev1.NodesGetter
	node      string
	mem, core corev1.ResourceName // the vendor's; either may be ""
	// applied is what the Node's status carries, as last written or read; nil when unknown
	// (before the first scan, after a failed write).
	applied *NodeCapacity
}

func newCapacityWriter(nodes typedcorev1.NodesGetter, node string, vendor annotation.Vendor) (*capacityWriter, error) {
	if vendor.ResourceMemoryName == "" && vendor.ResourceCoreName == "" {
		return nil, fmt.Errorf("NodeCapacity needs a vendor with ResourceMemoryName or ResourceCoreName (%q has neither): set them on the vendor or leave NodeCapacity false", vendor.Name)
	}
	return &capacityWriter{nodes: nodes, node: node,
		mem: corev1.ResourceName(vendor.ResourceMemoryName), core: corev1.ResourceName(vendor.ResourceCoreName)}, nil
}

// update writes want into the Node's status when it differs from what the status carries. It
// reports whether it patched. The first call (and the first after a failure) reads the Node,
// so that a restarted agent does not write an unchanged value.
func (c *capacityWriter) update(ctx context.Context, want NodeCapacity) (bool, error) {
	if c.applied != nil && *c.applied == want {
		return false, nil
	}
	if c.applied == nil {
		node, err := c.nodes.Nodes().Get(ctx, c.node, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Errorf("get node %q for its capacity: %w", c.node, err)
		}
		if c.carries(node.Status.Capacity, want) && c.carries(node.Status.Allocatable, want) {
			c.applied = &want
			return false, nil
		}
	}
	values := corev1.ResourceList{}
	if c.mem != "" {
		values[c.mem] = *resource.NewQuantity(want.MemoryMiB, resource.DecimalSI)
	}
	if c.core != "" {
		values[c.core] = *resource.NewQuantity(want.Cores, resource.DecimalSI)
	}
	body, err := json.Marshal(map[string]any{"status": map[string]any{"capacity": values, "allocatable": values}})
	if err != nil {
		return false, fmt.Errorf("encode capacity patch: %w", err)
	}
	c.applied = nil
	if _, err := c.nodes.Nodes().Patch(ctx, c.node, types.MergePatchType, body, metav1.PatchOptions{FieldManager: EventComponent}, "status"); err != nil {
		if apierrors.IsForbidden(err) {
			err = fmt.Errorf("%w (the agent's ClusterRole needs patch on nodes/status: nodeagent.ClusterRoleRulesFor with NodeCapacity)", err)
		}
		return false, fmt.Errorf("patch status of node %q with %s: %w", c.node, strings.TrimSpace(string(body)), err)
	}
	c.applied = &want
	klog.FromContext(ctx).V(2).Info("Updated node capacity", "memoryResource", c.mem, "memoryMiB", want.MemoryMiB, "coreResource", c.core, "cores", want.Cores)
	return true, nil
}

// carries reports whether list holds want's values for the vendor's resources.
func (c *capacityWriter) carries(list corev1.ResourceList, want NodeCapacity) bool {
	has := func(name corev1.ResourceName, v int64) bool {
		if name == "" {
			return true
		}
		q, ok := list[name]
		return ok && q.Value() == v && q.CmpInt64(v) == 0
	}
	return has(c.mem, want.MemoryMiB) && has(c.core, want.Cores)
}
