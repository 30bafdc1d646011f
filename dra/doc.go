// Package dra maps the GPUs a node agent scans ([annotation.Device]) to Kubernetes Dynamic
// Resource Allocation devices (resource.k8s.io/v1): one device per GPU that several claims
// may share, with consumable capacities memory and cores, health as a device taint and the
// standard PCI attributes. It is pure: it imports k8s.io/api and no client.
//
// The same scan that feeds HAMi's register annotation feeds [Devices]; the node agent hands
// the result to the DRA kubelet plugin (package draplugin), which publishes it as the node's
// ResourceSlice, and reads each prepared claim's allocation back with [ConsumedFromResult].
// kube-scheduler then does, for claims, what HAMi's extender does for pods: a claim that asks
// {memory: 10Gi, cores: 30} gets a GPU with that much left, and the allocator records the
// amounts in the claim's consumedCapacity.
//
// # Profiles
//
// A [Profile] names the devices. Two are offered ([ProfileByName] takes the names of a flag):
//
//	                    SDKProfile ("sdk")               HAMiProfile ("hami")
//	driver, class       gpu.hamireg.io                   hami-core-gpu.project-hami.io
//	device name         gpu-<index>                      hami-gpu-<index>
//	attributes          uuid, index, numa, type (HAMi's  type = "hami-gpu", uuid, minor
//	                    model), productName, mode,       (= index), productName, pcieBusID,
//	                    resource.kubernetes.io/pciBusID, resource.kubernetes.io/pciBusID,
//	                    resource.kubernetes.io/numaNode  resource.kubernetes.io/numaNode
//	memory (bytes)      Devmem MiB; default: all of it; requests in steps of 1 MiB
//	cores (percent)     Devcore; default 0               Devcore; default 100
//	shares              Count; each allocation takes 1   (none)
//	DeviceClass CEL     device.driver == <driver>        ... && type == "hami-gpu"
//
// The HAMi profile is HAMi-DRA's contract verbatim, so HAMi-DRA's webhook, which turns a
// container's nvidia.com/gpu, gpumem and gpucores limits into a claim of the DeviceClass
// hami-core-gpu.project-hami.io with capacity requests cores and memory, works unchanged on
// a node served by this SDK. The SDK profile keeps HAMi's device-plugin meaning of the
// defaults and caps the claims per GPU at its split count, as HAMi's extender does. Choose
// the HAMi profile where HAMi-DRA's webhook writes the claims, the SDK profile otherwise. The
// attributes pcieBusID and resource.kubernetes.io/pciBusID are set when the scan knows the
// PCI address, resource.kubernetes.io/numaNode ([AttributeNUMANode], the standard attribute
// of KEP-6072, a scalar int) when it knows the NUMA node ([Extra].NUMANode); a GPU without
// NUMA affinity publishes none, as the KEP asks. The SDK profile keeps its own "numa"
// attribute beside it (from the register annotation's numa, 0 when unknown), so the CEL of
// existing claims still matches; the HAMi profile adds only the standard one, HAMi-DRA's
// attributes being unchanged. A claim that wants its GPUs on one NUMA node (or beside a NIC
// of another driver that publishes the same attribute) says so with a constraint:
//
//	constraints:
//	- matchAttribute: resource.kubernetes.io/numaNode
//
// The profiles differ in what a claim that asks no cores gets. In the SDK profile it consumes
// 0 cores and its container gets CUDA_DEVICE_SM_LIMIT_<i>=0, which HAMi-core reads as no
// limit: the device plugin's meaning of a pod without nvidia.com/gpucores. Such claims do
// not count against the GPU's cores, so any number of them fit (up to the shares). In the
// HAMi profile it consumes 100, exclusive compute, as HAMi's DRA driver publishes it; on a
// GPU whose Devcore is below 100 (core scaling) the default is Devcore, since the API wants
// the default inside the valid range. A claim that asks memory only takes the whole GPU's
// compute in the HAMi profile and none of it in the SDK's.
//
// # Ownership and health
//
// Every device allows multiple allocations, with a request policy on each capacity; the
// devices are sorted by index, the order in which the allocator tries them (first fit). An
// unhealthy GPU stays in the slice with the NoSchedule taint <driver>/unhealthy
// ([Profile.UnhealthyTaint]), so claims that do not tolerate it do not get it. One GPU has
// one owner: a GPU that the device-plugin world owns ([Options.Owned] false) gets the
// NoSchedule taint <driver>/owned-by-hami ([Profile.OwnedByHAMiTaint]), so kube-scheduler
// never hands it to a claim while HAMi's extender counts its memory; the node agent keeps
// the GPUs DRA owns out of the extender's view in turn. An operator's cordon (kubectl
// hami-doctor cordon) adds the NoSchedule taint <driver>/cordoned ([TaintCordoned]) through a
// DeviceTaintRule, without touching the slice.
//
// # MIG as partitionable devices
//
// [Slices] publishes a GPU in MIG mode that the DRA world owns the way KEP-4815 (partitionable
// devices, beta and on in Kubernetes 1.37) intends and NVIDIA's driver does for its dynamic
// MIG: a counter set per GPU with one counter per memory slice, and one device per placement
// of each MIG profile the scan found ([annotation.Device] MIGProfiles), consuming the counters
// of its memory slices, so that kube-scheduler never hands out two overlapping placements.
// Counter sets and devices go in separate slices of the node's pool, within the API's limits.
// [MIGDeviceClass] selects the MIG devices, [DeviceClass] the GPU devices; a claim picks a
// profile with the CEL of [ProfileSelector] and may fall back to a share of a GPU with a
// firstAvailable request (KEP-4816, GA). [MIGFromResult] reads an allocation back to the GPU
// and the placement, which the kubelet plugin then creates.
//
// # What is left out
//
// A GPU in MIG mode that the device plugin owns is not published at all (the device plugin's
// MIG path serves it), nor is its MIG placements' sharing: a MIG device goes to one claim.
// [ConsumedFromResult] rejects a result that names a MIG device; [MIGFromResult] reads it.
//
// Everything here is a pure function of its arguments: no I/O, no logging, no global state,
// safe for concurrent use. Errors wrap [ErrInvalidDevice] or [ErrInvalidResult] and say what
// to fix.
//
// Usage (the node agent does this on every scan, and the plugin at prepare time):
//
//	p := dra.SDKProfile()
//	devs, err := dra.Devices(scanned, dra.Options{Profile: p, Owned: owned})
//	if err != nil {
//		return err
//	}
//	publish(devs) // as the node's ResourceSlice
//
//	for _, r := range claim.Status.Allocation.Devices.Results {
//		c, err := dra.ConsumedFromResult(p, r, scanned)
//		if err != nil {
//			return err
//		}
//		prepare(c.Index, c.MemoryMiB, c.Cores)
//	}
package dra
