package annotation

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// Well-known keys and names of the NVIDIA vendor.
const (
	// VendorNVIDIA is HAMi's vendor word for NVIDIA GPUs.
	VendorNVIDIA = "NVIDIA"
	// KeyNVIDIARegister is the Node annotation that carries the NVIDIA device list (channel 2).
	KeyNVIDIARegister = "hami.io/node-nvidia-register"
	// KeyNVIDIAHandshake is the scheduler's liveness handshake for NVIDIA nodes (channel 3).
	// Unlike every other vendor it has no vendor suffix: "hami.io/node-handshake-nvidia" does
	// not exist.
	KeyNVIDIAHandshake = "hami.io/node-handshake"
	// KeyNVIDIAScore is the optional topology score annotation of NVIDIA nodes.
	KeyNVIDIAScore = "hami.io/node-nvidia-score"
	// ResourceNVIDIAGPU is the extended resource the device plugin advertises (channel 1):
	// physical GPUs × split count.
	ResourceNVIDIAGPU = "nvidia.com/gpu"
	// KeyNodeLock is the node lock annotation shared by every vendor.
	KeyNodeLock = "hami.io/mutex.lock"
	// KeyNVIDIAToAllocate is the Pod annotation with the devices the scheduler chose that the
	// device plugin has not handed out yet: its work queue, one entry per container.
	KeyNVIDIAToAllocate = "hami.io/vgpu-devices-to-allocate"
	// KeyNVIDIAAllocated is the Pod annotation with the devices the scheduler chose, kept as
	// the permanent record from which schedulers count what a node's GPUs already hold.
	KeyNVIDIAAllocated = "hami.io/vgpu-devices-allocated"
)

// Format is how a vendor's register annotation is encoded.
type Format int

const (
	// FormatJSON is the JSON array of devices ([Decode], [Encode]).
	FormatJSON Format = iota
	// FormatLegacy is the colon/comma format ([DecodeLegacy], [EncodeLegacy]) that HAMi still
	// reads for Hygon DCU and Iluvatar.
	FormatLegacy
	// FormatVendorSpecific is a vendor's own format that this package does not decode.
	FormatVendorSpecific
	// FormatCapacity means the vendor has no register annotation: HAMi synthesises its devices
	// from the Node's capacity.
	FormatCapacity
)

// String returns a short name of the format.
func (f Format) String() string {
	switch f {
	case FormatJSON:
		return "json"
	case FormatLegacy:
		return "legacy"
	case FormatVendorSpecific:
		return "vendor-specific"
	case FormatCapacity:
		return "capacity"
	default:
		return "unknown"
	}
}

// Vendor describes where HAMi reads and writes one vendor's registration.
type Vendor struct {
	// Name is HAMi's vendor word (its CommonWord), e.g. "NVIDIA", "DCU", "Ascend910B3".
	Name string
	// RegisterKey is the annotation that carries the device list; empty for capacity vendors.
	RegisterKey string
	// HandshakeKey is the scheduler's handshake annotation; empty when the vendor has none.
	HandshakeKey string
	// ScoreKey is the optional topology score annotation (NVIDIA only).
	ScoreKey string
	// ResourceName is the extended resource counted in allocatable, when known.
	ResourceName string
	// ToAllocateKey is the Pod annotation with the devices still to hand out (HAMi's
	// InRequestDevices); empty for vendors whose scheduler side writes none.
	ToAllocateKey string
	// AllocatedKey is the Pod annotation recording the devices the scheduler chose (HAMi's
	// SupportDevices), from which usage is counted; empty when HAMi has none for the vendor.
	AllocatedKey string
	// Format is the encoding of the register annotation.
	Format Format
	// ForceDevcore100 is set for vendors whose decoded devices HAMi forces to Devcore 100
	// (Vastai).
	ForceDevcore100 bool
	// MasterOnly marks vendors that exist only in HAMi master (v2.10), not in v2.9.0.
	MasterOnly bool
}

// NVIDIA returns the NVIDIA vendor: register key [KeyNVIDIARegister], handshake key
// [KeyNVIDIAHandshake] (unsuffixed), resource [ResourceNVIDIAGPU], JSON format.
func NVIDIA() Vendor {
	return Vendor{
		Name:          VendorNVIDIA,
		RegisterKey:   KeyNVIDIARegister,
		HandshakeKey:  KeyNVIDIAHandshake,
		ScoreKey:      KeyNVIDIAScore,
		ResourceName:  ResourceNVIDIAGPU,
		ToAllocateKey: KeyNVIDIAToAllocate,
		AllocatedKey:  KeyNVIDIAAllocated,
		Format:        FormatJSON,
	}
}

// Ascend returns the vendor of one Huawei Ascend chip (e.g. "Ascend910B3"), as configured in
// HAMi's chart: register key "hami.io/node-register-<chip>", handshake
// "hami.io/node-handshake-<chip>", JSON format.
func Ascend(chip string) Vendor {
	return Vendor{
		Name:          chip,
		RegisterKey:   "hami.io/node-register-" + chip,
		HandshakeKey:  "hami.io/node-handshake-" + chip,
		ToAllocateKey: "hami.io/" + chip + "-devices-to-allocate",
		AllocatedKey:  "hami.io/" + chip + "-devices-allocated",
		Format:        FormatJSON,
	}
}

// Iluvatar returns the vendor of one Iluvatar chip (e.g. "BI-V150"): register key
// "hami.io/node-<chip>-register", handshake "hami.io/node-handshake-<chip>", legacy format.
func Iluvatar(chip string) Vendor {
	return Vendor{
		Name:          chip,
		RegisterKey:   "hami.io/node-" + chip + "-register",
		HandshakeKey:  "hami.io/node-handshake-" + chip,
		ToAllocateKey: "hami.io/" + chip + "-devices-to-allocate",
		AllocatedKey:  "hami.io/" + chip + "-devices-allocated",
		Format:        FormatLegacy,
	}
}

// defaultAscendChips and defaultIluvatarChips are the chips HAMi's chart configures.
func defaultAscendChips() []string {
	return []string{"Ascend910A", "Ascend910B2", "Ascend910B3", "Ascend910B4-1", "Ascend910B4", "Ascend310P", "Ascend910C"}
}

func defaultIluvatarChips() []string {
	return []string{"MR-V100", "MR-V50", "BI-V150", "BI-V100"}
}

// Vendors returns HAMi's vendor table: the fixed vendors every HAMi scheduler instantiates
// (v2.9.0 and master's additions, marked MasterOnly), followed by the Ascend and Iluvatar
// chips of HAMi's chart (which HAMi adds only when those devices are enabled). The slice is
// new on every call.
func Vendors() []Vendor {
	vs := []Vendor{
		NVIDIA(),
		{Name: "DCU", RegisterKey: "hami.io/node-dcu-register", HandshakeKey: "hami.io/node-handshake-dcu", Format: FormatLegacy,
			ToAllocateKey: "hami.io/dcu-devices-to-allocate", AllocatedKey: "hami.io/dcu-devices-allocated"},
		{Name: "XPU", RegisterKey: "hami.io/node-register-xpu", HandshakeKey: "hami.io/node-handshake-xpu", Format: FormatJSON,
			ToAllocateKey: "hami.io/xpu-devices-to-allocate", AllocatedKey: "hami.io/xpu-devices-allocated"},
		{Name: "Vastai", RegisterKey: "hami.io/node-va-register", HandshakeKey: "hami.io/node-handshake-va", Format: FormatJSON, ForceDevcore100: true},
		{Name: "Metax-SGPU", RegisterKey: "metax-tech.com/node-gpu-devices", Format: FormatVendorSpecific,
			ToAllocateKey: "hami.io/metax-sgpu-devices-to-allocate", AllocatedKey: "hami.io/metax-sgpu-devices-allocated"},
		{Name: "MLU", Format: FormatCapacity,
			ToAllocateKey: "hami.io/cambricon-mlu-devices-to-allocate", AllocatedKey: "hami.io/cambricon-mlu-devices-allocated"},
		{Name: "GCU", Format: FormatCapacity,
			ToAllocateKey: "hami.io/enflame-gcu-devices-to-allocate", AllocatedKey: "hami.io/enflame-gcu-devices-allocated"},
		{Name: "Mthreads", Format: FormatCapacity,
			ToAllocateKey: "hami.io/mthreads-vgpu-devices-to-allocate", AllocatedKey: "hami.io/mthreads-vgpu-devices-allocated"},
		{Name: "Metax-GPU", Format: FormatCapacity,
			ToAllocateKey: "hami.io/metax-gpu-devices-to-allocate", AllocatedKey: "hami.io/metax-gpu-devices-allocated"},
		{Name: "kunlun", Format: FormatCapacity, AllocatedKey: "hami.io/kunlun-allocated"},
		{Name: "AWSNeuron", Format: FormatCapacity, AllocatedKey: "hami.io/aws-neuron-devices-allocated"},
		{Name: "AMDGPU", RegisterKey: "hami.io/node-amd-register", Format: FormatJSON, MasterOnly: true, AllocatedKey: "hami.io/amd-devices-allocated"},
		{Name: "biren", RegisterKey: "hami.io/node-biren-register", HandshakeKey: "hami.io/node-handshake-biren", Format: FormatJSON, MasterOnly: true},
	}
	for _, c := range defaultAscendChips() {
		vs = append(vs, Ascend(c))
	}
	for _, c := range defaultIluvatarChips() {
		vs = append(vs, Iluvatar(c))
	}
	return vs
}

// VendorByName returns the vendor with HAMi vendor word name from [Vendors].
func VendorByName(name string) (Vendor, bool) {
	vs := Vendors()
	i := slices.IndexFunc(vs, func(v Vendor) bool { return v.Name == name })
	if i < 0 {
		return Vendor{}, false
	}
	return vs[i], true
}

// NodeDevices returns the devices a Node publishes for vendor v, decoded the way HAMi's
// scheduler does (see [Check]). A nil node is treated as a node without annotations.
func NodeDevices(node *corev1.Node, v Vendor) ([]Device, error) {
	var annotations map[string]string
	if node != nil {
		annotations = node.Annotations
	}
	verdict := Check(v, annotations)
	return verdict.Devices, verdict.Err
}
