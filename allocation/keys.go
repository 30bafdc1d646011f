package allocation

import "github.com/hamireg/hamireg/annotation"

// Pod annotation and label keys of HAMi's allocation protocol, shared by every vendor. The
// device lists have a key per vendor: [annotation.Vendor] ToAllocateKey and AllocatedKey
// (for NVIDIA [annotation.KeyNVIDIAToAllocate] and [annotation.KeyNVIDIAAllocated]).
const (
	// KeyNode is the node the scheduler chose, written at filter as an annotation and as a
	// label. A pod counts toward its node's usage only while it carries this annotation.
	KeyNode = "hami.io/vgpu-node"
	// KeyTime is when the scheduler chose, in Unix seconds, written at filter.
	KeyTime = "hami.io/vgpu-time"
	// KeyBindPhase is where the pod is in the protocol: [PhaseAllocating] from bind,
	// [PhaseSuccess] or [PhaseFailed] from the device plugin.
	KeyBindPhase = "hami.io/bind-phase"
	// KeyBindTime is when the scheduler bound the pod, in Unix seconds.
	KeyBindTime = "hami.io/bind-time"

	// KeyGPUSchedulerPolicy overrides the scheduler's device policy for one pod.
	KeyGPUSchedulerPolicy = "hami.io/gpu-scheduler-policy"
	// KeyNodeSchedulerPolicy overrides the scheduler's node policy for one pod.
	KeyNodeSchedulerPolicy = "hami.io/node-scheduler-policy"
	// KeyDeviceCordon is a Node annotation listing GPU UUIDs, comma-separated, that take no new
	// pods (HAMi master only).
	KeyDeviceCordon = "hami.io/device-cordon"
	// KeyAgentDeviceCordon is a Node annotation of this SDK's node agent (not HAMi's): the
	// UUIDs of KeyDeviceCordon the agent put there itself, comma-separated: the GPUs it keeps
	// for DRA and does not offer to the kubelet (register.Writer.SetCordon).
	KeyAgentDeviceCordon = "hamireg.io/agent-device-cordon"

	// NVIDIA pod annotations that steer which GPUs a pod may get.

	// KeyUseGPUType lists models, comma-separated, one of which the GPU's type must contain
	// (ignoring case).
	KeyUseGPUType = "nvidia.com/use-gputype"
	// KeyNoUseGPUType lists models none of which the GPU's type may contain.
	KeyNoUseGPUType = "nvidia.com/nouse-gputype"
	// KeyUseGPUUUID lists the GPU UUIDs the pod may get.
	KeyUseGPUUUID = "nvidia.com/use-gpuuuid"
	// KeyNoUseGPUUUID lists GPU UUIDs the pod may not get.
	KeyNoUseGPUUUID = "nvidia.com/nouse-gpuuuid"
	// KeyNUMABind, when it parses as true, puts all GPUs of a container on one NUMA node.
	KeyNUMABind = "nvidia.com/numa-bind"
	// KeyVGPUMode lists the modes (hami-core, mig, mps) the GPU's mode must be one of.
	KeyVGPUMode = "nvidia.com/vgpu-mode"
)

// BindPhase is a value of [KeyBindPhase].
type BindPhase string

// The bind phases.
const (
	// PhaseAllocating: the scheduler bound the pod and holds the node lock for it.
	PhaseAllocating BindPhase = "allocating"
	// PhaseSuccess: the device plugin handed out every container's devices and released the
	// node lock.
	PhaseSuccess BindPhase = "success"
	// PhaseFailed: the device plugin could not hand out the devices and released the lock.
	PhaseFailed BindPhase = "failed"
)

// Version selects which HAMi release's behaviour the pod side follows where v2.9.0 and
// master differ: HAMi's release, [annotation.Version].
type Version = annotation.Version

const (
	// VersionMaster is HAMi master (v2.10), the default.
	VersionMaster = annotation.VersionMaster
	// VersionV290 is HAMi v2.9.0.
	VersionV290 = annotation.VersionV290
)
