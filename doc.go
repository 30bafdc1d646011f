// Package hamireg is an SDK for building components that are wire-compatible with HAMi, the
// CNCF GPU-sharing project: device plugins, scheduler extenders and tools that make a GPU node
// schedulable, and tell an operator why one is not.
//
// A HAMi GPU node becomes schedulable through three independent channels, and each can break
// alone:
//
//   - Device count: the device plugin registers with the kubelet over kubelet.sock and streams
//     its devices; the kubelet publishes status.allocatable["nvidia.com/gpu"] = physical GPUs ×
//     split count. Served by package kubeletplugin.
//   - Device specification: the device plugin writes the Node annotation
//     hami.io/node-nvidia-register, a JSON list of GPUs. Encoded and decoded by package
//     [github.com/hamireg/hamireg/annotation]; written by package register from what package
//     nvmlscan reads out of NVML.
//   - Liveness handshake: the scheduler stamps hami.io/node-handshake with
//     "Requesting_<time>" and cleans nodes up whose handshake expired with nothing
//     allocatable. Decided by package [github.com/hamireg/hamireg/handshake]; run by package
//     schedcache, the scheduler's node cache.
//
// Package diagnose checks all three for one node and names the broken channel, the case of
// HAMi's troubleshooting guide and the fix; cmd/kubectl-hami_doctor is its command line.
//
// Once a node registers, a pod runs through the allocation half of the protocol: the
// scheduler's filter picks a node and GPUs and writes them into pod annotations, its bind takes
// the node lock hami.io/mutex.lock, and the device plugin's Allocate consumes the annotations,
// returns HAMi-core's container environment and releases the lock. Package
// [github.com/hamireg/hamireg/allocation] is that protocol as pure functions (the pod device
// codec, requests, usage, HAMi's NVIDIA fit and policies, the vendor-neutral container
// response), package [github.com/hamireg/hamireg/hamicore] HAMi-core's container edits for
// NVIDIA, package [github.com/hamireg/hamireg/nodelock] the node lock, and
// allocation/allocationtest writes what HAMi's scheduler writes, for device plugin tests.
// Package usage is the scheduler's incremental record of what pods hold of each GPU and of each
// namespace's ResourceQuota, with assume and undo, for any scheduler (module schedplugin is a
// kube-scheduler framework plugin on it). Package extender is the scheduler half as a
// kube-scheduler extender (filter with quota and topology-aware placement, bind, admission
// webhook, HAMi's metrics) on schedcache's snapshots and a usage tracker; examples/extender is
// its program and deployment.
//
// Package [github.com/hamireg/hamireg/nodeagent] puts the node side together: one device source
// (nvmlscan, or a vendor's) feeds register and kubeletplugin, and the kubelet's Allocate is
// served with HAMi's pod protocol (allocation and nodelock); examples/deviceplugin is a whole
// device plugin on it.
//
// MIG runs through the same parts: package [github.com/hamireg/hamireg/mig] is its pure side
// (the hami.io/vgpu-mig-allocations reservation codec, the migProfileAllowlist, the placement
// packer), nvmlscan discovers each GPU's MIG profiles and realises instances (Scanner.MIG),
// allocation's fit chooses a profile and a placement, and the node agent creates the reserved
// instance at Allocate and destroys it when its pod is gone.
//
// DRA (Kubernetes Dynamic Resource Allocation) is the node agent's third output: package
// [github.com/hamireg/hamireg/dra] maps the same scanned GPUs to DRA devices with consumable
// capacity (memory, cores), in the SDK's own profile or HAMi-DRA's, and package draplugin is
// the DRA kubelet plugin that publishes them as a ResourceSlice and prepares claims with
// HAMi-core's limits as CDI specs. With nodeagent's Options.DRA, a world that package
// [github.com/hamireg/hamireg/nodeagent/nodedra] builds, one agent serves both worlds on one
// node, one owner per GPU: GPUs the DRA world owns are cordoned for HAMi's extender, the
// others are tainted in the slice. Only programs that import nodedra link the DRA libraries.
//
// Data flows one way: NVML → nvmlscan → nodeagent → register (channel 2) and kubeletplugin
// (channel 1); kubelet Allocate → nodeagent → allocation, hamicore and nodelock; Node informer
// → schedcache → handshake (channel 3); Pod and ResourceQuota informers → usage; schedcache and
// usage → extender (allocation's fit, nodelock at bind). The packages annotation, handshake,
// mig, dra, allocation and hamicore are pure (no I/O, no clock, no logging) and build without
// cgo; only nvmlscan uses cgo.
//
// The wire format is byte-identical to HAMi's for the same device list (master's shape by
// default, v2.9.0's on request), and readers accept what HAMi accepts. Where HAMi crashes or
// misbehaves (a null device element, a handshake without "_", random device order, a failed
// patch cached as success) this SDK returns classified errors and does the right thing
// without changing what is on the wire.
package hamireg
