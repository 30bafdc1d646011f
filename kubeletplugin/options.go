package kubeletplugin

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/clock"

	"github.com/hamireg/hamireg/annotation"
)

// Defaults of [Options].
const (
	// DefaultPluginDir is the kubelet's device-plugin folder for the default --root-dir
	// (/var/lib/kubelet): the kubelet's own [pluginapi.DevicePluginPath],
	// "/var/lib/kubelet/device-plugins/". It holds kubelet.sock and the plugins' sockets.
	DefaultPluginDir = pluginapi.DevicePluginPath
	// DefaultRegistryDir is the kubelet's plugin-watcher folder for the default --root-dir.
	DefaultRegistryDir = "/var/lib/kubelet/plugins_registry"
	// DefaultSocketName is the socket name of the default vendor, NVIDIA, in the plugin folder;
	// other vendors default to their own, annotation.Vendor.SocketName.
	DefaultSocketName = "hamireg-nvidia-gpu.sock"
	// KubeletSocketName is the name of the kubelet's registration socket in the plugin folder,
	// the base name of [pluginapi.KubeletSocket] (a test keeps the two in step: Go cannot
	// take a constant apart).
	KubeletSocketName = "kubelet.sock"

	defaultRegisterTimeout = 10 * time.Second
	defaultInitialBackoff  = 100 * time.Millisecond
	defaultMaxBackoff      = 30 * time.Second
	defaultResyncPeriod    = 5 * time.Second
	defaultDrainTimeout    = 2 * time.Second
	maxUnixSocketPath      = 107 // sun_path is 108 bytes including the terminating NUL
)

// Mode selects how the plugin announces itself to the kubelet.
type Mode int

const (
	// ModeRegister (the default) is the classic device-plugin registration: the plugin
	// serves <PluginDir>/<SocketName> and calls Register on <PluginDir>/kubelet.sock; it
	// watches the folder and registers again when the kubelet restarts.
	ModeRegister Mode = iota
	// ModePluginWatcher serves <RegistryDir>/<SocketName> with both the plugin-registration
	// service (GetInfo, NotifyRegistrationStatus) and the device-plugin service; the kubelet's
	// plugin watcher finds the socket and dials it, also after a kubelet restart.
	ModePluginWatcher
)

// String returns the mode's name.
func (m Mode) String() string {
	switch m {
	case ModeRegister:
		return "Register"
	case ModePluginWatcher:
		return "PluginWatcher"
	default:
		return fmt.Sprintf("Mode(%d)", int(m))
	}
}

// AllocateFunc answers the kubelet's Allocate call: one ContainerAllocateResponse per
// ContainerAllocateRequest, in order. devices are the GPUs published at the time of the call
// (the last [Plugin.SetDevices], canonical order), shared and read-only. ctx carries Run's
// logger (klog.FromContext).
type AllocateFunc func(ctx context.Context, devices []annotation.Device, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error)

// PreferredAllocationFunc answers GetPreferredAllocation (a hint for the kubelet). devices are
// as for [AllocateFunc].
type PreferredAllocationFunc func(ctx context.Context, devices []annotation.Device, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error)

// PreStartContainerFunc answers PreStartContainer, called before each container that got
// devices from this plugin starts. devices are as for [AllocateFunc].
type PreStartContainerFunc func(ctx context.Context, devices []annotation.Device, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error)

// Options configures a [Plugin]. The zero value is valid: every field documents its default.
type Options struct {
	// Vendor names the extended resource the plugin advertises (Vendor.ResourceName). Default
	// annotation.NVIDIA(), resource nvidia.com/gpu. Only emptiness is checked here; the kubelet
	// validates the name and its verdict (e.g. `the ResourceName "gpu" is invalid`) is
	// returned by Run.
	Vendor annotation.Vendor
	// Mode is the registration mode. Default [ModeRegister].
	Mode Mode
	// PluginDir is the kubelet's device-plugin folder: kubelet.sock is there and, in
	// ModeRegister, the plugin's socket goes there. Default [DefaultPluginDir]; for a kubelet
	// started with --root-dir use [PluginDirFromRootDir].
	PluginDir string
	// RegistryDir is the kubelet's plugin-watcher folder, used in ModePluginWatcher only.
	// Default [DefaultRegistryDir]; see [RegistryDirFromRootDir].
	RegistryDir string
	// SocketName is the base name of the plugin's socket; it is also the Endpoint sent in
	// Register. Default Vendor.SocketName() ([DefaultSocketName] for NVIDIA). It must end in ".sock" and contain no "/".
	SocketName string
	// Endpoint is, in ModePluginWatcher, the socket path as the kubelet sees it (differs from
	// the path in this process when the folder is mounted elsewhere in the container). Default:
	// the socket's path in this process.
	Endpoint string
	// Allocate answers Allocate. Default: one empty ContainerAllocateResponse per container.
	Allocate AllocateFunc
	// GetPreferredAllocation, when set, is advertised in GetDevicePluginOptions and answers
	// GetPreferredAllocation. Default: not advertised (the RPC returns Unimplemented).
	GetPreferredAllocation PreferredAllocationFunc
	// PreStartContainer, when set, makes the kubelet call it before containers start
	// (PreStartRequired). Default: not required (the RPC returns an empty response).
	PreStartContainer PreStartContainerFunc
	// Clock drives backoff, resync and drain timers. Default clock.RealClock{}.
	Clock clock.WithTicker
	// RegisterTimeout bounds one Register call. Default 10 s.
	RegisterTimeout time.Duration
	// InitialBackoff is the first retry delay after a failed registration; it doubles up to
	// MaxBackoff and resets when the kubelet socket is re-created. Defaults 100 ms and 30 s.
	InitialBackoff time.Duration
	// MaxBackoff caps the retry delay. Default 30 s.
	MaxBackoff time.Duration
	// ResyncPeriod is how often the plugin checks, besides fsnotify events, that its socket
	// and the kubelet socket it registered with are still in place. Default 5 s.
	ResyncPeriod time.Duration
	// DrainTimeout bounds how long a restart or shutdown waits for the kubelet to close its
	// connection after the plugin ended the ListAndWatch stream. Default 2 s.
	DrainTimeout time.Duration
	// NUMATopology sends each GPU's NUMA node (annotation.Device.Numa; none when negative) with
	// its virtual devices, as HAMi v2.10.0's device plugin does with enableNumaTopology
	// (node configuration key "enablenumatopology", chart value
	// devicePlugin.enableNumaTopology). The kubelet's Topology Manager then aligns a container's
	// GPU with its CPUs: under its single-numa-node and restricted policies a pod whose CPUs
	// and GPU replicas cannot share a NUMA node is refused at admission. Default false, as HAMi
	// v2.10.0 (v2.9.0 never sends it): no NUMA preference. MIG devices carry theirs either
	// way (see [VirtualDevices]).
	NUMATopology bool
}

// PluginDirFromRootDir returns the device-plugin folder of a kubelet started with
// --root-dir=root: <root>/device-plugins.
func PluginDirFromRootDir(root string) string { return filepath.Join(root, "device-plugins") }

// RegistryDirFromRootDir returns the plugin-watcher folder of a kubelet started with
// --root-dir=root: <root>/plugins_registry.
func RegistryDirFromRootDir(root string) string { return filepath.Join(root, "plugins_registry") }

func (o Options) withDefaults() Options {
	o.Vendor = cmp.Or(o.Vendor, annotation.NVIDIA())
	o.PluginDir = cmp.Or(o.PluginDir, DefaultPluginDir)
	o.RegistryDir = cmp.Or(o.RegistryDir, DefaultRegistryDir)
	o.SocketName = cmp.Or(o.SocketName, o.Vendor.SocketName())
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	o.RegisterTimeout = cmp.Or(o.RegisterTimeout, defaultRegisterTimeout)
	o.InitialBackoff = cmp.Or(o.InitialBackoff, defaultInitialBackoff)
	o.MaxBackoff = cmp.Or(o.MaxBackoff, defaultMaxBackoff)
	o.ResyncPeriod = cmp.Or(o.ResyncPeriod, defaultResyncPeriod)
	o.DrainTimeout = cmp.Or(o.DrainTimeout, defaultDrainTimeout)
	return o
}

func (o Options) validate() error {
	var problems []string
	if o.Mode != ModeRegister && o.Mode != ModePluginWatcher {
		problems = append(problems, fmt.Sprintf("unknown Mode %d", int(o.Mode)))
	}
	if strings.Contains(o.SocketName, "/") || !strings.HasSuffix(o.SocketName, ".sock") || o.SocketName == ".sock" {
		problems = append(problems, fmt.Sprintf("SocketName %q must be a file name ending in .sock", o.SocketName))
	}
	if o.SocketName == KubeletSocketName {
		problems = append(problems, "SocketName must not be kubelet.sock")
	}
	if n := len(filepath.Join(o.socketDir(), o.SocketName)); n > maxUnixSocketPath {
		problems = append(problems, fmt.Sprintf("socket path %s is %d bytes, over the unix limit of %d", filepath.Join(o.socketDir(), o.SocketName), n, maxUnixSocketPath))
	}
	vendorErr := o.Vendor.Validate(annotation.PartKubelet)
	if vendorErr != nil {
		problems = append(problems, vendorErr.Error())
	}
	for _, d := range []struct {
		name string
		d    time.Duration
	}{
		{"RegisterTimeout", o.RegisterTimeout}, {"InitialBackoff", o.InitialBackoff}, {"MaxBackoff", o.MaxBackoff},
		{"ResyncPeriod", o.ResyncPeriod}, {"DrainTimeout", o.DrainTimeout},
	} {
		if d.d < 0 {
			problems = append(problems, fmt.Sprintf("%s %v is negative", d.name, d.d))
		}
	}
	if o.MaxBackoff < o.InitialBackoff {
		problems = append(problems, fmt.Sprintf("MaxBackoff %v is below InitialBackoff %v", o.MaxBackoff, o.InitialBackoff))
	}
	if len(problems) == 0 {
		return nil
	}
	if vendorErr != nil { // also errors.Is annotation.ErrIncompleteVendor
		return fmt.Errorf("%s: %w: %w", strings.Join(problems, "; "), ErrInvalidOptions, annotation.ErrIncompleteVendor)
	}
	return fmt.Errorf("%s: %w", strings.Join(problems, "; "), ErrInvalidOptions)
}

// socketDir is the folder of the plugin's own socket.
func (o Options) socketDir() string {
	if o.Mode == ModePluginWatcher {
		return o.RegistryDir
	}
	return o.PluginDir
}
