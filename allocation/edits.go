package allocation

// DeviceNode is a device file the container gets: a pluginapi.DeviceSpec of the kubelet's
// device plugin API.
type DeviceNode struct {
	// ContainerPath is the path in the container, HostPath the device file on the host.
	ContainerPath, HostPath string
	// Permissions are cgroup device permissions, "r", "w", "m" combined; default "rw".
	Permissions string
}

// DefaultDeviceNodePermissions are the cgroup permissions of a [DeviceNode] that names none.
const DefaultDeviceNodePermissions = "rw"

// Response is what the device plugin answers the kubelet for one container, the "container
// edits" of its devices: every field maps to one field of the kubelet's
// ContainerAllocateResponse. [ContainerResponse] fills Envs, Mounts and StateDir (HAMi-core
// for NVIDIA); other vendors fill what their runtime needs (device nodes, CDI names, ...).
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
	// StateDir is HAMi-core's state folder of the container on the host, mounted at
	// <HookPath>/vgpu: the caller creates it empty, mode 0777, before answering (HAMi's
	// plugin recreates it on every Allocate). "" for answers that are not HAMi-core's.
	StateDir string
}
