package annotation

import (
	"errors"
	"strings"
	"testing"
)

func TestVendorValidate(t *testing.T) {
	t.Parallel()
	acme := NewVendor("ACME", "acme.example/npu")
	noResource := acme
	noResource.ResourceName = ""
	badResource := acme
	badResource.ResourceName = "npu"
	k8sResource := acme
	k8sResource.ResourceName = "kubernetes.io/npu"
	legacy, _ := VendorByName("DCU")
	mlu, _ := VendorByName("MLU")
	metax, _ := VendorByName("Metax-SGPU")
	tests := map[string]struct {
		v       Vendor
		part    Part
		missing []string // words the error must name; nil means valid
	}{
		"nvidia node agent":         {v: NVIDIA(), part: PartNodeAgent},
		"nvidia handshake":          {v: NVIDIA(), part: PartHandshake},
		"nvidia allocate":           {v: NVIDIA(), part: PartAllocate},
		"custom node agent":         {v: acme, part: PartNodeAgent},
		"custom allocate":           {v: acme, part: PartAllocate},
		"no resource, kubelet":      {v: noResource, part: PartKubelet, missing: []string{"ResourceName"}},
		"no resource, node agent":   {v: noResource, part: PartNodeAgent, missing: []string{"ResourceName"}},
		"resource without domain":   {v: badResource, part: PartKubelet, missing: []string{`"npu"`, "<domain>/<name>"}},
		"resource in kubernetes.io": {v: k8sResource, part: PartKubelet, missing: []string{"kubernetes.io"}},
		"legacy format, register":   {v: legacy, part: PartRegister},
		"vendor format, register":   {v: metax, part: PartRegister, missing: []string{"FormatLegacy", "vendor-specific"}},
		"legacy format, handshake":  {v: legacy, part: PartHandshake},
		"capacity vendor, register": {v: mlu, part: PartRegister, missing: []string{"RegisterKey"}},
		"capacity vendor, kubelet":  {v: mlu, part: PartKubelet},
		"no name":                   {v: Vendor{}, part: PartKubelet, missing: []string{"Name", "ResourceName", "(unnamed)"}},
		"unknown part":              {v: NVIDIA(), part: Part(99), missing: []string{"unknown part"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := tc.v.Validate(tc.part)
			if tc.missing == nil {
				if err != nil {
					t.Fatalf("Validate(%s) = %v, want nil", tc.part, err)
				}
				return
			}
			if !errors.Is(err, ErrIncompleteVendor) {
				t.Fatalf("Validate(%s) = %v, want ErrIncompleteVendor", tc.part, err)
			}
			for _, w := range tc.missing {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate(%s) = %q, does not name %q", tc.part, err, w)
				}
			}
		})
	}
}

// Every vendor of the table with a JSON register annotation and a resource name can ship a
// node agent; every vendor has a resource name; no two share a kubelet socket.
func TestVendorsComplete(t *testing.T) {
	t.Parallel()
	sockets := map[string]string{}
	agents := 0
	for _, v := range Vendors() {
		if v.ResourceName == "" {
			t.Errorf("vendor %s has no resource name", v.Name)
		}
		if err := v.Validate(PartKubelet); err != nil {
			t.Errorf("vendor %s: %v", v.Name, err)
		}
		if v.RegisterKey != "" && (v.Format == FormatJSON || v.Format == FormatLegacy) {
			agents++
			if err := v.Validate(PartNodeAgent); err != nil {
				t.Errorf("vendor %s cannot ship a node agent: %v", v.Name, err)
			}
		}
		if (v.Format == FormatJSON || v.Format == FormatLegacy) && v.HandshakeKey != "" {
			if err := v.Validate(PartHandshake); err != nil {
				t.Errorf("vendor %s: %v", v.Name, err)
			}
		}
		s := v.SocketName()
		if other, dup := sockets[s]; dup {
			t.Errorf("vendors %s and %s share the socket %s", other, v.Name, s)
		}
		sockets[s] = v.Name
	}
	if agents < 10 {
		t.Errorf("only %d vendors can ship a node agent", agents)
	}
}

func TestVendorResourceNames(t *testing.T) {
	t.Parallel()
	want := map[string]string{
		"NVIDIA":      "nvidia.com/gpu",
		"DCU":         "hygon.com/dcunum",
		"MLU":         "cambricon.com/vmlu",
		"XPU":         "kunlunxin.com/vxpu",
		"kunlun":      "kunlunxin.com/xpu",
		"Metax-GPU":   "metax-tech.com/gpu",
		"Metax-SGPU":  "metax-tech.com/sgpu",
		"Mthreads":    "mthreads.com/vgpu",
		"AWSNeuron":   "aws.amazon.com/neuron",
		"AMDGPU":      "amd.com/gpu",
		"Vastai":      "vastaitech.com/va",
		"biren":       "birentech.com/gpu",
		"GCU":         "enflame.com/gcu",
		"Ascend910B3": "huawei.com/Ascend910B3",
		"BI-V150":     "iluvatar.ai/BI-V150-vgpu",
	}
	for name, res := range want {
		v, ok := VendorByName(name)
		if !ok {
			t.Errorf("no vendor %s", name)
			continue
		}
		if v.ResourceName != res {
			t.Errorf("vendor %s: ResourceName %q, want %q", name, v.ResourceName, res)
		}
	}
}

func TestVendorSocketName(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		v    Vendor
		want string
	}{
		"nvidia":       {NVIDIA(), "hamireg-nvidia-gpu.sock"},
		"ascend":       {Ascend("Ascend910B3"), "hamireg-huawei-ascend910b3.sock"},
		"iluvatar":     {Iluvatar("BI-V150"), "hamireg-iluvatar-bi-v150-vgpu.sock"},
		"custom":       {NewVendor("ACME", "acme.example/npu"), "hamireg-acme-npu.sock"},
		"odd chars":    {NewVendor("X", "x.io/a.b c"), "hamireg-x-a-b-c.sock"},
		"no resource":  {Vendor{Name: "Foo"}, "hamireg-foo.sock"},
		"nothing":      {Vendor{}, "hamireg-device.sock"},
		"aws (domain)": {Vendor{Name: "AWSNeuron", ResourceName: "aws.amazon.com/neuron"}, "hamireg-aws-neuron.sock"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := tc.v.SocketName(); got != tc.want {
				t.Errorf("SocketName() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestNewVendor(t *testing.T) {
	t.Parallel()
	v := NewVendor("ACME", "acme.example/npu")
	want := Vendor{
		Name: "ACME", RegisterKey: "hami.io/node-acme-register", HandshakeKey: "hami.io/node-handshake-acme",
		ResourceName: "acme.example/npu", ToAllocateKey: "hami.io/acme-devices-to-allocate",
		AllocatedKey: "hami.io/acme-devices-allocated", Format: FormatJSON,
	}
	if v != want {
		t.Errorf("NewVendor = %+v, want %+v", v, want)
	}
}
