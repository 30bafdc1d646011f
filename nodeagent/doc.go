// Package nodeagent is the engine of a HAMi-compatible device plugin: one device [Source]
// feeds both node channels of HAMi's registration, and the kubelet's Allocate is served with
// HAMi's pod protocol, so that the node works under HAMi's own scheduler and under this SDK's
// extender alike.
//
//   - Channel 1, the device count: a device plugin (package kubeletplugin) registers the
//     vendor's resource (nvidia.com/gpu) with the kubelet, each GPU as Count virtual devices
//     with its health.
//   - Channel 2, the device specification: the register annotation (package register,
//     hami.io/node-nvidia-register) on the Node.
//   - Allocate: the pod the scheduler bound is found through the node lock
//     (hami.io/mutex.lock), its next container entry of hami.io/vgpu-devices-to-allocate is
//     served and consumed, and after the last one the pod gets hami.io/bind-phase: success and
//     the lock is released. What the container receives (env, mounts, device nodes, CDI
//     devices) is an [Allocator]'s answer: HAMi-core's for NVIDIA by default, the vendor's
//     own otherwise.
//
// # Lifecycle
//
// [New] validates everything and starts nothing. [Agent.Run] scans the source at once, every
// Options.Period (30 s) and whenever the source's Changed channel closes, and hands each scan
// to both channels (a GPU turning unhealthy or healthy again reaches the annotation and the
// kubelet within a scan's time); it publishes the annotation first and registers with the
// kubelet only once the Node carries it, so a scheduler never sees a device count without the
// devices behind it. A device that could not be read is logged and recorded as a Warning
// Event on the Node; the others still register. A scan that fails as a whole keeps what was
// published and is retried after 1 s, doubling up to the period. If the source is a [Runner]
// (nvmlscan's XID health watch), Run runs it too. Run returns nil when its context ends, or
// the error of a part that cannot go on (the kubelet socket missing, the registration
// rejected), always after every goroutine it started has returned.
//
// # What the agent refuses
//
// [New] refuses, with an error wrapping [ErrInvalidOptions] that names the fix, what it
// cannot do instead of answering wrongly later:
//
//   - a vendor other than NVIDIA without an [Allocator] (neither Options.Allocator nor a
//     Source that implements it): HAMi-core's answer is NVIDIA's, and an NPU container would
//     get NVIDIA_VISIBLE_DEVICES, CUDA limits and the libvgpu.so mounts. The error names the
//     method set looked for, Allocate(context.Context, nodeagent.ContainerRequest)
//     (allocation.Response, error), the source's type, and, when only the pointer type has
//     the method (a pointer receiver on a source passed by value), says to pass &T instead of T;
//   - Options.MIG, Options.DRA and Options.TopologyScores for a vendor other than NVIDIA.
//
// # The node's pods
//
// With Options.MIG or Options.DRA, Run runs one informer of the pods bound to the node (field
// selector spec.nodeName: one LIST and one WATCH per node, whatever the MIG period and the
// claim rate; API load no longer grows with the node count times the reads) and waits for
// its first LIST before it registers with the kubelet, releases MIG devices or runs the DRA
// world, so that neither reads an unsynced cache (a read before it is [ErrPodsNotSynced]).
// MIG's release and DRA's ownership check at Prepare read the cache; no API request sits
// under the Allocate lock. BenchmarkAPIRequests measures a node-hour with MIG and DRA on: 0
// requests in steady state and 5 at start-up (the Node's and the pods' LIST and WATCH, the
// first write) against 732 for a LIST per MIG release (every 5 s) and per Prepare (12 an
// hour); an API server's watch timeouts add a re-WATCH every 5 to 10 minutes per informer.
// Without MIG and DRA the agent lists and watches no pods.
//
// With Options.TopologyScores (HAMi's ENABLE_TOPOLOGY_SCORE=true) a [TopologySource] also
// scores each scan's GPU pairs, and the topology score annotation hami.io/node-nvidia-score
// goes in the same merge patch as the register annotation. Unlike HAMi's plugin, which writes
// neither annotation when an NVML topology query fails, a failed scoring is recorded as an Event
// and the devices are still published.
//
// Options.Kubelet.NUMATopology (HAMi v2.10.0's enableNumaTopology, default off) sends each
// GPU's NUMA node with its virtual devices to the kubelet's Topology Manager; a device whose
// Numa is negative (unknown) gets none and is registered with 0, HAMi's value. With
// Options.NodeCapacity the agent also keeps the healthy devices' memory and cores
// ([NodeCapacityOf]) in the Node's status capacity and allocatable under the vendor's memory
// and core resource names, patched only when they change.
//
// # Allocate
//
// The kubelet calls Allocate once per container that asks for the resource. The agent, one
// call at a time:
//
//  1. Reads the node lock, which names the pod (no LIST of pods): from the register writer's
//     watch of the Node, and from a GET of the Node when the pod named there is not the one to
//     serve (the watch may lag the bind). No lock, or a legacy lock without a pod:
//     [ErrNoBindingPod] ("no binding pod found on node ..."). There is no lock-less
//     fallback, so one pod's devices are never handed to another (HAMi #781, #3076).
//  2. GETs that pod and checks that it is bound to this node and has bind-phase allocating. A
//     pod that is not bound here yet is left alone (its scheduler may be mid-bind); a deleted
//     pod ([ErrPodGone]) or one past allocation has its stale lock released.
//  3. Decodes the pod's to-allocate list, takes the next container entry (init containers
//     first; containers without devices keep empty entries and are skipped) and checks that
//     it holds as many devices as the kubelet asked for ([ErrDeviceCountMismatch]).
//  4. Answers with what the [Allocator] gives the container for the entry's devices: by
//     default [HAMiCore], HAMi-core's environment and mounts (package allocation:
//     NVIDIA_VISIBLE_DEVICES, CUDA_DEVICE_MEMORY_LIMIT_<i>, CUDA_DEVICE_SM_LIMIT, the
//     libvgpu.so and ld.so.preload mounts, ...); a vendor's own device nodes, CDI devices,
//     environment and annotations otherwise. Then it merge-patches the list back without the
//     entry.
//  5. After the last entry: bind-phase success (in the same patch), then the lock released.
//
// A pod is served with a GET of it and a patch per container (GetPreferredAllocation adds a
// GET), and the lock's GET and patch at the end: well within client-go's rate limits.
//
// Every failure once the pod is known sets bind-phase failed, releases the lock, records a
// Warning Event on the pod and returns an [*AllocateError] whose text tells the operator what
// happened and what to do; the kubelet then rejects the pod (UnexpectedAdmissionError).
// Requests are retried through transient API errors for a few seconds; when the API server
// stays away, the agent finishes the protocol (failed or success, and the lock released) as
// soon as it is back, so no lock is left behind until its timeout.
//
// GetPreferredAllocation answers, for the container being admitted, replica ids of the GPUs
// the scheduler chose, so the kubelet's accounting matches HAMi's; Allocate serves the
// scheduler's GPUs either way.
//
// # The Allocator: what the container receives
//
// The protocol is the agent's; what a container receives for its devices is the vendor's: an
// [Allocator] gets a [ContainerRequest] (the pod, the container, its devices from the
// scheduler's entry, the node's devices as last scanned and the kubelet's replica IDs) and
// returns an allocation.Response ("devices in, container edits out"): environment variables,
// mounts, device nodes (DeviceSpec, permissions "rw" unless set), fully qualified CDI device
// names and container annotations, all of which the agent hands to the kubelet. Which
// Allocator: Options.Allocator; else the [Source], when it implements Allocator; else
// [HAMiCore], HAMi-core's environment and mounts for NVIDIA (NVIDIA_VISIBLE_DEVICES,
// CUDA_DEVICE_MEMORY_LIMIT_<i>, CUDA_DEVICE_SM_LIMIT, the libvgpu.so and ld.so.preload
// mounts, ...; with HAMiCore.PrepareStateDir the container's state folder on the host; for
// the MIG devices of a GPU in MIG mode only NVIDIA_VISIBLE_DEVICES with their MIG UUIDs, as
// HAMi's plugin in mig mode, see MIG below). An
// Allocator's error, or an answer the kubelet cannot use, fails the pod as every failure
// above does, as [ErrAllocator] ([ErrHost] for HAMi-core's state folder); see
// [ExampleAllocator] for a vendor's device nodes and env.
//
// A vendor whose Vendor.ToAllocateKey is "" (HAMi's scheduler writes no pod device list for
// it: Vastai, biren, AMDGPU) is served without the pod protocol: no lock is read, no pod
// written, GetPreferredAllocation is not advertised; the kubelet's replica IDs are mapped to
// the node's devices (kubeletplugin.ParseVirtualDeviceID) and the Allocator is called with
// them as Devices (Usedmem and Usedcores 0) and without a pod or container. An ID that names
// no device of the node is [ErrMalformed].
//
// # MIG
//
// A container whose devices are on GPUs in MIG mode (the scanned devices' Mode "mig", as
// nvmlscan registers a MIG-enabled GPU) is served as HAMi master (v2.10) serves it, through
// Options.MIG, a [MIGInstances] (nvmlscan's MIG manager on a node):
//
//  1. The pod's hami.io/vgpu-mig-allocations (written by the scheduler, package mig) is
//     decoded with HAMi's rules ([ErrMalformed]). The container's reservations are those
//     whose containerIndex is the entry's index, in deviceIndex order; there must be one per
//     device of the entry, on the entry device's GPU ([ErrMIG]; HAMi's words "container <name>
//     has <n> MIG reservations, requested <m> devices").
//  2. Each reservation is realised through the manager at exactly its placement (the manager
//     checks the placement is one NVML lists for the profile, and creates the GPU instance and
//     its compute instance). A reservation already realised (its runtime identity recorded and
//     a MIG device with that identity present: a retried Allocate, an agent restarted) is
//     reused. A MIG device overlapping the placement that no live reservation owns is
//     destroyed first; one that another live pod's reservation owns fails the pod
//     ([ErrPlacementTaken]).
//  3. The [Allocator] is called with the MIG devices (ContainerRequest.MIG): [HAMiCore]
//     answers NVIDIA_VISIBLE_DEVICES=<MIG UUIDs> (or the volume-mounts entries), and nothing
//     of HAMi-core (hamicore.MIGResponse).
//  4. The runtime identity (migUUID, gpuInstanceID, computeInstanceID) is merge-patched into
//     hami.io/vgpu-mig-allocations with the pod's metadata.resourceVersion as precondition,
//     HAMi's patch byte for byte; on a 409 the pod is read again and the identity applied to
//     the fresh value.
//  5. Then the entry, bind-phase and lock as for every container.
//
// Every failure follows the protocol above (bind-phase failed, lock released, an Event naming
// the cause: NVML's error, the placement taken, ...), and the MIG devices created by the
// failed call are destroyed again.
//
// Release. The agent owns every MIG device on the GPUs it registers in MIG mode (but those its
// DRA world owns, see DRA below), as HAMi's
// start-up reset of idle GPUs assumes: at start and every Options.MIGReconcilePeriod (5 s,
// HAMi's), under the Allocate lock, it reads the node's pods from its pod informer (see "The
// node's pods"; a MIG device the agent created in the last 30 s for a pod the informer has
// not seen yet counts as that pod's) and destroys each MIG device on those GPUs that no reservation of a pod that is not
// finished (phase Succeeded or Failed) owns. A reservation owns a MIG device of its GPU with
// the runtime identity it records, or, while it has none (its pod is being allocated, or an
// agent stopped between creating and recording), the device at exactly its placement. After
// a restart, the devices live reservations record are adopted this way: kept, and reused by a
// retried Allocate. While a live pod's reservation annotation does not decode, nothing is
// released (what it owns is unknown); the error is logged each round.
//
// Where the SDK differs from HAMi master on purpose (mig_conformance_test.go checks each by
// its rule on HAMi's vectors):
//
//   - Instances are keyed by reservation (pod, container, device), not by (GPU, profile,
//     placement): a new pod reserved the placement of a finished pod's MIG device gets a fresh
//     device, never the finished pod's (HAMi hands it over, with whatever it left in GPU
//     memory); a device made by hand at a reserved placement is destroyed, where HAMi fails
//     the pod with ERROR_INSUFFICIENT_RESOURCES until someone removes it.
//   - A live pod's reservation naming a GPU the node does not have (a replaced GPU) is
//     skipped with a log line; HAMi fails every MIG Allocate of the node.
//   - With deviceIDStrategy index the container gets the MIG UUIDs; HAMi's answer is an empty
//     NVIDIA_VISIBLE_DEVICES.
//   - The release needs no start-up all-or-nothing: HAMi resets and adopts nothing at all
//     when one GPU's NVML name matches no allowlist model.
//   - HAMi v2.9.0's MIG (nvidia-mig-parted geometries, "[template-position]" UUID suffixes;
//     Options.Version VersionV290) is not served: a container whose entry is on a GPU in MIG
//     mode or carries the suffix fails with [ErrMIG], naming the fix (HAMi master's dynamic
//     MIG). HAMi v2.9.0 hands out the MIG device at the template position without checking
//     its profile, answers an empty device list or the whole GPU without limits, and panics
//     on an unknown GPU; re-partitioning GPUs with mig-parted is out of this SDK's scope.
//
// A REV profile name (1g.10gb on an A100-40GB) reaches the manager as the published name;
// what it realises is the profile the node published under that name.
//
// # DRA
//
// With Options.DRA the agent also serves a DRA world ([DRA]): a DRA driver that publishes one
// ResourceSlice pool named after the node and prepares claims as CDI specs with HAMi-core's
// limits. Each physical GPU has exactly one owner: the DRA world (claims, kube-scheduler's
// structured allocator) or the device-plugin world (HAMi's scheduler or this SDK's extender,
// pod annotations, Allocate). The world says which GPUs it owns ([Agent.OwnedByDRA]), in MIG
// mode or not. A DRA-owned GPU in MIG mode is published by the world as MIG placements
// (partitionable devices), whose instances the world creates at Prepare with the agent's own
// MIG realiser, lent through [DRAHost].MIG and called under the Allocate lock; the agent's
// MIG release leaves such a GPU's instances alone (they belong to claims).
//
// A program opts into DRA by importing package github.com/hamireg/hamireg/nodeagent/nodedra
// (nodedra.New: the DRA kubelet plugin of package draplugin, ownership by UUID or NVML index)
// and passing its World as Options.DRA. nodeagent itself imports no DRA package, so a node
// program without DRA does not link k8s.io/dynamic-resource-allocation, nor etcd's file
// utilities and zap, which its kubelet plugin helper brings: stripped (go build
// -ldflags='-s -w'), examples/acmeplugin went from 52.3 MB to 50.3 MB when DRA moved out.
//
// Every scan feeds three outputs at once, so that a GPU turning unhealthy reaches all three
// within the same scan:
//
//   - The register annotation lists every GPU, as HAMi's scheduler must know them all. The
//     DRA-owned GPUs are cordoned for HAMi master's extender in hami.io/device-cordon (in the
//     same merge patch; register.Writer.SetCordon keeps an operator's own entries and records
//     the agent's in hamireg.io/agent-device-cordon), and, for Options.Version VersionV290,
//     whose extender has no cordon, published with health false.
//   - The kubelet's device count (nvidia.com/gpu) offers only the device-plugin-owned GPUs.
//   - The DRA world gets every scanned GPU ([DRA].SetDevices), with its PCI bus ID when the
//     source is a [PCISource] (nvmlscan's Scanner); nodedra publishes a device-plugin-owned
//     GPU with the NoSchedule taint <driver>/owned-by-hami (one in MIG mode not at all), an
//     unhealthy one with <driver>/unhealthy. An unchanged scan writes no slice.
//
// So HAMi's scheduler sees the DRA GPUs but gives them no pod, and a claim never gets a
// device-plugin GPU unless it tolerates the taint. At the node, the last line of defence:
// Allocate refuses a GPU that is DRA-owned or holds a prepared claim, and Prepare refuses a
// GPU that is not DRA-owned or that a live pod on the node holds through
// hami.io/vgpu-devices-allocated ([DRAHost].HeldByHAMi, from the agent's pod informer: no API
// request per Prepare); both errors wrap [ErrOwnership] and name the GPU, the pod or claims,
// and the fix. Errors of the world (SetDevices, the slice, the kubelet registration) are
// recorded as the Warning Event [EventReasonDRAPublishFailed] on the Node, once per distinct
// message. The world runs beside the other parts of [Agent.Run], once the pod informer
// synced; it needs nodedra.ClusterRoleRules besides [ClusterRoleRules].
//
// Extended-resource mapping (KEP-5004): where a DeviceClass names the vendor's count resource
// in spec.extendedResourceName (dra.DeviceClassWith), kube-scheduler serves a pod asking it
// through DRA on every node whose allocatable of it is 0 or absent, and through the device
// plugin elsewhere: a node is one or the other for the name. Since the agent hands the
// kubelet only the GPUs the DRA world does not own, a node whose GPUs are all DRA's counts 0
// and is a DRA node; one GPU left to the device plugin (or in MIG mode) makes it a
// device-plugin node, whose DRA GPUs then serve explicit ResourceClaims only. The agent logs
// the node's [MappingMode] when it changes ([Agent.MappingMode], [MappingModeOf]); note that a
// node whose device-plugin GPUs all turn unhealthy counts 0 and becomes a DRA node for the
// name while they are.
//
// # Concurrency
//
// One Run at a time per Agent ([ErrAlreadyRunning]). Allocate calls are serialised. Stats and
// the accessors are safe at any time.
//
// # Metrics
//
// With Options.Registerer the agent registers, labelled with the vendor:
// hamireg_nodeagent_allocations_total (containers served), allocate_errors_total by kind
// (no_binding_pod, pod_gone, no_pending_entry, device_count_mismatch, malformed, api, host,
// allocator, mig, ownership: the Allocate classes), scans_total by result, device_failures_total and
// annotation_decode_failures_total; and, unless Options.Register.Registerer is set, the register
// writer's hamireg_register_* (writes, heals, no-ops, failures). Labels are bounded: no pod,
// node or device.
//
// # Probes
//
// [Agent.Healthy] (liveness) and [Agent.Ready] (readiness) answer a program's /healthz and
// /readyz ([ProbeHandler]; examples/deviceplugin serves them beside /metrics on
// --metrics-bind-address, :9394). Both read what Run tracks, send no request and return nil or
// an error of class [ErrUnhealthy] or [ErrNotReady] naming what is wrong:
//
//   - Healthy: Run is running ([ErrNotRunning] before and after, with Run's error), no part has
//     failed, no scan of the source has hung, and scans have not kept failing, for longer than
//     [UnhealthyScanPeriods] periods (90 s by default). A restart is the fix for each of these;
//     a kubelet or API server that does not answer is not the process's fault, and does not
//     make it unhealthy.
//   - Ready: during this Run a scan succeeded, the register annotation carried it, the pod
//     informer synced (with MIG or DRA) and the kubelet received the device list. Once ready,
//     the agent stays ready until Run returns.
//
// # Logs, Events, RBAC
//
// Logging is contextual (klog.FromContext); the parts keep HAMi's log lines ("Updating node
// annotations with N device(s)", "Device info unchanged, skipping annotation update").
// Events go to Options.EventRecorder, by default to the API through a broadcaster of Run's
// own. The ServiceAccount needs [ClusterRoleRules]: list, watch, get and patch nodes, get,
// list and watch (the pod informer of MIG and DRA) and patch pods, create and patch events;
// with DRA also nodedra.ClusterRoleRules; with Options.NodeCapacity also patch nodes/status
// ([ClusterRoleRulesFor], [NodeCapacityRules]).
//
// # Usage
//
// A node program is a source, a client and the agent (the snippet is [ExampleNew]; see
// examples/deviceplugin for the whole NVIDIA program, and examples/acmeplugin for a vendor
// that is not NVIDIA: its own Source and Allocator, and Options.Vendor; [ExampleAllocator]
// in short):
//
//	scanner, err := nvmlscan.New(nvml.New(), nvmlscan.Options{SplitCount: 10})
//	if err != nil {
//		return err
//	}
//	defer scanner.Close()
//	agent, err := nodeagent.New(clientset, nodeName, scanner, nodeagent.Options{})
//	if err != nil {
//		return err
//	}
//	return agent.Run(ctx)
package nodeagent
