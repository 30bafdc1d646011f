package annotation

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

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

// Vendor is one accelerator vendor as HAMi knows it: every key and name a part of this SDK
// needs to register, schedule and allocate that vendor's devices. The same value is handed to
// every part ([Vendor.Validate] says which fields a part needs); [Vendors] is HAMi's table,
// [NVIDIA], [Ascend], [Iluvatar] and [NewVendor] build single entries.
type Vendor struct {
	// Name is HAMi's vendor word (its CommonWord), e.g. "NVIDIA", "DCU", "Ascend910B3".
	Name string
	// RegisterKey is the annotation that carries the device list; empty for capacity vendors.
	RegisterKey string
	// HandshakeKey is the scheduler's handshake annotation; empty when the vendor has none.
	HandshakeKey string
	// ScoreKey is the optional topology score annotation (NVIDIA only).
	ScoreKey string
	// ResourceName is the extended resource the device plugin advertises to the kubelet and
	// pods request (HAMi's device ConfigMap resourceCountName, e.g. "nvidia.com/gpu").
	ResourceName string
	// ResourceMemoryName and ResourceCoreName are the extended resources a pod asks device
	// memory and cores with (resourceMemoryName and resourceCoreName), when HAMi has them.
	ResourceMemoryName, ResourceCoreName string
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

// Part is a part of the SDK that uses a [Vendor]; [Vendor.Validate] checks the fields it needs.
type Part int

const (
	// PartRegister writes the register annotation (package register): RegisterKey, JSON or
	// legacy format.
	PartRegister Part = iota
	// PartHandshake decides and writes the handshake (packages handshake, schedcache):
	// RegisterKey in JSON or legacy format, HandshakeKey, ResourceName.
	PartHandshake
	// PartKubelet advertises the devices to the kubelet (package kubeletplugin): ResourceName,
	// an extended resource name (a domain, "/", a name).
	PartKubelet
	// PartAllocate serves the kubelet's Allocate with HAMi's pod protocol (package
	// nodeagent): ToAllocateKey (without it the agent hands the kubelet's devices to its
	// Allocator without the protocol).
	PartAllocate
	// PartNodeAgent is the node agent as a whole (package nodeagent): what PartRegister and
	// PartKubelet need.
	PartNodeAgent
)

// String names the part.
func (p Part) String() string {
	switch p {
	case PartRegister:
		return "register"
	case PartHandshake:
		return "handshake"
	case PartKubelet:
		return "kubelet"
	case PartAllocate:
		return "allocate"
	case PartNodeAgent:
		return "node agent"
	default:
		return "unknown part"
	}
}

// Validate reports whether v has every field part needs. The error wraps
// [ErrIncompleteVendor] and names each missing field and the value HAMi's chart uses for it.
func (v Vendor) Validate(part Part) error {
	var missing []string
	need := func(ok bool, what string) {
		if !ok {
			missing = append(missing, what)
		}
	}
	name := v.Name
	if name == "" {
		name = "(unnamed)"
		missing = append(missing, "Name (HAMi's vendor word, e.g. \"NVIDIA\")")
	}
	switch part {
	case PartRegister:
		need(v.RegisterKey != "", "RegisterKey (e.g. \"hami.io/node-<name>-register\"; capacity vendors have none and need no writer)")
		need(v.RegisterKey == "" || v.Format == FormatJSON || v.Format == FormatLegacy,
			"Format FormatJSON or FormatLegacy (the vendor's "+v.Format.String()+" format is read by HAMi's scheduler, not written by this SDK)")
	case PartHandshake:
		need(v.RegisterKey != "", "RegisterKey")
		need(v.Format == FormatJSON || v.Format == FormatLegacy, "Format FormatJSON or FormatLegacy (the vendor has "+v.Format.String()+")")
		need(v.HandshakeKey != "", "HandshakeKey (e.g. \"hami.io/node-handshake-<name>\")")
		need(v.ResourceName != "", "ResourceName (the extended resource, e.g. \"nvidia.com/gpu\")")
	case PartKubelet:
		need(v.ResourceName != "", "ResourceName (the extended resource the kubelet counts, e.g. \"nvidia.com/gpu\")")
		need(v.ResourceName == "" || extendedResourceName(v.ResourceName), fmt.Sprintf("ResourceName %q as <domain>/<name> outside kubernetes.io", v.ResourceName))
	case PartAllocate:
		need(v.ToAllocateKey != "", "ToAllocateKey (the pod annotation the scheduler writes, e.g. \"hami.io/<name>-devices-to-allocate\")")
	case PartNodeAgent:
		if err := v.Validate(PartRegister); err != nil {
			return err
		}
		return v.Validate(PartKubelet)
	default:
		return fmt.Errorf("validate vendor %s: unknown part %d: %w", name, int(part), ErrIncompleteVendor)
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("vendor %s lacks what the %s part needs: %s: %w", name, part, strings.Join(missing, "; "), ErrIncompleteVendor)
}

// extendedResourceName reports whether name is <domain>/<name> outside kubernetes.io, as
// the kubelet requires of a device plugin's resource.
func extendedResourceName(name string) bool {
	domain, rest, ok := strings.Cut(name, "/")
	if !ok || domain == "" || rest == "" || strings.Contains(rest, "/") || !strings.Contains(domain, ".") {
		return false
	}
	return domain != "kubernetes.io" && !strings.HasSuffix(domain, ".kubernetes.io") && domain != "requests" && domain != "limits"
}

// SocketName is the base name of the device plugin socket of v in the kubelet's plugin
// folder: "hamireg-" and the resource name with "/" as "-" and its domain cut to the first
// label, lower case, e.g. "hamireg-nvidia-gpu.sock" for nvidia.com/gpu and
// "hamireg-huawei-ascend910b3.sock" for huawei.com/Ascend910B3, so that agents of two
// vendors on one node never share a socket. Without a resource name it is derived from Name.
func (v Vendor) SocketName() string {
	base := strings.ToLower(v.Name)
	if domain, rest, ok := strings.Cut(v.ResourceName, "/"); ok {
		first, _, _ := strings.Cut(domain, ".")
		base = strings.ToLower(first + "-" + rest)
	}
	var b strings.Builder
	for _, r := range base {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	return "hamireg-" + cmp.Or(b.String(), "device") + ".sock"
}

// NVIDIA returns the NVIDIA vendor: register key [KeyNVIDIARegister], handshake key
// [KeyNVIDIAHandshake] (unsuffixed), resource [ResourceNVIDIAGPU] with nvidia.com/gpumem and
// nvidia.com/gpucores, JSON format.
func NVIDIA() Vendor {
	return Vendor{
		Name:               VendorNVIDIA,
		RegisterKey:        KeyNVIDIARegister,
		HandshakeKey:       KeyNVIDIAHandshake,
		ScoreKey:           KeyNVIDIAScore,
		ResourceName:       ResourceNVIDIAGPU,
		ResourceMemoryName: "nvidia.com/gpumem",
		ResourceCoreName:   "nvidia.com/gpucores",
		ToAllocateKey:      KeyNVIDIAToAllocate,
		AllocatedKey:       KeyNVIDIAAllocated,
		Format:             FormatJSON,
	}
}

// NewVendor returns a vendor that HAMi does not know, named name, with the keys HAMi's
// conventions give the lower-cased name n: register "hami.io/node-<n>-register", handshake
// "hami.io/node-handshake-<n>", pod annotations "hami.io/<n>-devices-to-allocate" and
// "hami.io/<n>-devices-allocated", JSON format, and resource resourceName (e.g.
// "acme.example/npu"). Memory and core resources are left empty; set them on the result.
// A node agent can ship on it as it is; HAMi's scheduler does not schedule it.
func NewVendor(name, resourceName string) Vendor {
	n := strings.ToLower(name)
	return Vendor{
		Name:          name,
		RegisterKey:   "hami.io/node-" + n + "-register",
		HandshakeKey:  "hami.io/node-handshake-" + n,
		ResourceName:  resourceName,
		ToAllocateKey: "hami.io/" + n + "-devices-to-allocate",
		AllocatedKey:  "hami.io/" + n + "-devices-allocated",
		Format:        FormatJSON,
	}
}

// Ascend returns the vendor of one Huawei Ascend chip by its vendor word (e.g.
// "Ascend910B3"), as configured in HAMi's chart: register key "hami.io/node-register-<chip>",
// handshake "hami.io/node-handshake-<chip>", resources "huawei.com/<chip>",
// "huawei.com/<chip>-memory" and "huawei.com/<chip>-core", JSON format.
func Ascend(chip string) Vendor {
	return Vendor{
		Name:               chip,
		RegisterKey:        "hami.io/node-register-" + chip,
		HandshakeKey:       "hami.io/node-handshake-" + chip,
		ResourceName:       "huawei.com/" + chip,
		ResourceMemoryName: "huawei.com/" + chip + "-memory",
		ResourceCoreName:   "huawei.com/" + chip + "-core",
		ToAllocateKey:      "hami.io/" + chip + "-devices-to-allocate",
		AllocatedKey:       "hami.io/" + chip + "-devices-allocated",
		Format:             FormatJSON,
	}
}

// Iluvatar returns the vendor of one Iluvatar chip (e.g. "BI-V150"): register key
// "hami.io/node-<chip>-register", handshake "hami.io/node-handshake-<chip>", resources
// "iluvatar.ai/<chip>-vgpu", "iluvatar.ai/<chip>.vMem" and "iluvatar.ai/<chip>.vCore", legacy
// format.
func Iluvatar(chip string) Vendor {
	return Vendor{
		Name:               chip,
		RegisterKey:        "hami.io/node-" + chip + "-register",
		HandshakeKey:       "hami.io/node-handshake-" + chip,
		ResourceName:       "iluvatar.ai/" + chip + "-vgpu",
		ResourceMemoryName: "iluvatar.ai/" + chip + ".vMem",
		ResourceCoreName:   "iluvatar.ai/" + chip + ".vCore",
		ToAllocateKey:      "hami.io/" + chip + "-devices-to-allocate",
		AllocatedKey:       "hami.io/" + chip + "-devices-allocated",
		Format:             FormatLegacy,
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
// chips of HAMi's chart (which HAMi adds only when those devices are enabled). Resource names
// are those of the chart's device ConfigMap and values (v2.9.0; where master renamed one, the
// field's comment in the table says so). The slice is new on every call.
//
// Which part can use which entry follows from its keys ([Vendor.Validate]): every entry with
// a register key in JSON format and a resource name can ship a node agent; capacity vendors
// have no register annotation (HAMi builds their devices from the Node's capacity); the
// extender of this SDK fits NVIDIA only, the others are scheduled by HAMi's scheduler.
func Vendors() []Vendor {
	vs := []Vendor{
		NVIDIA(),
		// Hygon DCU; charts from v2.10 name the resources hygon.com/hcunum, hcumem and hcucores.
		{Name: "DCU", RegisterKey: "hami.io/node-dcu-register", HandshakeKey: "hami.io/node-handshake-dcu", Format: FormatLegacy,
			ResourceName: "hygon.com/dcunum", ResourceMemoryName: "hygon.com/dcumem", ResourceCoreName: "hygon.com/dcucores",
			ToAllocateKey: "hami.io/dcu-devices-to-allocate", AllocatedKey: "hami.io/dcu-devices-allocated"},
		// Kunlunxin vXPU (shared XPUs).
		{Name: "XPU", RegisterKey: "hami.io/node-register-xpu", HandshakeKey: "hami.io/node-handshake-xpu", Format: FormatJSON,
			ResourceName: "kunlunxin.com/vxpu", ResourceMemoryName: "kunlunxin.com/vxpu-memory",
			ToAllocateKey: "hami.io/xpu-devices-to-allocate", AllocatedKey: "hami.io/xpu-devices-allocated"},
		{Name: "Vastai", RegisterKey: "hami.io/node-va-register", HandshakeKey: "hami.io/node-handshake-va", Format: FormatJSON, ForceDevcore100: true,
			ResourceName: "vastaitech.com/va"},
		{Name: "Metax-SGPU", RegisterKey: "metax-tech.com/node-gpu-devices", Format: FormatVendorSpecific,
			ResourceName: "metax-tech.com/sgpu", ResourceMemoryName: "metax-tech.com/vmemory", ResourceCoreName: "metax-tech.com/vcore",
			ToAllocateKey: "hami.io/metax-sgpu-devices-to-allocate", AllocatedKey: "hami.io/metax-sgpu-devices-allocated"},
		{Name: "MLU", Format: FormatCapacity,
			ResourceName: "cambricon.com/vmlu", ResourceMemoryName: "cambricon.com/mlu.smlu.vmemory", ResourceCoreName: "cambricon.com/mlu.smlu.vcore",
			ToAllocateKey: "hami.io/cambricon-mlu-devices-to-allocate", AllocatedKey: "hami.io/cambricon-mlu-devices-allocated"},
		// Enflame GCU; the shared (DRS) GCU is enflame.com/drs-gcu with gcu-memory and gcu-core.
		{Name: "GCU", Format: FormatCapacity,
			ResourceName:  "enflame.com/gcu",
			ToAllocateKey: "hami.io/enflame-gcu-devices-to-allocate", AllocatedKey: "hami.io/enflame-gcu-devices-allocated"},
		{Name: "Mthreads", Format: FormatCapacity,
			ResourceName: "mthreads.com/vgpu", ResourceMemoryName: "mthreads.com/sgpu-memory", ResourceCoreName: "mthreads.com/sgpu-core",
			ToAllocateKey: "hami.io/mthreads-vgpu-devices-to-allocate", AllocatedKey: "hami.io/mthreads-vgpu-devices-allocated"},
		{Name: "Metax-GPU", Format: FormatCapacity,
			ResourceName:  "metax-tech.com/gpu",
			ToAllocateKey: "hami.io/metax-gpu-devices-to-allocate", AllocatedKey: "hami.io/metax-gpu-devices-allocated"},
		// Kunlunxin whole XPUs.
		{Name: "kunlun", Format: FormatCapacity, ResourceName: "kunlunxin.com/xpu", AllocatedKey: "hami.io/kunlun-allocated"},
		{Name: "AWSNeuron", Format: FormatCapacity, ResourceName: "aws.amazon.com/neuron", ResourceCoreName: "aws.amazon.com/neuroncore",
			AllocatedKey: "hami.io/aws-neuron-devices-allocated"},
		{Name: "AMDGPU", RegisterKey: "hami.io/node-amd-register", Format: FormatJSON, MasterOnly: true,
			ResourceName: "amd.com/gpu", ResourceMemoryName: "amd.com/gpumem", ResourceCoreName: "amd.com/gpucores",
			AllocatedKey: "hami.io/amd-devices-allocated"},
		{Name: "biren", RegisterKey: "hami.io/node-biren-register", HandshakeKey: "hami.io/node-handshake-biren", Format: FormatJSON, MasterOnly: true,
			ResourceName: "birentech.com/gpu"},
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
