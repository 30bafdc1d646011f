package nodeagent

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/annotation"
)

// MappingMode is what a node is for the vendor's count resource (nvidia.com/gpu) under the
// extended-resource mapping (KEP-5004, GA in Kubernetes 1.37): kube-scheduler serves the
// resource through DRA on a node whose allocatable of it is 0 or absent, where a DeviceClass
// names it in spec.extendedResourceName, and through the device plugin elsewhere. A node is
// one or the other for the name; which one follows from what the kubelet counts.
type MappingMode string

// Mapping modes ([MappingModeOf]).
const (
	// MappingNone: the DRA world owns no GPU (or there is none); the device plugin serves
	// the resource, if any GPU is counted.
	MappingNone MappingMode = "none"
	// MappingDRA: the DRA world owns GPUs and the kubelet counts none: a pod asking the
	// resource gets it through the mapping's claim on this node.
	MappingDRA MappingMode = "dra"
	// MappingDevicePlugin: the DRA world owns some GPUs, but the kubelet counts others
	// (device-plugin-owned GPUs, in MIG mode or not): the device plugin serves the resource
	// on this node, and the DRA-owned GPUs serve explicit ResourceClaims only.
	MappingDevicePlugin MappingMode = "device-plugin"
)

// MappingModeOf is the mode of a node whose device plugin advertises kubelet (the devices the
// agent hands the kubelet: not the DRA-owned ones) while the DRA world owns draOwned GPUs. The
// kubelet counts the healthy devices' split counts; a node whose device-plugin GPUs are all
// unhealthy counts 0 and is a DRA node for the mapping while they are.
func MappingModeOf(kubelet []annotation.Device, draOwned int) MappingMode {
	if draOwned <= 0 {
		return MappingNone
	}
	for _, d := range kubelet {
		if d.Health && d.Count > 0 {
			return MappingDevicePlugin
		}
	}
	return MappingDRA
}

// MappingMode is the node's mode after the last scan ([MappingModeOf]); [MappingNone] without
// Options.DRA or before the first scan.
func (a *Agent) MappingMode() MappingMode {
	if a.dra == nil {
		return MappingNone
	}
	a.dra.mu.Lock()
	defer a.dra.mu.Unlock()
	return orNone(a.dra.mode)
}

func orNone(m MappingMode) MappingMode {
	if m == "" {
		return MappingNone
	}
	return m
}

// noteMapping records the mode of a scan and logs a change: a node that the DRA world shares
// with the device plugin is said to be a device-plugin node for the resource, so that an
// operator who meant a DRA node sees why pods asking it do not get DRA GPUs here.
func (a *Agent) noteMapping(ctx context.Context, kubelet []annotation.Device, draOwned int) {
	mode := MappingModeOf(kubelet, draOwned)
	s := a.dra
	s.mu.Lock()
	old := orNone(s.mode)
	s.mode = mode
	s.mu.Unlock()
	if old == mode {
		return
	}
	logger := klog.FromContext(ctx)
	switch mode {
	case MappingDRA:
		logger.Info("Every GPU is DRA's and the kubelet counts none: where a DeviceClass maps the resource (extendedResourceName), kube-scheduler serves it on this node through DRA",
			"resourceName", a.vendor.ResourceName, "draOwned", draOwned)
	case MappingDevicePlugin:
		logger.Info("The kubelet counts GPUs besides the DRA-owned ones: the device plugin serves the resource on this node, and the DRA-owned GPUs serve explicit ResourceClaims only (a DeviceClass's extendedResourceName does not reach them); give the DRA world every GPU to make this a DRA node",
			"resourceName", a.vendor.ResourceName, "draOwned", draOwned, "kubeletDevices", len(kubelet))
	case MappingNone:
		logger.V(2).Info("The DRA world owns no GPU", "resourceName", a.vendor.ResourceName)
	}
}
