package schedplugin

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
)

// DefaultNodeLockWait is how long PreBind waits for HAMi's node lock by default.
const DefaultNodeLockWait = 10 * time.Second

// ErrInvalidArgs means the plugin's pluginConfig args were refused; the error says which
// field and why.
var ErrInvalidArgs = errors.New("invalid HAMiGPU args")

// Args is the plugin's pluginConfig args in a KubeSchedulerConfiguration (JSON or YAML). The
// zero value is HAMi's chart: NVIDIA only, HAMi master's rules, spread devices, binpack nodes.
// Unknown fields are refused.
type Args struct {
	metav1.TypeMeta `json:",inline"`

	// GPUSchedulerPolicy and NodeSchedulerPolicy apply when a pod's annotations do not choose
	// (allocation.Config); empty means spread and binpack.
	GPUSchedulerPolicy  string `json:"gpuSchedulerPolicy,omitempty"`
	NodeSchedulerPolicy string `json:"nodeSchedulerPolicy,omitempty"`
	// DefaultMemory, DefaultCores, DefaultGPUNum and MemoryFactor are allocation.Config's.
	DefaultMemory int32 `json:"defaultMemory,omitempty"`
	DefaultCores  int32 `json:"defaultCores,omitempty"`
	DefaultGPUNum int32 `json:"defaultGPUNum,omitempty"`
	MemoryFactor  int32 `json:"memoryFactor,omitempty"`
	// HAMiVersion is "master" (default) or "v2.9.0": whose rules the fit and the device lists
	// follow. Every profile of one scheduler must agree.
	HAMiVersion string `json:"hamiVersion,omitempty"`
	// Vendors are the vendors the plugin places; empty means NVIDIA only. A pod is fitted for
	// the first vendor it asks for. Every profile of one scheduler must agree.
	Vendors []VendorArgs `json:"vendors,omitempty"`
	// NodeLockWait bounds PreBind's wait for HAMi's node lock; zero means DefaultNodeLockWait.
	NodeLockWait metav1.Duration `json:"nodeLockWait,omitempty"`
	// Handshake chooses who writes the nodes' handshake annotations (channel 3). Every profile
	// of one scheduler must agree.
	Handshake HandshakeArgs `json:"handshake,omitempty"`
	// LegacyMetrics also serves HAMi's legacy metric names (GPUDeviceMemoryLimit,
	// nodeGPUOverview, …) beside the current ones on kube-scheduler's /metrics.
	LegacyMetrics bool `json:"legacyMetrics,omitempty"`
}

// The handshake modes of [HandshakeArgs].
const (
	// HandshakeLease writes the handshakes while this kube-scheduler holds its leader-election
	// Lease, as HAMi's scheduler does (schedcache.LeaseFollower): one writer per cluster. With
	// leader election off nothing is written.
	HandshakeLease = "lease"
	// HandshakeAlways writes them from every replica: a single scheduler without leader
	// election.
	HandshakeAlways = "always"
	// HandshakeOff writes none: HAMi's own scheduler or the SDK's extender writes them.
	HandshakeOff = "off"
)

// HandshakeArgs configure the leader-only writer of HAMi's handshake annotations
// (schedcache.Handshaker on the plugin's node cache), which tells a node whose device plugin
// stopped reporting from a live one. The zero value follows kube-scheduler's default Lease,
// kube-system/kube-scheduler.
type HandshakeArgs struct {
	// Mode is HandshakeLease (default), HandshakeAlways or HandshakeOff.
	Mode string `json:"mode,omitempty"`
	// LeaseNamespace and LeaseName are the Lease kube-scheduler campaigns for (its
	// leaderElection resourceNamespace and resourceName); default kube-system/kube-scheduler.
	LeaseNamespace string `json:"leaseNamespace,omitempty"`
	LeaseName      string `json:"leaseName,omitempty"`
}

// VendorArgs names one vendor. Name "NVIDIA" is annotation.NVIDIA() (the other fields are
// ignored); any other name is annotation.NewVendor(Name, ResourceName) with the memory and core
// resource names set.
type VendorArgs struct {
	Name               string `json:"name"`
	ResourceName       string `json:"resourceName,omitempty"`
	ResourceMemoryName string `json:"resourceMemoryName,omitempty"`
	ResourceCoreName   string `json:"resourceCoreName,omitempty"`
}

// DeepCopyObject implements runtime.Object, so that *Args may be handed to the factory as is.
func (a *Args) DeepCopyObject() runtime.Object {
	if a == nil {
		return nil
	}
	out := *a
	out.Vendors = append([]VendorArgs(nil), a.Vendors...)
	return &out
}

var _ runtime.Object = (*Args)(nil)

// decodeArgs reads the factory's args: nil (defaults), *Args, or *runtime.Unknown holding JSON
// or YAML, decoded strictly.
func decodeArgs(obj runtime.Object) (Args, error) {
	switch a := obj.(type) {
	case nil:
		return Args{}, nil
	case *Args:
		if a == nil {
			return Args{}, nil
		}
		return *a, nil
	case *runtime.Unknown:
		var out Args
		if a == nil || len(a.Raw) == 0 {
			return out, nil
		}
		if err := yaml.UnmarshalStrict(a.Raw, &out); err != nil {
			return Args{}, fmt.Errorf("%w: decode: %w", ErrInvalidArgs, err)
		}
		return out, nil
	default:
		return Args{}, fmt.Errorf("%w: args of type %T, want *runtime.Unknown or *schedplugin.Args", ErrInvalidArgs, obj)
	}
}

// vendorConfig is one vendor the plugin places, with the Config that fits its devices.
type vendorConfig struct {
	vendor annotation.Vendor
	cfg    allocation.Config
}

// settings are Args made ready: one vendorConfig per vendor, the lock wait, the handshake.
type settings struct {
	vendors       []vendorConfig
	version       allocation.Version
	nodeLockWait  time.Duration
	handshake     HandshakeArgs
	legacyMetrics bool
}

// settings validates a and completes its defaults.
func (a Args) settings() (settings, error) {
	var s settings
	switch a.HAMiVersion {
	case "", "master":
		s.version = allocation.VersionMaster
	case "v2.9.0":
		s.version = allocation.VersionV290
	default:
		return s, fmt.Errorf("%w: hamiVersion %q: want \"master\" or \"v2.9.0\"", ErrInvalidArgs, a.HAMiVersion)
	}
	base, err := allocation.Config{
		GPUSchedulerPolicy: allocation.Policy(a.GPUSchedulerPolicy), NodeSchedulerPolicy: allocation.Policy(a.NodeSchedulerPolicy),
		DefaultMemory: a.DefaultMemory, DefaultCores: a.DefaultCores, DefaultGPUNum: a.DefaultGPUNum, MemoryFactor: a.MemoryFactor,
		Version: s.version,
	}.WithDefaults()
	if err != nil {
		return s, fmt.Errorf("%w: %w", ErrInvalidArgs, err)
	}
	vendors := a.Vendors
	if len(vendors) == 0 {
		vendors = []VendorArgs{{Name: annotation.VendorNVIDIA}}
	}
	seen := map[string]bool{}
	for i, va := range vendors {
		v, err := va.vendor()
		if err != nil {
			return s, fmt.Errorf("%w: vendors[%d]: %w", ErrInvalidArgs, i, err)
		}
		if seen[v.Name] {
			return s, fmt.Errorf("%w: vendors[%d]: vendor %q listed twice", ErrInvalidArgs, i, v.Name)
		}
		seen[v.Name] = true
		cfg, err := allocation.ConfigFor(v, base)
		if err != nil {
			return s, fmt.Errorf("%w: vendors[%d] %q: %w", ErrInvalidArgs, i, v.Name, err)
		}
		s.vendors = append(s.vendors, vendorConfig{vendor: v, cfg: cfg})
	}
	s.nodeLockWait = a.NodeLockWait.Duration
	switch {
	case s.nodeLockWait < 0:
		return s, fmt.Errorf("%w: nodeLockWait %s is negative", ErrInvalidArgs, s.nodeLockWait)
	case s.nodeLockWait == 0:
		s.nodeLockWait = DefaultNodeLockWait
	}
	s.handshake = a.Handshake
	s.handshake.Mode = cmp.Or(s.handshake.Mode, HandshakeLease)
	s.handshake.LeaseNamespace = cmp.Or(s.handshake.LeaseNamespace, "kube-system")
	s.handshake.LeaseName = cmp.Or(s.handshake.LeaseName, "kube-scheduler")
	switch s.handshake.Mode {
	case HandshakeLease, HandshakeAlways, HandshakeOff:
	default:
		return s, fmt.Errorf("%w: handshake.mode %q: want %q, %q or %q", ErrInvalidArgs, s.handshake.Mode, HandshakeLease, HandshakeAlways, HandshakeOff)
	}
	s.legacyMetrics = a.LegacyMetrics
	return s, nil
}

// vendor is the annotation.Vendor va names.
func (va VendorArgs) vendor() (annotation.Vendor, error) {
	if va.Name == annotation.VendorNVIDIA {
		return annotation.NVIDIA(), nil
	}
	if va.Name == "" || va.ResourceName == "" {
		return annotation.Vendor{}, fmt.Errorf("vendor %q needs a name and a resourceName", va.Name)
	}
	v := annotation.NewVendor(va.Name, va.ResourceName)
	v.ResourceMemoryName, v.ResourceCoreName = va.ResourceMemoryName, va.ResourceCoreName
	return v, nil
}

// sameShared reports why two settings cannot share the cluster-wide state, "" when they can.
func (s settings) sameShared(o settings) string {
	if s.handshake != o.handshake {
		return fmt.Sprintf("handshake %+v, another profile %+v", s.handshake, o.handshake)
	}
	if s.legacyMetrics != o.legacyMetrics {
		return fmt.Sprintf("legacyMetrics %v, another profile %v", s.legacyMetrics, o.legacyMetrics)
	}
	if s.version != o.version {
		return fmt.Sprintf("hamiVersion %s, another profile %s", s.version, o.version)
	}
	if len(s.vendors) != len(o.vendors) {
		return fmt.Sprintf("%d vendors, another profile %d", len(s.vendors), len(o.vendors))
	}
	for i := range s.vendors {
		if s.vendors[i].vendor != o.vendors[i].vendor {
			return fmt.Sprintf("vendors[%d] %q, another profile %q", i, s.vendors[i].vendor.Name, o.vendors[i].vendor.Name)
		}
	}
	return ""
}
