package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/hamicore"
	"github.com/hamireg/hamireg/internal/statedir"
	"github.com/hamireg/hamireg/mig"
)

// Allocator gives one container what it receives for its devices ("devices in, container
// edits out"): environment variables, mounts, device nodes, CDI device names and container
// annotations. The agent runs HAMi's protocol around it (node lock, entries, bind-phase,
// release, failure handling) and calls it once per container, one call at a time, after the
// protocol's checks and before the container's entry is consumed. An error fails the pod as
// every other Allocate failure does (see the package documentation).
//
// [HAMiCore] is the default; a [Source] that implements Allocator is used instead, and
// Options.Allocator overrides both.
type Allocator interface {
	Allocate(ctx context.Context, req ContainerRequest) (allocation.Response, error)
}

// AllocatorFunc adapts a function to [Allocator].
type AllocatorFunc func(ctx context.Context, req ContainerRequest) (allocation.Response, error)

// Allocate calls f.
func (f AllocatorFunc) Allocate(ctx context.Context, req ContainerRequest) (allocation.Response, error) {
	return f(ctx, req)
}

// ContainerRequest is what an [Allocator] is asked for one container.
type ContainerRequest struct {
	// Pod is the pod being served, as read from the API server; Container is the container
	// of Pod whose entry is served (init containers first). Both are nil for a vendor without
	// a to-allocate annotation (Vendor.ToAllocateKey ""): the kubelet does not say which pod
	// it admits, and no pod annotation names it.
	Pod       *corev1.Pod
	Container *corev1.Container
	// Devices are the container's entry of the vendor's to-allocate pod annotation (the
	// scheduler's choice), in order: UUID, vendor word, memory (MiB) and core share of each
	// device. For a vendor without a to-allocate annotation they are the devices of the
	// kubelet's replica IDs, one per ID in the kubelet's order (two replicas of one device give
	// two entries), with Type the vendor's name and Usedmem and Usedcores 0.
	Devices allocation.ContainerDevices
	// NodeDevices are the node's devices as last scanned (for index lookups, device paths...),
	// shared and read-only.
	NodeDevices []annotation.Device
	// DeviceIDs are the replica IDs the kubelet asked for ([kubeletplugin.VirtualDeviceID]).
	// With a to-allocate annotation they may name replicas of other devices than Devices (the
	// kubelet picks replicas by itself when GetPreferredAllocation's hint is not taken):
	// serve Devices, the scheduler's choice.
	DeviceIDs []string
	// MIG are the MIG devices the agent realised for Devices on GPUs in MIG mode, one per
	// device, in entry order (the reservations' deviceIndex order), with their MIG UUIDs; nil
	// for devices on GPUs in another mode.
	MIG []mig.Instance
}

// HAMiCore is the default Allocator: HAMi-core's environment and mounts for NVIDIA GPUs
// (hamicore.ContainerResponse: NVIDIA_VISIBLE_DEVICES, CUDA_DEVICE_MEMORY_LIMIT_<i>,
// CUDA_DEVICE_SM_LIMIT, the libvgpu.so and ld.so.preload mounts, ...) and, with
// PrepareStateDir, the container's state folder created on the host. For the MIG devices the
// agent realised (ContainerRequest.MIG) the answer is their MIG UUIDs alone
// (hamicore.MIGResponse: NVIDIA_VISIBLE_DEVICES, or the volume-mounts entries), no limit,
// mount, preload or state folder, as HAMi master's plugin answers in mig mode. The zero value
// is HAMi's chart without the state folder.
type HAMiCore struct {
	// Env shapes the container environment (HOOK_PATH, device list strategy, memory scaling,
	// ...). The zero value is the chart's.
	Env hamicore.EnvOptions
	// PrepareStateDir makes Allocate (re)create each container's HAMi-core state folder on
	// the host, <HookPath>/vgpu/containers/<pod UID>_<container>, empty with mode 0777, as
	// HAMi's plugin does. Set it when the agent's container sees the host's <HookPath>/vgpu
	// at the same path (the chart mounts it). Default false: the folder is left to the host.
	// A failure to create it is an error wrapping [ErrHost].
	PrepareStateDir bool
}

var _ Allocator = HAMiCore{}

// Allocate answers with HAMi-core's environment and mounts for req.Devices.
func (h HAMiCore) Allocate(_ context.Context, req ContainerRequest) (allocation.Response, error) {
	if req.Pod == nil || req.Container == nil {
		return allocation.Response{}, errors.New("HAMi-core's answer needs the pod and the container, which a vendor without a to-allocate annotation does not give: set Options.Allocator")
	}
	if len(req.MIG) > 0 {
		uuids := make([]string, len(req.MIG))
		for i, inst := range req.MIG {
			uuids[i] = inst.MigUUID
		}
		return hamicore.MIGResponse(uuids, h.Env)
	}
	for _, d := range req.Devices {
		if i := slices.IndexFunc(req.NodeDevices, func(g annotation.Device) bool { return g.ID == d.GPU() }); i >= 0 && req.NodeDevices[i].Mode == allocation.ModeMIG {
			return allocation.Response{}, fmt.Errorf("device %s is on a GPU in mig mode and the request carries no realised MIG instance (ContainerRequest.MIG): the agent realises them through Options.MIG; the GPU's UUID would give the container the whole GPU", d.UUID)
		}
	}
	c := hamicore.Container{PodUID: string(req.Pod.UID), Name: req.Container.Name, Env: req.Container.Env, CacheID: string(uuid.NewUUID())}
	r, err := hamicore.ContainerResponse(req.Devices, c, req.NodeDevices, h.Env)
	if err != nil {
		return allocation.Response{}, err
	}
	if h.PrepareStateDir && r.StateDir != "" { // none for MIG: HAMi-core does not run there
		if err := statedir.Recreate(r.StateDir); err != nil {
			return allocation.Response{}, fmt.Errorf("state folder: %w: %w", ErrHost, err)
		}
	}
	return r, nil
}

// validUTF8 checks that every string of r is valid UTF-8: gRPC refuses to send a protobuf
// string that is not, and the kubelet would only see a transport error.
func validUTF8(r allocation.Response) error {
	check := func(what, s string) error {
		if !utf8.ValidString(s) {
			return fmt.Errorf("%s %q is not valid UTF-8 (the kubelet's gRPC cannot carry it)", what, s)
		}
		return nil
	}
	var errs []error
	for k, v := range r.Envs {
		errs = append(errs, check("environment variable", k), check("value of "+k, v))
	}
	for k, v := range r.Annotations {
		errs = append(errs, check("annotation", k), check("value of annotation "+k, v))
	}
	for _, m := range r.Mounts {
		errs = append(errs, check("mount path", m.ContainerPath), check("mount path", m.HostPath))
	}
	for _, d := range r.DeviceNodes {
		errs = append(errs, check("device node", d.ContainerPath), check("device node", d.HostPath), check("device node permissions", d.Permissions))
	}
	for _, name := range r.CDIDevices {
		errs = append(errs, check("CDI device", name))
	}
	return errors.Join(errs...)
}

// containerResponse converts an Allocator's answer into the kubelet's, checking what the
// kubelet or the container runtime would reject later with a less helpful message.
func containerResponse(r allocation.Response) (*pluginapi.ContainerAllocateResponse, error) {
	resp := &pluginapi.ContainerAllocateResponse{Envs: r.Envs, Annotations: r.Annotations}
	if err := validUTF8(r); err != nil {
		return nil, err
	}
	for _, m := range r.Mounts {
		if m.ContainerPath == "" || m.HostPath == "" {
			return nil, fmt.Errorf("mount %+v: both paths are needed", m)
		}
		resp.Mounts = append(resp.Mounts, &pluginapi.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: m.ReadOnly})
	}
	for _, d := range r.DeviceNodes {
		perms := d.Permissions
		if perms == "" {
			perms = allocation.DefaultDeviceNodePermissions
		}
		if d.ContainerPath == "" || d.HostPath == "" {
			return nil, fmt.Errorf("device node %+v: both paths are needed", d)
		}
		if strings.Trim(perms, "rwm") != "" {
			return nil, fmt.Errorf("device node %s: permissions %q are not a combination of r, w and m", d.HostPath, perms)
		}
		resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{ContainerPath: d.ContainerPath, HostPath: d.HostPath, Permissions: perms})
	}
	for _, name := range r.CDIDevices {
		if _, _, _, err := hamicore.ParseCDIName(name); err != nil {
			return nil, fmt.Errorf("CDI device %q is not a fully qualified name (vendor.com/class=name): %w", name, err)
		}
		resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: name})
	}
	return resp, nil
}
