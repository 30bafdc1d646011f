// Package nvmlsim turns one of go-nvml's simulated servers (mock/dgxa100, dgxh100, dgxh200,
// dgxb200, mock/server) into a GPU node that [github.com/hamireg/hamireg/nvmlscan] can scan
// and watch without a GPU: it fills in what the simulated servers do not wire (PCI bus ids,
// event registration, an event set), builds the matching sysfs tree, and lets its caller
// inject XID events, event-wait failures and GPUs that stop answering. It answers a node
// monitor's usage queries with values its caller sets (see "Usage queries"). It also answers the
// topology queries the simulated servers leave unwired (common PCIe ancestor, NVLink state,
// remote PCI bus and device type) from a [Topology]: the NVSwitch interconnect of the DGX
// servers by default, or a DGX-1V's hybrid cube mesh of direct NVLinks, or PCIe alone
// ([Node.SetTopology]).
//
// It is for programs (a device plugin's --simulate mode, a demo) as much as for tests: it does
// not import package testing, so it may be linked into a production binary. Tests use it
// through [github.com/hamireg/hamireg/nvmlscan/nvmlscantest], which adds the testing.TB
// helpers. With nvmlscan and nvmlscantest it is one of the packages under nvmlscan/, the only
// ones of this SDK that import go-nvml; like go-nvml's mocks it needs cgo.
//
// # Lifecycle and concurrency
//
// [New] or [Wire] sets the server's functions once, before anything uses it. Afterwards the
// [Node]'s methods are safe for concurrent use with a running scanner: [Node.XID],
// [Node.Event] and [Node.WaitError] queue up to 64 events for the scanner's next waits (and
// block when the queue is full); [Node.SetLost] and the usage setters take effect at the next
// query. The node does
// not fake the clock: give the scanner a fake one to step through the health recovery rule.
//
// # MIG
//
// go-nvml's servers answer the MIG profile queries but never refuse a GPU instance and
// cannot enumerate MIG devices. [Wire] replaces their MIG calls with ones that behave as an
// A100/H100 does, so that a MIG manager and a device plugin can be tested end to end:
//
//   - GetMigMode/SetMigMode: current and pending mode, off until [Node.EnableMIG] or
//     SetMigMode(1) (applied at once on an idle GPU; [Node.SetMIGActivation] leaves it
//     pending instead); turning MIG off under live instances is ERROR_IN_USE.
//   - GetGpuInstanceProfileInfo(enum) answers, whatever the MIG mode, with info.Id the
//     nvidia-smi profile id (19, 20, 15, 14, 9, 5, 0 for GPU_INSTANCE_PROFILE_1_SLICE, _REV1,
//     _REV2, 2, 3, 4 and 7 slices), not the enum as go-nvml's presets do; that id is what
//     GetGpuInstancePossiblePlacements, GetGpuInstances and CreateGpuInstance* take. The
//     possible placements are the eight-memory-slice layout of nvidia-smi mig -lgipp
//     (1g {0..6}:1, 1g.10gb {0,2,4,6}:2, 2g {0,2,4}:2, 3g {0,4}:4, 4g {0}:4, 7g {0}:8) on
//     every server (go-nvml's H100, H200 and B200 presets give 3g and 7g sizes 3 and 7).
//     Memory and SM counts are the presets' (the A100-40GB preset is the table HAMi's
//     vectors were fed), except on the H200, which gets the vectors' table from a real
//     nvidia-smi mig -lgip (16384 MiB and 16 SMs for 1g.18gb … 143104 MiB and 132 SMs for
//     7g.141gb).
//   - CreateGpuInstanceWithPlacement refuses with ERROR_NOT_SUPPORTED while MIG mode is
//     off, ERROR_INVALID_ARGUMENT for an unknown profile id or a placement not in the
//     possible list, ERROR_INSUFFICIENT_RESOURCES beyond the profile's instance count or
//     for a placement overlapping a live GPU instance ([start, start+size) on memory
//     slices). GPU-instance ids are handed out from 1 per GPU, compute-instance ids from 0
//     per GPU instance (as the vectors' NVML; real drivers number them their own way).
//   - GPU instances: GetInfo (Placement, ProfileId), GetComputeInstanceProfileInfo (the
//     preset's, shared engines only), CreateComputeInstance (within the instance's slices),
//     GetComputeInstances, GetComputeInstanceById, Destroy (ERROR_IN_USE while a compute
//     instance lives); compute instances: GetInfo, Destroy. A destroyed handle answers
//     ERROR_INVALID_ARGUMENT.
//   - MIG devices, one per compute instance: GetMaxMigDeviceCount (0 while MIG mode is off),
//     GetMigDeviceHandleByIndex (by GPU-instance id then compute-instance id, ERROR_NOT_FOUND
//     past the end), and on the handle GetUUID ("MIG-" and a UUID drawn at creation),
//     GetName, GetGpuInstanceId, GetComputeInstanceId, GetDeviceHandleFromMigDeviceHandle,
//     IsMigDeviceHandle, GetMemoryInfo (the profile's memory), GetAttributes.
//     DeviceGetHandleByUUID also finds MIG devices by their UUID, and the library forms
//     (DeviceGetMigMode(dev), GpuInstanceDestroy(gi), …) call the handles'.
//
// [Node.MIGInstances] lists a GPU's live instances and [Node.MIGOverlaps] checks that no two
// overlap, for tests and a program's debug endpoint. The MIG calls are safe for concurrent
// use (a device plugin makes them from gRPC goroutines).
//
// # Usage queries
//
// [Wire] answers the queries of a node monitor (nvmlscan's Scanner.Usage, HAMi's host series)
// from values a program or test sets, per GPU, at any time:
//
//   - GetMemoryInfo: Total the preset's memory ([Node.SetMemoryTotal] changes it; so does the
//     server device's MemoryInfo.Total before anything queries the GPU), Used the sum of the
//     processes' UsedGpuMemory (0 on an idle GPU) until [Node.SetMemoryUsed] fixes it, Free
//     the rest.
//   - GetUtilizationRates: 0 % until [Node.SetUtilization]; ERROR_NOT_SUPPORTED while the GPU
//     is in MIG mode, as NVML answers on a MIG-enabled GPU.
//   - GetComputeRunningProcesses: none until [Node.SetProcesses] (host PIDs, bytes).
//   - GetName: the preset's name until [Node.SetName] ("NVIDIA GB10", "Tesla T4").
//   - [Node.SetReturn] makes any of these queries, or GetUUID, answer an NVML error code (and
//     zero values) until it is set back to nvml.SUCCESS: the three cases of HAMi's
//     nvml_partial_errors vector are memory ERROR_NOT_SUPPORTED (unified memory), memory
//     ERROR_UNKNOWN and utilisation ERROR_NOT_SUPPORTED.
//
// A test that needs fewer GPUs, or other UUIDs, trims the server's Devices and sets a device's
// UUID field before calling [Wire]. Setting values ([Example_usage]):
//
//	node.SetUtilization(0, 87, 41)                                                // GPU 0: 87 % busy, memory controller 41 %
//	node.SetProcesses(0, []nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 3 << 30}}) // memory used follows: 3 GiB
//	node.SetMemoryUsed(1, 10<<30)                                                 // GPU 1: 10 GiB used, whatever its processes
//	if err := node.SetReturn(2, nvmlsim.QueryMemoryInfo, nvml.ERROR_NOT_SUPPORTED); err != nil {
//		return err // errors.Is(err, nvmlsim.ErrUnknownQuery)
//	}
//
// # Usage
//
// A program's --simulate flag, as examples/deviceplugin has it (see [Example]):
//
//	node, err := nvmlsim.New("dgxh100") // nvmlsim.Servers() lists the names
//	if err != nil {
//		return err // errors.Is(err, nvmlsim.ErrUnknownServer)
//	}
//	scanner, err := nvmlscan.New(node.Server, nvmlscan.Options{Sysfs: node.Sysfs})
//	if err != nil {
//		return err
//	}
//	node.XID(0, 79) // GPU 0 reports XID 79 to a running Scanner.Run
//
// A MIG node ([Example_mig]):
//
//	node, err := nvmlsim.New("dgxa100")
//	if err != nil {
//		return err
//	}
//	node.EnableMIG()
//	gpu := node.Device(0)
//	info, _ := gpu.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_2_SLICE) // info.Id 14
//	gi, ret := gpu.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 2, Size: 2})
//	if ret != nvml.SUCCESS {
//		return ret
//	}
//	// A 1g.5gb at slice 3 would overlap: ERROR_INSUFFICIENT_RESOURCES.
//	ciInfo, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
//	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
//		return ret
//	}
//	migDevice, _ := gpu.GetMigDeviceHandleByIndex(0)
//	uuid, _ := migDevice.GetUUID() // "MIG-…"
package nvmlsim
