// Package hamicore is HAMi-core's container edits for NVIDIA GPUs, as pure functions: the
// environment and mounts HAMi's device plugin gives a container so that HAMi-core
// (libvgpu.so, preloaded into the container) limits its GPU memory and cores. It is the
// default answer of the SDK's node side for NVIDIA: nodeagent.HAMiCore, the node agent's
// default Allocator, answers with [ContainerResponse] (and [MIGResponse] for the MIG devices
// it realised), and draplugin's Prepare writes [ClaimResponse] into each claim's CDI spec.
//
// A vendor that is not NVIDIA writes its own Allocator, filling an
// [github.com/hamireg/hamireg/allocation.Response] with what its runtime needs (device nodes,
// CDI devices, its own variables), and never needs this package. The pod side of the protocol
// (the device lists, the fit, [github.com/hamireg/hamireg/allocation.ContainerAt]) is package
// allocation, which this package builds on and which does not import it.
//
// What a container gets, for its entry of the to-allocate annotation ([ContainerResponse]):
//
//   - NVIDIA_VISIBLE_DEVICES: the entry's GPU UUIDs (or NVML indexes with [DeviceIDIndex]), in
//     entry order without repeats; with [DeviceListVolumeMounts] [ContainerDevicesDir] and one
//     /dev/null mount per device under it.
//   - CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m per device, CUDA_DEVICE_SM_LIMIT from the first
//     device, CUDA_DEVICE_MEMORY_SHARED_CACHE=<HookPath>/vgpu/<cache ID>.cache.
//   - The optional variables of [EnvOptions]: CUDA_OVERSUBSCRIBE, LIBCUDA_LOG_LEVEL,
//     GPU_CORE_UTILIZATION_POLICY, NVIDIA_GDRCOPY, NVIDIA_GDS, NVIDIA_MOFED.
//   - HAMi-core's mounts: libvgpu.so, the container's state folder (Response.StateDir, which
//     the caller creates empty, mode 0777, before answering) at <HookPath>/vgpu,
//     /tmp/vgpulock, /etc/ld.so.preload (unless the container sets CUDA_DISABLE_CONTROL) and
//     the license files.
//
// On a device plugin's Allocate, for the container the pod's next entry belongs to:
//
//	c := hamicore.Container{PodUID: string(pod.UID), Name: ctr.Name, Env: ctr.Env, CacheID: cacheID}
//	resp, err := hamicore.ContainerResponse(entry, c, gpus, hamicore.EnvOptions{}) // the chart's settings
//	if err != nil {
//		return allocation.Response{}, err
//	}
//	// create resp.StateDir (empty, mode 0777), then answer the kubelet with resp
//
// MIG: for devices on GPUs in [github.com/hamireg/hamireg/allocation.ModeMIG],
// [ContainerResponse] answers the device list alone, with no HAMi-core limit, mount, preload
// or state folder, as HAMi's plugin does in mig mode (both versions): HAMi-core does not run
// on MIG instances, which isolate by themselves. An entry with devices on GPUs of both modes
// is [ErrMixedModes]. A node agent that realised the MIG instances answers with
// [MIGResponse]: their MIG UUIDs alone, as HAMi master's plugin does.
//
// DRA: [ClaimResponse] is the same edits for a DRA claim's devices, with one SM limit per
// device (CUDA_DEVICE_SM_LIMIT_<i>) and the claim's state folder under
// <HookPath>/vgpu/claims.
//
// Conformance tests replay the container responses of HAMi's own plugin (allocate.json, and
// mig-allocate.json by the rule above, both versions) through [ContainerResponse].
//
// Device list strategies (EnvOptions.DeviceListStrategy, a comma-separated list as the device
// plugins' --device-list-strategy, see [ParseDeviceListStrategies]): envvar (the default) or
// volume-mounts, and the CDI strategies cdi-annotations and cdi-cri for CDI-default runtimes.
// A CDI strategy names each device as the CDI device <CDIKind>=<id> (HAMi's and NVIDIA's
// [DefaultCDIKind], k8s.device-plugin.nvidia.com/gpu), in the container annotation
// <CDIAnnotationPrefix>nvidia-device-plugin_<response ID> (cdi-annotations) and in the
// kubelet's ContainerAllocateResponse.CdiDevices (cdi-cri); HAMi-core's limits and mounts are
// the same. [EnvOptions.Validate] refuses unknown values and strategies that cannot work
// together ([ErrInvalidOptions]); MIG devices and DRA claims refuse the CDI strategies
// ([ErrCDIUnsupported]). [ParseCDIName] checks a CDI device name as the CDI specification
// does.
//
// Everything here is a pure function of its arguments, with no I/O, safe for concurrent use.
package hamicore
