package diagnose

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Stage is how far a GPU pod got through HAMi's allocation protocol (the stages S0–S4 of the
// pod guide): admitted to HAMi's scheduler, filtered, bound, allocated, running.
// [StageNotAdmitted] means it did not even reach S0: no HAMi scheduler will look at it.
type Stage int

const (
	// StageNotAdmitted means spec.schedulerName is not HAMi's scheduler.
	StageNotAdmitted Stage = iota - 1
	// StageAdmitted (S0): spec.schedulerName names HAMi's scheduler.
	StageAdmitted
	// StageFiltered (S1): the extender's filter chose a node and GPUs (hami.io/vgpu-node and
	// the device annotations are set, or a FilteringSucceed Event).
	StageFiltered
	// StageBound (S2): the extender's bind took the node lock and bound the pod
	// (hami.io/bind-phase allocating, spec.nodeName set).
	StageBound
	// StageAllocated (S3): the device plugin's Allocate consumed the entries
	// (hami.io/bind-phase success).
	StageAllocated
	// StageRunning (S4): status.phase Running (or Succeeded).
	StageRunning
)

// String is "S0".."S4", or "none" for StageNotAdmitted.
func (s Stage) String() string {
	if s < StageAdmitted || s > StageRunning {
		return "none"
	}
	return fmt.Sprintf("S%d", int(s))
}

// Describe names the stage in words: "S2 bound".
func (s Stage) Describe() string {
	switch s {
	case StageAdmitted:
		return "S0 admitted to HAMi's scheduler"
	case StageFiltered:
		return "S1 filtered"
	case StageBound:
		return "S2 bound"
	case StageAllocated:
		return "S3 allocated"
	case StageRunning:
		return "S4 running"
	default:
		return "not admitted to HAMi's scheduler"
	}
}

// MarshalText writes the stage as String does, so JSON and YAML carry "S2".
func (s Stage) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads what MarshalText writes.
func (s *Stage) UnmarshalText(b []byte) error {
	v := string(b)
	if v == "none" {
		*s = StageNotAdmitted
		return nil
	}
	var n int
	if _, err := fmt.Sscanf(v, "S%d", &n); err != nil || n < 0 || n > int(StageRunning) || fmt.Sprintf("S%d", n) != v {
		return fmt.Errorf("%w: stage %q (want S0..S4 or none)", ErrInvalidOptions, v)
	}
	*s = Stage(n)
	return nil
}

// Stable pod finding codes.
const (
	CodePodNotFound         = "PodNotFound"
	CodePodNoGPU            = "PodAsksNoGPU"
	CodePodWaiting          = "PodOnItsWay"
	CodePodNotChecked       = "NotChecked"
	CodeOtherScheduler      = "SchedulerNameNotHAMi"
	CodeNodeNameAtCreation  = "NodeNameSetAtCreation"
	CodeWebhookMissing      = "WebhookMissing"
	CodeWebhookExcludes     = "WebhookExcludesPod"
	CodeWebhookNoEndpoints  = "WebhookServiceNoEndpoints"
	CodeWebhookIgnoreLabel  = "WebhookIgnoreLabel"
	CodeDefaultScheduled    = "BoundByOtherScheduler"
	CodeExtenderUnreachable = "ExtenderUnreachable"
	CodeSchedulerNotReady   = "SchedulerNotReady"
	CodeSchedulerLease      = "SchedulerLeaseExpired"
	CodeExtenderURL         = "ExtenderURLMismatch"
	CodeNoEvents            = "NoSchedulingEvents"
	CodeHandOver            = "NodeNotRegistered"
	CodeFitShort            = "NoNodeFits"
	CodeQuotaExceeded       = "QuotaExceeded"
	CodeTypeSelector        = "GPUTypeSelector"
	CodeUUIDSelector        = "GPUUUIDSelector"
	CodeNUMABind            = "NUMABind"
	CodeNodeLocked          = "NodeLocked"
	CodeLockStale           = "NodeLockStale"
	CodeLockNeverReleased   = "NodeLockNeverReleased"
	CodeAllocateLate        = "AllocateNotCalled"
	CodeAllocateFailed      = "AllocateFailed"
	CodeNoBindingPod        = "NoBindingPodFound"
	CodeRequestNotFound     = "DeviceRequestNotFound"
	CodeNumberMismatch      = "DeviceNumberNotMatched"
	CodeStaleAssignment     = "StaleAssignment"
	CodeNodeRestarted       = "NodeRestartedAfterFilter"
	CodeLimitsNotEnforced   = "LimitsNotEnforced"
	CodeControlDisabled     = "CUDADisableControl"
	CodeForeignPlugin       = "PluginNotHAMi"
)

// PodReport is the diagnosis of one pod.
type PodReport struct {
	// Namespace and Name name the pod; UID is its uid.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
	// Phase is status.phase; SchedulerName spec.schedulerName; Node spec.nodeName.
	Phase         string `json:"phase"`
	SchedulerName string `json:"schedulerName"`
	Node          string `json:"node,omitempty"`
	// AssignedNode is hami.io/vgpu-node (the filter's choice); BindPhase hami.io/bind-phase.
	AssignedNode string `json:"assignedNode,omitempty"`
	BindPhase    string `json:"bindPhase,omitempty"`
	// Asks lists what each container asks, init containers first, in HAMi's words
	// ("cuda: 2 × 30000 MiB, 30 % cores").
	Asks []string `json:"asks,omitempty"`
	// Stage is the last stage the pod reached.
	Stage Stage `json:"stage"`
	// StageText names the stage of a claim-based pod ("S2 bound, claims not prepared by the
	// kubelet (DRA)"); "" for a pod on HAMi's path, whose stage Stage.Describe names.
	StageText string `json:"stageText,omitempty"`
	// Claims are the pod's claims of the SDK's or HAMi-DRA's DRA driver (spec.resourceClaims,
	// and the claim of an extended resource served through DRA), with their allocated devices
	// and the devices' health; empty for a pod on HAMi's device-plugin path.
	Claims []ClaimState `json:"claims,omitempty"`
	// Case is the pod case that stops the pod (the first error finding's), or Healthy.
	Case Case `json:"case"`
	// Reason is one line: the summary of the finding that set Case, or where the pod is.
	Reason string `json:"reason"`
	// Lock is the node lock on the pod's node (assigned or bound), when there is one.
	Lock *LockState `json:"lock,omitempty"`
	// Fit is the fit recomputed with the SDK's allocation on the nodes and usage read (P3,
	// and whenever the pod is before S1).
	Fit *FitExplanation `json:"fit,omitempty"`
	// Usage is a Running GPU pod's usage of its GPUs against its limits, from the node
	// monitor of its node; nil when it was not read ([PodEvidence].Monitor).
	Usage *UsageReport `json:"usage,omitempty"`
	// Findings lists everything found, errors first.
	Findings []Finding `json:"findings"`
	// Nodes are the node diagnoses the report hands over to: the candidate nodes of a pod
	// stopped before S1 without FilteringFailed, the node of a pod whose Allocate never came.
	Nodes []Report `json:"nodes,omitempty"`
	// Checked is when the report was made.
	Checked time.Time `json:"checked"`
}

// Finding returns the first finding with the code, if any.
func (r *PodReport) Finding(code string) (Finding, bool) {
	for _, f := range r.Findings {
		if f.Code == code {
			return f, true
		}
	}
	return Finding{}, false
}

// Errors returns the findings with SeverityError.
func (r *PodReport) Errors() []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if f.Severity == SeverityError {
			out = append(out, f)
		}
	}
	return out
}

// LockState is hami.io/mutex.lock on a node, as read, with its holder.
type LockState struct {
	// Node is the locked node; Value the annotation's value.
	Node  string `json:"node"`
	Value string `json:"value"`
	// Holder is "namespace/name" of the pod the value names ("" for a legacy value without
	// an owner); Since when it was taken; Age its age when read (AgeSeconds in JSON).
	Holder     string        `json:"holder,omitempty"`
	Since      time.Time     `json:"since,omitempty"`
	Age        time.Duration `json:"-"`
	AgeSeconds int64         `json:"ageSeconds"`
	// HolderExists, HolderNode and HolderBindPhase describe the holder pod as read
	// (HolderNode its spec.nodeName).
	HolderExists    bool   `json:"holderExists"`
	HolderNode      string `json:"holderNode,omitempty"`
	HolderBindPhase string `json:"holderBindPhase,omitempty"`
	// Expired says the lock is older than the lock timeout (HAMi's --node-lock-timeout).
	Expired bool `json:"expired"`
	// Stale says why nobody should wait for this lock: its holder is gone, on another node,
	// done allocating (success/failed: a plugin that never releases), the value names no
	// pod, or it expired; "" when the lock is live.
	Stale string `json:"stale,omitempty"`
	// Error is the parse error of a malformed value.
	Error string `json:"error,omitempty"`
}

// FitExplanation is the fit recomputed for the pod.
type FitExplanation struct {
	// Nodes lists every candidate node with the reason it does not fit ("" when it fits),
	// sorted by name.
	Nodes []NodeFit `json:"nodes"`
	// Reasons counts the candidate nodes per fit reason word (CardInsufficientMemory, …),
	// as HAMi's FilteringFailed Events do.
	Reasons map[string]int `json:"reasons,omitempty"`
	// Shortage is the sentence that names what is short and who holds it: "2 × 30000 MiB
	// asked; the best node gpu-2 has one GPU with ≥ 30000 MiB free; GPU-… is held by pods
	// a, b".
	Shortage string `json:"shortage,omitempty"`
	// Fits is the node the SDK's fit would choose now, "" when none.
	Fits string `json:"fits,omitempty"`
}

// NodeFit is one candidate node in a FitExplanation.
type NodeFit struct {
	Node string `json:"node"`
	// Reason is the fit's reason string ("2/2 CardInsufficientMemory"), "" when it fits.
	Reason string `json:"reason,omitempty"`
	// FreeGPUs counts the node's healthy GPUs with at least the asked memory free.
	FreeGPUs int `json:"freeGPUs"`
	// GPUs lists each GPU with what is free and who holds it.
	GPUs []GPUFree `json:"gpus,omitempty"`
}

// GPUFree is what one GPU has left and which pods hold the rest.
type GPUFree struct {
	UUID       string   `json:"uuid"`
	Type       string   `json:"type,omitempty"`
	FreeMemory int64    `json:"freeMemoryMiB"`
	FreeCores  int64    `json:"freeCores"`
	FreeSlots  int64    `json:"freeSlots"`
	Healthy    bool     `json:"healthy"`
	HeldBy     []string `json:"heldBy,omitempty"`
}

// Errors of Pod and Pods, besides ErrAPI and ErrInvalidOptions.
var (
	// ErrPodNotFound: no Pod with that namespace and name.
	ErrPodNotFound = errors.New("pod not found")
	// ErrNotStale: a repair was asked for a lock that is live (its holder exists on the node
	// and is still allocating, within the timeout) or that changed since it was shown.
	ErrNotStale = errors.New("node lock is not stale")
	// ErrNoLock: the node has no lock to repair.
	ErrNoLock = errors.New("node has no lock")
)

// asksString renders the request of one container in HAMi's words.
func asksString(name string, count, memory, percentage, cores int32) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d GPU", name, count)
	switch {
	case memory > 0:
		fmt.Fprintf(&b, " × %d MiB", memory)
	case percentage > 0 && percentage <= 100:
		fmt.Fprintf(&b, " × %d %% memory", percentage)
	}
	fmt.Fprintf(&b, ", %d %% cores", cores)
	return b.String()
}
