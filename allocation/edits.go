package allocation

// DeviceNode is a device file the container gets: a pluginapi.DeviceSpec of the kubelet's
// device plugin API.
type DeviceNode struct {
	// ContainerPath is the path in the container, HostPath the device file on the host. The
	// kubelet hands HostPath to the container runtime as is: a plugin that runs in a container
	// must see the host's device files at their host paths (mount the host's /dev at /dev).
	ContainerPath, HostPath string
	// Permissions are cgroup device permissions, "r", "w", "m" combined; default "rw".
	Permissions string
}

// DefaultDeviceNodePermissions are the cgroup permissions of a [DeviceNode] that names none.
const DefaultDeviceNodePermissions = "rw"

// Mount is a host path mounted into the container: a pluginapi.Mount of the kubelet's device
// plugin API.
type Mount struct {
	ContainerPath, HostPath string
	ReadOnly                bool
}

// Response is what the device plugin answers the kubelet for one container, the "container
// edits" of its devices: every field maps to one field of the kubelet's
// ContainerAllocateResponse. Each vendor fills what its runtime needs (device nodes, CDI
// names, environment, mounts, ...); for NVIDIA, package
// [github.com/hamireg/hamireg/hamicore] fills Envs, Mounts and StateDir with HAMi-core's
// edits.
type Response struct {
	// Envs are environment variables set in the container.
	Envs map[string]string
	// Mounts are host paths mounted into the container.
	Mounts []Mount
	// DeviceNodes are device files created in the container.
	DeviceNodes []DeviceNode
	// CDIDevices are fully qualified CDI device names (vendor.com/class=name) that the
	// container runtime resolves from its CDI specs.
	CDIDevices []string
	// Annotations are added to the container (ContainerAllocateResponse.Annotations), for the
	// container runtime.
	Annotations map[string]string
	// StateDir is a folder on the host that the caller creates empty, mode 0777, before
	// answering: HAMi-core's state folder of the container, which hamicore's answers mount
	// at <HookPath>/vgpu (HAMi's plugin recreates it on every Allocate). "" for answers that
	// need none.
	StateDir string
}
