// Package allocation is the pod side of HAMi's protocol, as pure functions: the pod annotations
// the scheduler writes and the device plugin consumes, what a pod asks for, what the pods on a
// node already hold, HAMi's NVIDIA fit and policies, and the vendor-neutral shape of what the
// device plugin answers for a container ([Response]: environment, [Mount]s, [DeviceNode]s, CDI
// devices, annotations). It imports no client; the scheduler extender and the node agent put
// it together with the API server and the node lock (package nodelock).
//
// Other vendors: [ConfigFor] gives the Config of any vendor HAMi does not know (one built with
// annotation.NewVendor) — the generic fit, HAMi's count, memory, cores, health, cordon and
// exclusive-use rules on that vendor's resources, with NVIDIA's specifics (selectors, modes,
// MIG, NUMA binding, topology) left out — and refuses, with [ErrVendorRules], the vendors HAMi
// fits with rules of its own. [Requests] and [Fit] then read and place that vendor's devices.
//
// What a container receives is each vendor's own answer. For NVIDIA, HAMi-core's container
// edits (NVIDIA_VISIBLE_DEVICES, the CUDA_DEVICE_* limits, libvgpu.so and its mounts, the
// answers for MIG devices and DRA claims) are package [github.com/hamireg/hamireg/hamicore];
// a vendor that fills a [Response] itself never needs it.
//
// The protocol in short: at filter the scheduler picks a node and GPUs and writes
// [KeyNode], [KeyTime] and the vendor's device lists (for NVIDIA
// hami.io/vgpu-devices-to-allocate and hami.io/vgpu-devices-allocated, the keys of
// [annotation.Vendor]) with one entry per container, encoded by [EncodePodDevices]; at bind it
// takes the node lock and sets [KeyBindPhase] to [PhaseAllocating]. The kubelet then calls the
// device plugin's Allocate once per container: the plugin decodes the to-allocate list
// ([DecodePodDevices]), serves the next entry ([PodDevices.Next], [ContainerAt]) with its
// vendor's container edits (a [Response]), writes the list back without it
// ([PodDevices.Consume]) and, after the last one, sets [PhaseSuccess] and releases the lock.
//
// Scheduler side:
//
//	req := allocation.Requests(pod, allocation.Config{}) // chart resource names and defaults
//	if !req.Any() {
//		return // not a HAMi pod: every candidate node passes
//	}
//	d := allocation.Schedule(nodes, req, pod.Annotations, allocation.Config{})
//	// d.Node, and EncodePodDevices(d.Devices) for both device annotations; d.Failed[node] says
//	// why the others do not fit ("1/2 CardInsufficientMemory, 1/2 CardNotHealth").
//
// where each [Node] pairs the node's registered devices with what the pods on it hold:
// [PodNode] says which node a pod counts against, [Allocated] what it holds there, and
// [PodDevices.Usage] and [WithUsage] add it up.
//
// Device plugin side:
//
//	pd, err := allocation.DecodePodDevices(pod.Annotations[vendor.ToAllocateKey], allocation.VersionMaster)
//	if err != nil {
//		return err
//	}
//	i, ok := pd.Next()                           // the container served now
//	ctr, found := allocation.ContainerAt(pod, i) // init containers first
//	if !ok || !found {
//		return fmt.Errorf("no container %d to allocate", i)
//	}
//	resp, err := edits(pd[i], ctr) // the vendor's answer, an allocation.Response
//	if err != nil {
//		return err
//	}
//	next := allocation.EncodePodDevices(pd.Consume(i)) // merge-patch it back
//
// Where HAMi v2.9.0 and master differ, [Version] chooses; master is the default. Conformance
// tests replay the vectors HAMi's own functions produced (poddevices.json and fit.json, both
// versions; the container responses of allocate.json are hamicore's).
//
// Deliberate differences from HAMi, each asserted in a test, only where HAMi loses data or is
// random:
//
//   - The empty piece after the last ';' of a device list is not an entry, so decoding and
//     encoding give the same value and consuming an entry never lengthens it (HAMi appends one
//     empty entry per round trip: "a:;b:;" becomes ";b:;;" and then ";;;;").
//   - A device with fewer than four fields is [ErrMalformed] with [VersionV290] too (v2.9.0
//     returns no devices and no error; every caller ends up with no devices either way).
//   - A container without a GPU always keeps its empty entry. HAMi master drops it when the
//     GPU model is not the word NVIDIA, and its device plugin then serves container 0 with the
//     devices of container 1.
//   - Fit reasons list their parts sorted (HAMi: random map order); GPUs are sorted stably
//     (HAMi's sort is not stable beyond 12 GPUs); equal node scores go to the node whose name
//     sorts first (HAMi: whichever goroutine finished last); a total of 0 slots, cores or
//     memory adds 0 to a score (HAMi divides by it).
//   - topology-aware (HAMi v2.9.0): when no combination of candidates scores above 0 (no
//     score annotation, unknown UUIDs, "[]"), v2.9.0 reports a fit with no GPUs, so the pod
//     gets an empty entry and fails at Allocate ("device request not found"); here the first
//     best combination in walk order is taken whatever its score, as HAMi master does (without
//     scores: the first GPUs of the walk).
//   - A GPU count or memory beyond int32 saturates (HAMi wraps it around, so 2^32+1 GPUs ask
//     for one); usage sums are 64-bit.
//   - Scoring weights ([KeyDeviceScoringWeights], HAMi v2.10.0; [ParseScoringWeights] with
//     HAMi's errors) order a node's GPUs bit for bit as HAMi, but never make a pod unfit where
//     it fits without them: HAMi fits containers greedily, and a weighted order can send the
//     first container to the GPU a later one needed; [Fit] then tries the default order.
//
// [Unresolvable] says which fit reasons removing pods cannot cure (the extender answers those
// nodes in FailedAndUnresolvableNodes, where kube-scheduler does not preempt); the rule goes by
// the reason's words and errs only towards resolvable.
//
// ResourceQuota: [FitWith] and [ScheduleWith] with [FitOptions].Quota check each candidate
// GPU against the namespace's limits as HAMi's fitQuota does ([ReasonResourceQuotaNotFit],
// counted per GPU); [QuotaLimitsFrom] reads the limits from the namespace's ResourceQuota
// objects, [QuotaUsage] what a pod's devices hold against them, [AdmissionQuotaAsk] what HAMi's
// webhook counts. Where HAMi is wrong, the rules differ, each asserted in a test: several
// objects of a namespace combine as the tightest limit (HAMi: the one delivered last, and
// deleting either removes the limit); a fractional limit limits to its integer part, as
// Kubernetes compares quota (HAMi ignores it); keys that name a GPU resource in a form HAMi
// ignores, and suffixed memory limits, come back as classified [QuotaError]s.
//
// MIG (HAMi master, v2.10): on a GPU in [ModeMIG] [Fit] chooses a profile and a placement
// of the GPU's published migProfiles as HAMi's scheduler does (mig.Select: profiles by memory
// then slice count, the first with a free placement, "1g" and "3g" from the top), after
// HAMi's checks in HAMi's order (slots, then memory); the device entry gets the profile's
// memory and cores (what HAMi's AddResourceUsage writes) and its [MIGSlot]; a failure counts
// [ReasonCardMigTopologyInfeasible]. A request that asks for more devices than the node has
// GPUs may still fit there (HAMi's isMIGRequest: the node has a MIG GPU and the pod's
// nvidia.com/vgpu-mode allows mig), and after a device on a MIG GPU the same GPU is tried
// again for the next, so several devices of one container stack on one GPU.
// [MIGAllocations] is the hami.io/vgpu-mig-allocations the scheduler writes next to the
// device lists, [WithMIG] reads it back onto a pod's devices, and [PodDevices.MIGUsage] and
// [SetMIGUsage] carry the placements pods hold into the fit. The deliberate differences,
// each a rule asserted by TestFitMIGRules and TestConformanceMIGFit:
//
//   - a. Cores: HAMi rounds profile cores up (A100: 15, 29, 43, 100) and checks the GPU's
//     100 % against their sum, so three 2g.10gb and one 1g.5gb (102) refuse even a request
//     of 0 cores, and six 1g.5gb (90) a request of 20 with a 1g placement free. Here the
//     placement decides: on a MIG GPU the GPU-level core checks are replaced by "the chosen
//     profile has at least the requested cores" (mig.Select's cores), the memory check is
//     kept. The annotations keep HAMi's per-device memory and cores, so HAMi reads the same
//     usage; a full GPU is refused by both (here CardMigTopologyInfeasible, in HAMi
//     CardInsufficientCore or CardTimeSlicingExhausted).
//   - b. No informer race: the devices a scheduler chose carry their slots, so a pod assumed
//     before its annotations arrive occupies its placements at once (HAMi marks the GPU
//     unhealthy: CardNotHealth with six placements free).
//   - c. A device on a MIG GPU whose placement is unknown (its pod's reservation does not
//     decode or does not match its device list, or it has none) occupies every placement of
//     that GPU: a GPU with more device entries ([Usage].Used) than known placements
//     ([DeviceUsage].MIG) takes nothing more. It is not made unhealthy (HAMi: CardNotHealth
//     for every pod). The usage tracker reports such pods (usage.Options.DecodeFailed).
//   - d. A reservation naming a GPU that is not in MIG mode is ignored there (the device
//     entry counts as usual) and the GPU stays healthy (HAMi marks it unhealthy).
//   - e. A whole-GPU request (100 % of devmem, more than the largest profile's memory) is
//     refused with CardMigTopologyInfeasible, as HAMi does.
//
// With [VersionV290] MIG GPUs are not fitted: HAMi v2.9.0's knownMigGeometries model (whole-GPU
// geometries from the scheduler's config, the "[template-position]" UUID suffix) is read but
// not reproduced, so a v2.9.0 MIG GPU is refused with CardNotFoundCustomFilterRule (what
// v2.9.0 itself says when no geometry fits). Its pods' suffixed entries count as usage of the
// physical GPU ([ContainerDevice.GPU]), whatever the position (v2.9.0 panics on one out of
// range).
//
// Everything here is a pure function of its arguments, safe for concurrent use.
package allocation
