package dra_test

import (
	"testing"

	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/hamireg/hamireg/dra"
)

// TestStandardAttributeNames: the standard attributes are spelled as Kubernetes' helper
// package spells them.
func TestStandardAttributeNames(t *testing.T) {
	t.Parallel()
	if dra.AttributeNUMANode != deviceattribute.StandardDeviceAttributeNUMANode {
		t.Errorf("AttributeNUMANode = %q, want %q", dra.AttributeNUMANode, deviceattribute.StandardDeviceAttributeNUMANode)
	}
	if dra.AttributePCIBusID != deviceattribute.StandardDeviceAttributePCIBusID {
		t.Errorf("AttributePCIBusID = %q, want %q", dra.AttributePCIBusID, deviceattribute.StandardDeviceAttributePCIBusID)
	}
}
