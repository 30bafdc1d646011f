package extender

import (
	"errors"
	"strings"
	"testing"
	"testing/synctest"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/schedcache"
)

// A vendor the SDK fits generically (annotation.NewVendor) is scheduled with its own register
// annotation, resources and pod keys; NVIDIA's pods and nodes are not its business.
func TestFilterOtherVendor(t *testing.T) {
	t.Parallel()
	acme := annotation.NewVendor("ACME", "acme.example/npu")
	acme.ResourceMemoryName = "acme.example/npu-memory"
	npuNode := func(name string, devmem int32) *corev1.Node {
		n := gpuNode(name, "", 2)
		devs := []annotation.Device{
			{ID: "NPU-" + name + "-0", Count: 4, Devmem: devmem, Devcore: 100, Type: "ACME-NPU", Health: true},
			{ID: "NPU-" + name + "-1", Index: 1, Count: 4, Devmem: devmem, Devcore: 100, Type: "ACME-NPU", Health: true},
		}
		n.Annotations[acme.RegisterKey] = annotation.Encode(devs)
		n.Status.Allocatable["acme.example/npu"] = *resource.NewQuantity(8, resource.DecimalSI)
		return n
	}
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Options{Vendor: acme}, npuNode("small", 1000), npuNode("big", 8000), registered("nv", 2, 20000))
		pod := gpuPod("npu", map[string]string{"acme.example/npu": "1", "acme.example/npu-memory": "3000"})
		e.create(pod)
		res := e.filter(pod, "small", "big", "nv")
		if res.Error != "" || res.NodeNames == nil || len(*res.NodeNames) != 1 || (*res.NodeNames)[0] != "big" {
			t.Fatalf("filter = %+v, want big (the only ACME node with 3000 MiB free)", res)
		}
		got := e.pod("npu").Annotations
		if got[acme.ToAllocateKey] != "NPU-big-1,ACME,3000,0:;" || got[acme.AllocatedKey] != got[acme.ToAllocateKey] || got[allocation.KeyNode] != "big" {
			t.Errorf("annotations = %v, want ACME's keys with the ACME device", got)
		}
		if _, ok := got["hami.io/vgpu-devices-allocated"]; ok {
			t.Error("NVIDIA's allocated key written for an ACME pod")
		}
		// An NVIDIA pod asks nothing of this extender: every candidate passes untouched.
		nv := gpuPod("nv", map[string]string{"nvidia.com/gpu": "1"})
		e.create(nv)
		if res := e.filter(nv, "small", "nv"); res.NodeNames == nil || len(*res.NodeNames) != 2 {
			t.Errorf("NVIDIA pod through the ACME extender: %+v, want every candidate", res)
		}
	})
}

// Vendors HAMi fits with rules of their own are refused at construction, naming why.
func TestNewRefusesVendorRules(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset()
	c, err := schedcache.New(newNodeInformer(client), schedcache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(client, c, Options{Vendor: annotation.Ascend("Ascend910B3")})
	if !errors.Is(err, ErrInvalidOptions) || !errors.Is(err, allocation.ErrVendorRules) || !strings.Contains(err.Error(), "Ascend") {
		t.Errorf("New(Ascend) = %v, want ErrInvalidOptions and allocation.ErrVendorRules naming Ascend", err)
	}
	legacy := annotation.NewVendor("OLD", "old.example/dev")
	legacy.Format = annotation.FormatLegacy
	if _, err := New(client, c, Options{Vendor: legacy}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("New(legacy-format vendor) = %v, want ErrInvalidOptions", err)
	}
}
