// Package draplugin is the DRA kubelet plugin of a node agent: it registers with the
// kubelet's DRA manager, publishes the node's GPUs as a ResourceSlice pool (package dra's
// mapping) and prepares claims with HAMi-core's limits as transient CDI specs.
//
// It stands on k8s.io/dynamic-resource-allocation: [Plugin.Run] starts the helper
// (kubeletplugin.Start: the registrar socket <RegistrarDir>/<driver>-reg.sock and
// <PluginDir>/dra.sock, gRPC calls serialised, the DRAResourceHealth service on unless
// Options.DisableHealthService) and a resourceslice controller that owns one pool named
// after the node, with the slices it is given, owned by the Node object.
//
// # Publishing
//
// [Plugin.SetDevices] hands the plugin the scanned GPUs and their DRA devices (dra.Devices
// of the same scan), before or during Run; the controller diffs them against the stored
// slice and writes only a change, after Options.SliceSyncDelay. The kubelet's DRA manager
// deletes the node's slices when it starts: the controller watches them and creates the
// slice again.
//
// # Device health
//
// The health of a device has one source: the scan handed to SetDevices. A GPU the scan marks
// unhealthy (the XID watch, or a GPU that stops answering) gets the slice's NoSchedule taint
// <driver>/unhealthy, so new claims avoid it, and the same SetDevices reports it Unhealthy to
// the kubelet through [Plugin.WatchHealthStatus] (KEP-4680, the kubelet's
// ResourceHealthStatus gate, beta and on since 1.36): every stream gets the state of every
// published device at once, each change at once, and the full state again every third of
// Options.HealthCheckTimeout (the kubelet reads a device not re-reported within it as
// Unknown, and clears the driver's health when the stream ends). The kubelet writes it into
// the status of each pod whose prepared claim holds the device:
// status.containerStatuses[].allocatedResourcesStatus[] with name "claim:<pod claim
// name>" (or "claim:<name>/<request>"), one resource per device with resourceID the claim's
// CDI device ID k8s.hamireg.io/claim=<claim UID>-<device name>, health Healthy or Unhealthy
// and, where the kubelet's ResourceHealthStatusMessage gate is on, the plugin's message
// naming the GPU. Options.DisableHealthService turns the service off for a kubelet that
// must not be offered it; health is then the taint alone.
//
// # Prepare and Unprepare
//
// For each claim the kubelet prepares, the plugin reads the allocation results of its driver
// (dra.ConsumedFromResult: the GPU and the consumed memory and cores), refuses devices that
// are not published, unhealthy, beyond their capacity with the claims prepared already, or
// refused by Options.Refuse (the node agent's ownership check), and writes the claim's
// transient CDI spec <CDIDir>/k8s.hamireg.io-claim_<claim UID>.json: kind
// k8s.hamireg.io/claim, the claim's HAMi-core edits (hamicore.ClaimResponse) at spec level
// and one device <claim UID>-<device name> per result. The kubelet passes the CDI device IDs
// to the container runtime, which applies the edits. The claim's HAMi-core state folder
// <HookPath>/vgpu/claims/<claim UID> is created (mode 0777) only with
// Options.PrepareStateDir; otherwise the plugin writes nothing on the host but the CDI specs
// and its checkpoint. CUDA_DISABLE_CONTROL cannot be honoured: the claim does not carry the
// container's environment, so /etc/ld.so.preload is always mounted.
//
// What was prepared is recorded in <PluginDir>/checkpoint.json (written atomically), because
// Unprepare gets only the claim's UID and the plugin may have restarted in between: [New]
// reads it. Both calls are idempotent: a prepared claim gets the same answer again without a
// rewrite, and unpreparing a claim that is not prepared succeeds.
//
// # Robustness
//
// Prepare writes the claim's CDI spec first, carrying the whole record of what was prepared
// in its annotation [CDIRecordAnnotation], then the state folder, then the checkpoint;
// Unprepare removes them in the same order. Prepare, Unprepare, the cleanup and every
// checkpoint write hold an exclusive flock on <PluginDir>/[LockFile], so two plugin
// processes on one folder (a rolling update) never interleave, and each reads the checkpoint
// again when the other rewrote it.
//
// The checkpoint (version 2) carries the SHA-256 of its content; version 1 files are still
// read. A corrupted one ([ErrCheckpointCorrupt]: not JSON, truncated, a bad checksum) is moved
// aside to checkpoint.json.corrupt-<UTC time> and rebuilt from the records in the CDI specs;
// Run reports what was done through [Plugin.HandleError] (so Options.OnError) and counts it in
// Stats.CheckpointRecoveries. A checkpoint of another driver or of a newer format fails New
// with [ErrCheckpoint].
//
// [Plugin.Cleanup], which Run calls at its start and every Options.StaleClaimPeriod, GETs each
// prepared claim and unprepares it locally when the API server no longer allocates it to
// this node (deleted, another UID, deallocated, allocated elsewhere): a missed Unprepare does
// not hold a GPU forever. A claim still allocated here is never unprepared, and an API error
// keeps the claim until the next round. CDI specs of this driver without a checkpoint entry
// (a process killed between the spec and the checkpoint) are adopted when their claim is
// allocated here and reserved, and removed otherwise.
//
// # MIG devices
//
// [Plugin.SetSlices] publishes the slices of dra.Slices: besides the GPU devices, the MIG
// placements of the GPUs in MIG mode that the DRA world owns, with their counter sets in
// slices of their own. A claim whose result names a MIG placement (dra.MIGFromResult) is
// prepared by creating that MIG device through Options.MIG ([MIGDevices], the node agent's
// realiser): first destroying an instance at the placement that no prepared claim records
// (left by a plugin that stopped between the create and its checkpoint), then creating the
// instance at exactly the placement. The claim's CDI spec gives the container the MIG
// device as the device plugin's MIG Allocate does (hamicore.MIGResponse:
// NVIDIA_VISIBLE_DEVICES=<MIG UUID>, no HAMi-core limit or mount), the checkpoint records
// the instance, and Unprepare destroys it, also after a restart. A claim with both MIG
// devices and shares of GPUs is refused (one container cannot get both), so is a MIG
// placement overlapping one a prepared claim holds. New refuses a checkpoint with MIG
// devices when Options.MIG is nil ([ErrNoMIG]).
//
// # Lifecycle and concurrency
//
// New starts nothing. Run blocks until its context ends, then stops the helper and the
// controller and returns nil; it may run again afterwards, but not twice at once
// ([ErrAlreadyRunning]); the cleanup goroutine it starts ends with it. SetDevices,
// [Plugin.PreparedGPUs] and [Plugin.Stats] are safe for concurrent use with everything;
// Prepare, Unprepare and Cleanup are serialised, within the process and across processes.
// WatchHealthStatus calls run one per kubelet stream and never block SetDevices; Run ends
// them and waits for them before it returns. Options.Refuse is called without the plugin's
// state lock, so it may call PreparedGPUs.
package draplugin
