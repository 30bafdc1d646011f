package monitor

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/hamireg/hamireg/annotation"
)

// Defaults of [Options], HAMi's.
const (
	// DefaultRoot is the folder that holds containers/ (and the SDK DRA driver's claims/):
	// HAMi's monitor HOOK_PATH, /usr/local/vgpu (the device plugin's HOOK_PATH + "/vgpu").
	DefaultRoot = "/usr/local/vgpu"
	// DefaultResyncInterval is how long a folder whose pod is not on the node is kept:
	// HAMi's HAMI_RESYNC_INTERVAL default.
	DefaultResyncInterval = 5 * time.Minute
	// DefaultPeriod is the round of the folder scan and the priority feedback: HAMi's 5 s.
	DefaultPeriod = 5 * time.Second
	// DefaultZone is the const label value HAMi's monitor puts on its series (zone="vGPU").
	DefaultZone = "vGPU"
)

// ErrInvalidOptions is an [Options] that cannot work; the message names the field.
var ErrInvalidOptions = errors.New("invalid monitor options")

// ErrNotSupported is what a [Host] wraps into a [HostGPU] error when the driver does not
// support the query (NVML's NOT_SUPPORTED): the monitor skips only that series, as HAMi does
// for unified-memory GPUs. Any other error drops every host series of the GPU.
var ErrNotSupported = errors.New("not supported by the driver")

// Pods gives the monitor the pods bound to its node, from an informer's cache (the node
// agent's node-scoped pod informer): every phase, with UID, namespace, name, containers and
// resource claims. An error (not synced yet) makes the monitor skip the round's cleanup.
type Pods interface {
	NodePods() ([]*corev1.Pod, error)
}

// PodsFunc is a function that is a [Pods].
type PodsFunc func() ([]*corev1.Pod, error)

// NodePods calls f.
func (f PodsFunc) NodePods() ([]*corev1.Pod, error) { return f() }

// Claims resolves the claim folders the SDK's DRA driver writes (<Root>/claims/<claim
// UID>/) to their ResourceClaim: the namespace and name of a claim prepared on this node.
type Claims interface {
	Claim(uid types.UID) (types.NamespacedName, bool)
}

// Host answers the host GPU families and the per-process view of the driver. The NVIDIA
// implementation is nvmlscan's Scanner.Usage (examples/deviceplugin adapts it); a vendor
// gives its own.
type Host interface {
	GPUs(ctx context.Context) ([]HostGPU, error)
}

// HostGPU is one host GPU's live usage.
type HostGPU struct {
	// Index is the host index, UUID the GPU's UUID, Name the model (HAMi's device_type is
	// "NVIDIA-"+Name).
	Index int
	UUID  string
	Name  string
	// MemoryUsed and MemoryTotal are bytes; MemoryErr is the error reading them.
	MemoryUsed, MemoryTotal uint64
	MemoryErr               error
	// UtilGPU and UtilMemory are percent; UtilErr is the error reading them.
	UtilGPU, UtilMemory uint32
	UtilErr             error
	// Processes are the compute processes on the GPU by host PID; ProcessesErr the error
	// listing them.
	Processes    []Process
	ProcessesErr error
}

// Process is a compute process on a host GPU.
type Process struct {
	PID        uint32
	UsedMemory uint64
}

// PrioritySource says where the priority feedback takes a container's priority from.
type PrioritySource int

const (
	// PriorityRegion takes the region's priority word, as HAMi does (the tenant's process
	// writes it: a low-priority tenant can write 0). The default.
	PriorityRegion PrioritySource = iota
	// PriorityPodSpec takes the pod spec's: the container's nvidia.com/priority limit, else
	// its CUDA_TASK_PRIORITY variable, else HAMi-core's default 1.
	PriorityPodSpec
)

// Options configure a [Monitor]. The zero value is HAMi v2.10.0's monitor.
type Options struct {
	// Root is the folder holding containers/<pod UID>_<container>/ and claims/<claim
	// UID>/; default [DefaultRoot].
	Root string
	// NodeName is the node's name, the node label of the host families. Required.
	NodeName string
	// Version chooses whose metric labels and help texts: annotation.VersionMaster (HAMi
	// v2.10.0, the default) or annotation.VersionV290.
	Version annotation.Version
	// LegacyMetrics also serves HAMi's legacy family names (--legacy-metrics).
	LegacyMetrics bool
	// ResyncInterval is how long the folder of a pod not on the node is kept before it is
	// removed; default [DefaultResyncInterval].
	ResyncInterval time.Duration
	// Period is the round of the scan and the priority feedback; default [DefaultPeriod].
	Period time.Duration
	// DisableFeedback turns the priority feedback off (the monitor then writes nothing).
	DisableFeedback bool
	// PrioritySource says where a container's priority comes from; default PriorityRegion.
	PrioritySource PrioritySource
	// ActivityFromSMUtil also counts a container as active on a GPU, in the priority
	// feedback, when its live processes' SM utilisation there (the region's slots) is above
	// 0, not only when HAMi-core refreshed recent_kernel since the last round. HAMi-core
	// (since 2026-03) refreshes recent_kernel only while the utilization switch is on, so
	// with HAMi's rule alone a switch once off stays off; this keeps contention visible.
	// Default false: HAMi's rule.
	ActivityFromSMUtil bool
	// Host, when set, gives the host GPU families and the per-process families.
	Host Host
	// Claims, when set, ties the DRA driver's claim folders to their pods.
	Claims Claims
	// ProcessMetrics serves the SDK's per-process families (needs Host): HAMi-core's
	// accounting against the driver's per host PID, processes on a shared GPU with no slot,
	// slots whose process the driver no longer lists.
	ProcessMetrics bool
	// FeedbackMetrics serves the SDK's priority-feedback families: each container's
	// priority, blocked state, utilization switch and priority mismatches.
	FeedbackMetrics bool
	// Clock is the monitor's clock; default the real one.
	Clock clock.WithTicker
}

func (o Options) withDefaults() (Options, error) {
	if o.NodeName == "" {
		return o, fmt.Errorf("%w: NodeName is empty (set it from NODE_NAME, the pod's spec.nodeName)", ErrInvalidOptions)
	}
	if o.Root == "" {
		o.Root = DefaultRoot
	}
	if o.ResyncInterval == 0 {
		o.ResyncInterval = DefaultResyncInterval
	}
	if o.ResyncInterval < 0 {
		return o, fmt.Errorf("%w: ResyncInterval %v is negative", ErrInvalidOptions, o.ResyncInterval)
	}
	if o.Period == 0 {
		o.Period = DefaultPeriod
	}
	if o.Period < 0 {
		return o, fmt.Errorf("%w: Period %v is negative", ErrInvalidOptions, o.Period)
	}
	if o.Version != annotation.VersionMaster && o.Version != annotation.VersionV290 {
		return o, fmt.Errorf("%w: Version %d is not VersionMaster or VersionV290", ErrInvalidOptions, o.Version)
	}
	if o.PrioritySource != PriorityRegion && o.PrioritySource != PriorityPodSpec {
		return o, fmt.Errorf("%w: PrioritySource %d is not PriorityRegion or PriorityPodSpec", ErrInvalidOptions, o.PrioritySource)
	}
	if o.ProcessMetrics && o.Host == nil {
		return o, fmt.Errorf("%w: ProcessMetrics needs Host (the driver's per-process view)", ErrInvalidOptions)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return o, nil
}
