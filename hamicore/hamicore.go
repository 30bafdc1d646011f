package hamicore

import (
	"cmp"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
)

// Chart defaults of the device plugin's container environment.
const (
	// DefaultHookPath is where HAMi-core (libvgpu.so) is installed on the host (HOOK_PATH).
	DefaultHookPath = "/usr/local"
	// DefaultLibCudaLogLevel is the chart's libCudaLogLevel.
	DefaultLibCudaLogLevel = "1"
	// ContainerDevicesDir is where the volume-mounts device list strategy mounts one entry per
	// device.
	ContainerDevicesDir = "/var/run/nvidia-container-devices"
)

// The device list and device ID strategies of NVIDIA's device plugin that HAMi's honours.
const (
	// DeviceListEnvVar lists the devices in NVIDIA_VISIBLE_DEVICES (the default).
	DeviceListEnvVar = "envvar"
	// DeviceListVolumeMounts lists them as mounts under [ContainerDevicesDir].
	DeviceListVolumeMounts = "volume-mounts"
	// DeviceListCDIAnnotations lists them as CDI devices in a container annotation
	// (<CDIAnnotationPrefix>nvidia-device-plugin_<response ID>: <kind>=<id>,...), which the
	// container runtime resolves from its CDI specs.
	DeviceListCDIAnnotations = "cdi-annotations"
	// DeviceListCDICRI lists them as CDI devices in the kubelet's
	// ContainerAllocateResponse.CdiDevices (allocation.Response.CDIDevices), which the kubelet
	// passes to the runtime through the CRI.
	DeviceListCDICRI = "cdi-cri"
	// DeviceIDUUID names devices by UUID (the default).
	DeviceIDUUID = "uuid"
	// DeviceIDIndex names them by NVML index.
	DeviceIDIndex = "index"
)

// EnvOptions are the device plugin settings that shape a container's environment. The zero
// value is HAMi's chart.
type EnvOptions struct {
	// HookPath is the host folder of HAMi-core (the HOOK_PATH environment variable of HAMi's
	// plugin). Default [DefaultHookPath].
	HookPath string
	// DeviceListStrategy is a comma-separated list of [DeviceListEnvVar] (the default, "")
	// or [DeviceListVolumeMounts], and [DeviceListCDIAnnotations] and [DeviceListCDICRI], as
	// the device plugins' --device-list-strategy (see [ParseDeviceListStrategies]).
	DeviceListStrategy string
	// CDIKind is the kind "<vendor>/<class>" of the CDI devices the CDI strategies name.
	// Default [DefaultCDIKind] (HAMi's and NVIDIA's); "nvidia.com/gpu" names the devices of
	// the spec the NVIDIA Container Toolkit writes by default.
	CDIKind string
	// CDIAnnotationPrefix is the prefix of the CDI annotation key (HAMi's
	// --cdi-annotation-prefix). Default [DefaultCDIAnnotationPrefix].
	CDIAnnotationPrefix string
	// DeviceIDStrategy is [DeviceIDUUID] (default) or [DeviceIDIndex].
	DeviceIDStrategy string
	// DeviceMemoryScaling above 1 sets CUDA_OVERSUBSCRIBE=true. Default 1.
	DeviceMemoryScaling float64
	// LibCudaLogLevel is LIBCUDA_LOG_LEVEL: nil means [DefaultLibCudaLogLevel], "" sets none.
	LibCudaLogLevel *string
	// DisableCoreLimit sets GPU_CORE_UTILIZATION_POLICY=disable.
	DisableCoreLimit bool
	// GDRCopy, GDS and MOFED set NVIDIA_GDRCOPY, NVIDIA_GDS and NVIDIA_MOFED to "enabled".
	GDRCopy, GDS, MOFED bool
	// LibVGPU is the host file mounted as <HookPath>/vgpu/libvgpu.so. HAMi mounts
	// <HookPath>/vgpu/libvgpu.so.<version> when that file exists; the caller, who can look,
	// says so here. Default <HookPath>/vgpu/libvgpu.so.
	LibVGPU string
	// License mounts <HookPath>/vgpu/license and vgpuvalidator into the container; set it when
	// <HookPath>/vgpu/license exists on the host.
	License bool
}

// ErrMixedModes is [ContainerResponse]'s error for a container whose devices are on GPUs in
// MIG mode and on GPUs in another mode: HAMi-core's limits and MIG instances do not mix in
// one answer.
var ErrMixedModes = errors.New("devices on GPUs in MIG and in another mode")

// Container identifies the container a response is for.
type Container struct {
	// PodUID and Name name the host folder HAMi-core keeps the container's state in.
	PodUID, Name string
	// Env is the container's environment: CUDA_DISABLE_CONTROL=true leaves out the
	// ld.so.preload mount, which turns HAMi-core's limits off.
	Env []corev1.EnvVar
	// CacheID names the shared memory cache file; HAMi's plugin uses a random UUID per
	// Allocate.
	CacheID string
	// ResponseID names the CDI annotation of [DeviceListCDIAnnotations]
	// (<prefix>nvidia-device-plugin_<ResponseID>); HAMi's plugin uses a random UUID per
	// container. Default CacheID.
	ResponseID string
}

// ContainerResponse builds the environment and mounts HAMi's device plugin gives a container
// whose devices are devs (its entry of the to-allocate annotation, [allocation.PodDevices]):
// NVIDIA_VISIBLE_DEVICES (UUIDs, or with [DeviceIDIndex] NVML indexes from gpus, in entry
// order without repeats), CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m per device,
// CUDA_DEVICE_SM_LIMIT from the first device, CUDA_DEVICE_MEMORY_SHARED_CACHE, the optional
// variables of opts, and HAMi-core's mounts: libvgpu.so, the container's state folder,
// /tmp/vgpulock, /etc/ld.so.preload (unless the container sets CUDA_DISABLE_CONTROL) and the
// license files. gpus are the node's GPUs, for the index strategy and the GPUs' modes.
//
// For devices on GPUs in [allocation.ModeMIG] the answer is the device list alone
// (NVIDIA_VISIBLE_DEVICES, or the volume-mounts entries), with no HAMi-core limit, mount or
// preload and no StateDir, as HAMi's plugin answers in mig mode (both versions): HAMi-core
// does not run on MIG instances, which isolate by themselves. Which MIG instance a device
// names (HAMi resolves it to a MIG UUID) is not decided here: the entry's IDs are listed as
// for any GPU; a node agent that realised the MIG devices answers with [MIGResponse] instead.
//
// With CDI strategies ([DeviceListCDIAnnotations], [DeviceListCDICRI]) the IDs are also
// named as CDI devices <CDIKind>=<id> (plus <vendor>/gds=all and <vendor>/mofed=all with GDS
// and MOFED), in the annotation <CDIAnnotationPrefix>nvidia-device-plugin_<ResponseID> and in
// Response.CDIDevices; with CDI strategies alone there is no NVIDIA_VISIBLE_DEVICES, nor
// NVIDIA_GDS or NVIDIA_MOFED, as with HAMi's plugin. HAMi-core's limits and mounts are the
// same under every strategy.
//
// It fails for options [EnvOptions.Validate] refuses ([ErrInvalidOptions]), an empty entry, a
// device the index strategy cannot find, an entry whose devices are on GPUs of both modes
// ([ErrMixedModes]), a MIG entry with a CDI strategy ([ErrCDIUnsupported]) and an ID that is
// not a valid CDI device name.
func ContainerResponse(devs allocation.ContainerDevices, c Container, gpus []annotation.Device, opts EnvOptions) (allocation.Response, error) {
	if err := opts.Validate(); err != nil {
		return allocation.Response{}, fmt.Errorf("container response for %s: %w", c.Name, err)
	}
	if len(devs) == 0 {
		return allocation.Response{}, fmt.Errorf("container response for %s: no devices in its entry", c.Name)
	}
	hook := cmp.Or(opts.HookPath, DefaultHookPath)
	vgpu := path.Join(hook, "vgpu")
	ids := make([]string, 0, len(devs))
	for _, d := range devs {
		id := d.UUID
		if opts.DeviceIDStrategy == DeviceIDIndex {
			i := slices.IndexFunc(gpus, func(g annotation.Device) bool { return g.ID == d.GPU() })
			if i < 0 {
				return allocation.Response{}, fmt.Errorf("container response for %s: unknown device %s (not a GPU of this node)", c.Name, d.UUID)
			}
			id = strconv.FormatUint(uint64(gpus[i].Index), 10)
		}
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	mig, err := migEntry(devs, gpus)
	if err != nil {
		return allocation.Response{}, fmt.Errorf("container response for %s: %w", c.Name, err)
	}
	r := allocation.Response{Envs: map[string]string{}}
	if err := deviceList(&r, ids, opts, cmp.Or(c.ResponseID, c.CacheID), mig); err != nil {
		return allocation.Response{}, fmt.Errorf("container response for %s: %w", c.Name, err)
	}
	if mig {
		return r, nil // HAMi-core does not run on MIG: the device list is the whole answer
	}
	r.StateDir = path.Join(vgpu, "containers", c.PodUID+"_"+c.Name)
	for i, d := range devs {
		r.Envs[fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d", i)] = fmt.Sprintf("%dm", d.Usedmem)
	}
	r.Envs["CUDA_DEVICE_SM_LIMIT"] = strconv.FormatInt(int64(devs[0].Usedcores), 10)
	r.Envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = path.Join(vgpu, c.CacheID+".cache")
	coreEdits(&r, vgpu, opts, !controlDisabled(c.Env))
	return r, nil
}

// deviceList sets the container's device list by the strategies of opts (validated by the
// caller): NVIDIA_VISIBLE_DEVICES=ids, or with [DeviceListVolumeMounts] [ContainerDevicesDir]
// and one /dev/null mount per ID under it, and with CDI strategies the CDI devices (see
// cdiEdits), named by responseID. A CDI strategy for MIG devices is [ErrCDIUnsupported].
func deviceList(r *allocation.Response, ids []string, opts EnvOptions, responseID string, mig bool) error {
	s, err := ParseDeviceListStrategies(opts.DeviceListStrategy)
	if err != nil {
		return err
	}
	if s.AnyCDI() {
		if mig {
			return fmt.Errorf("device list strategy %q for MIG devices: %w: the SDK creates MIG instances at Allocate, after the host's CDI spec was written, so the runtime could not resolve their CDI names: use envvar or volume-mounts on a MIG node",
				opts.DeviceListStrategy, ErrCDIUnsupported)
		}
		if err := cdiEdits(r, ids, s, opts, responseID); err != nil {
			return err
		}
	}
	switch {
	case s.VolumeMounts:
		r.Envs["NVIDIA_VISIBLE_DEVICES"] = ContainerDevicesDir
		for _, id := range ids {
			r.Mounts = append(r.Mounts, allocation.Mount{ContainerPath: path.Join(ContainerDevicesDir, id), HostPath: "/dev/null"})
		}
	case s.EnvVar:
		r.Envs["NVIDIA_VISIBLE_DEVICES"] = strings.Join(ids, ",")
	}
	return nil
}

// coreEdits adds what every HAMi-core answer has beside its limits: the optional variables of
// opts (NVIDIA_GDRCOPY, NVIDIA_GDS and NVIDIA_MOFED not with CDI strategies alone, whose CDI
// devices carry them) and the mounts libvgpu.so, r.StateDir at vgpu, /tmp/vgpulock,
// /etc/ld.so.preload (with preload) and the license files. opts are validated.
func coreEdits(r *allocation.Response, vgpu string, opts EnvOptions, preload bool) {
	if s, _ := ParseDeviceListStrategies(opts.DeviceListStrategy); !s.AllCDI() {
		for name, on := range map[string]bool{"NVIDIA_GDRCOPY": opts.GDRCopy, "NVIDIA_GDS": opts.GDS, "NVIDIA_MOFED": opts.MOFED} {
			if on {
				r.Envs[name] = "enabled"
			}
		}
	}
	if opts.DeviceMemoryScaling > 1 {
		r.Envs["CUDA_OVERSUBSCRIBE"] = "true"
	}
	level := DefaultLibCudaLogLevel
	if opts.LibCudaLogLevel != nil {
		level = *opts.LibCudaLogLevel
	}
	if level != "" {
		r.Envs["LIBCUDA_LOG_LEVEL"] = level
	}
	if opts.DisableCoreLimit {
		r.Envs["GPU_CORE_UTILIZATION_POLICY"] = "disable"
	}
	r.Mounts = append(r.Mounts,
		allocation.Mount{ContainerPath: path.Join(vgpu, "libvgpu.so"), HostPath: cmp.Or(opts.LibVGPU, path.Join(vgpu, "libvgpu.so")), ReadOnly: true},
		allocation.Mount{ContainerPath: vgpu, HostPath: r.StateDir},
		allocation.Mount{ContainerPath: "/tmp/vgpulock", HostPath: "/tmp/vgpulock"},
	)
	if preload {
		r.Mounts = append(r.Mounts, allocation.Mount{ContainerPath: "/etc/ld.so.preload", HostPath: path.Join(vgpu, "ld.so.preload"), ReadOnly: true})
	}
	if opts.License {
		r.Mounts = append(r.Mounts,
			allocation.Mount{ContainerPath: "/tmp/license", HostPath: path.Join(vgpu, "license"), ReadOnly: true},
			allocation.Mount{ContainerPath: "/usr/bin/vgpuvalidator", HostPath: path.Join(vgpu, "vgpuvalidator"), ReadOnly: true},
		)
	}
}

// MIGResponse builds the answer HAMi master's device plugin gives a container whose devices
// are MIG devices (realised instances of its hami.io/vgpu-mig-allocations reservations):
// NVIDIA_VISIBLE_DEVICES lists the MIG UUIDs, in order, comma-joined; with
// [DeviceListVolumeMounts] it is [ContainerDevicesDir] and each MIG UUID is a /dev/null mount
// under it. Nothing else: no HAMi-core limit, mount, preload or StateDir (HAMi-core does not
// run on MIG devices, which isolate by themselves). The device ID strategy does not change
// the list: with [DeviceIDIndex] HAMi answers an empty list in MIG mode (it looks the MIG
// UUIDs up among the kubelet's replica IDs and finds none); MIGResponse lists the MIG UUIDs,
// which the container runtime resolves under either strategy. It fails for options
// [EnvOptions.Validate] refuses, a CDI device list strategy ([ErrCDIUnsupported]: the
// instances were created after the host's CDI spec was written), an empty list and an empty
// UUID.
func MIGResponse(migUUIDs []string, opts EnvOptions) (allocation.Response, error) {
	if err := opts.Validate(); err != nil {
		return allocation.Response{}, fmt.Errorf("MIG response: %w", err)
	}
	if len(migUUIDs) == 0 {
		return allocation.Response{}, errors.New("MIG response: no MIG devices")
	}
	if slices.Contains(migUUIDs, "") {
		return allocation.Response{}, fmt.Errorf("MIG response: an empty MIG UUID in %q", migUUIDs)
	}
	r := allocation.Response{Envs: map[string]string{}}
	if err := deviceList(&r, migUUIDs, opts, "", true); err != nil {
		return allocation.Response{}, fmt.Errorf("MIG response: %w", err)
	}
	return r, nil
}

// migEntry reports whether the devices of an entry are on GPUs of gpus in
// [allocation.ModeMIG]; a GPU not in gpus counts as not MIG. An entry with both kinds is an
// error: one container cannot get HAMi-core's limits on some of its GPUs and MIG instances on
// others.
func migEntry(devs allocation.ContainerDevices, gpus []annotation.Device) (bool, error) {
	n := 0
	for _, d := range devs {
		i := slices.IndexFunc(gpus, func(g annotation.Device) bool { return g.ID == d.GPU() })
		if i >= 0 && gpus[i].Mode == allocation.ModeMIG {
			n++
		}
	}
	if n > 0 && n < len(devs) {
		return false, fmt.Errorf("%d of its %d devices are on GPUs in MIG mode: %w", n, len(devs), ErrMixedModes)
	}
	return n > 0, nil
}

// controlDisabled reports whether the container sets CUDA_DISABLE_CONTROL to a true value.
func controlDisabled(env []corev1.EnvVar) bool {
	for _, e := range env {
		if e.Name == "CUDA_DISABLE_CONTROL" {
			if on, err := strconv.ParseBool(e.Value); err == nil && on {
				return true
			}
		}
	}
	return false
}
