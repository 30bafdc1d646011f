package diagnose

import (
	"errors"
	"fmt"
	"time"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/handshake"
)

// Case is one of the five cases of HAMi's "GPU node not registering" troubleshooting guide, in
// the order the guide walks them; the zero value means no case applies.
type Case int

const (
	// Healthy means all three channels are set and nothing excludes the node.
	Healthy Case = 0
	// CasePluginNotScheduled (case 1): no device plugin Pod on the node; the DaemonSet's
	// nodeSelector does not match the node's labels or the node has a taint it does not tolerate.
	CasePluginNotScheduled Case = 1
	// CasePluginNotRunning (case 2): the Pod is there but not Running: a crash loop (NVML cannot
	// load: the container runtime is not nvidia), an init container waiting for toolkit-ready,
	// the node-name environment variable missing.
	CasePluginNotRunning Case = 2
	// CaseNoAllocatable (case 3): the Pod runs but the kubelet reports no devices of the resource:
	// the plugin's socket folder is not the kubelet's, or the registration was lost.
	CaseNoAllocatable Case = 3
	// CaseNoAnnotation (case 4): the device count is there but the register annotation is
	// missing, malformed, empty or lists no healthy device; or the plugin may not patch nodes.
	CaseNoAnnotation Case = 4
	// CaseSchedulerExcludes (case 5): both are there but HAMi's scheduler does not take the node:
	// its --node-label-selector excludes it, no scheduler leads, or the handshake says so.
	CaseSchedulerExcludes Case = 5
)

// String names the case the way the guide does.
func (c Case) String() string {
	switch c {
	case Healthy:
		return "healthy"
	case CasePluginNotScheduled:
		return "case 1: device plugin not scheduled on the node"
	case CasePluginNotRunning:
		return "case 2: device plugin not running"
	case CaseNoAllocatable:
		return "case 3: no allocatable devices"
	case CaseNoAnnotation:
		return "case 4: register annotation missing or unusable"
	case CaseSchedulerExcludes:
		return "case 5: scheduler does not take the node"
	}
	return fmt.Sprintf("case %d", int(c))
}

// Short is "healthy" or "case N".
func (c Case) Short() string {
	if c == Healthy {
		return "healthy"
	}
	return fmt.Sprintf("case %d", int(c))
}

// Severity grades a finding.
type Severity string

const (
	// SeverityError findings cause their case: the node does not register until they are fixed.
	SeverityError Severity = "error"
	// SeverityWarning findings do not stop registration now but are wrong or fragile.
	SeverityWarning Severity = "warning"
	// SeverityInfo findings explain an observation that is easy to misread (an old Requesting_
	// timestamp, a quiet follower log) or something this package could not see.
	SeverityInfo Severity = "info"
)

// Finding is one thing found on the way, with what shows it and how to fix it.
type Finding struct {
	// Case is the case this finding belongs to (Healthy for notes outside any case).
	Case Case `json:"case"`
	// Severity says whether the finding causes its case.
	Severity Severity `json:"severity"`
	// Code is a stable identifier to branch on, e.g. "NodeSelectorMismatch"; see the Code…
	// constants.
	Code string `json:"code"`
	// Summary is one sentence.
	Summary string `json:"summary"`
	// Evidence lists the observed facts behind the finding, each naming its object.
	Evidence []string `json:"evidence,omitempty"`
	// Fix lists commands (kubectl, helm) to run from a workstation, in order.
	Fix []string `json:"fix,omitempty"`
	// OnNode lists commands to run on the node itself for what the API server cannot show
	// (kubelet flags, containerd configuration, files under /var/lib/kubelet).
	OnNode []string `json:"onNode,omitempty"`
}

// Stable finding codes.
const (
	CodeNodeNotFound          = "NodeNotFound"
	CodeDaemonSetNotFound     = "DaemonSetNotFound"
	CodeNodeSelectorMismatch  = "NodeSelectorMismatch"
	CodeUntoleratedTaint      = "UntoleratedTaint"
	CodePluginPodMissing      = "PluginPodMissing"
	CodeNVMLUnavailable       = "NVMLUnavailable"
	CodeRuntimeClassMissing   = "RuntimeClassMissing"
	CodeToolkitNotReady       = "ToolkitNotReady"
	CodeNodeNameEnv           = "NodeNameEnvMissing"
	CodePluginCrashing        = "PluginCrashing"
	CodePluginPending         = "PluginPending"
	CodePluginNotReady        = "PluginNotReady"
	CodeNoAllocatable         = "NoAllocatable"
	CodeAllocatableMismatch   = "AllocatableMismatch"
	CodeAnnotationMissing     = "AnnotationMissing"
	CodeAnnotationMalformed   = "AnnotationMalformed"
	CodeAnnotationEmpty       = "AnnotationEmpty"
	CodeAnnotationNullElement = "AnnotationNullElement"
	CodeDevicesUnhealthy      = "DevicesUnhealthy"
	CodePatchForbidden        = "PatchNodesForbidden"
	CodeLabelSelectorExcludes = "NodeLabelSelectorExcludes"
	CodeSchedulerNotFound     = "SchedulerNotFound"
	CodeNoLeader              = "NoSchedulerLeader"
	CodeLeaderUnknown         = "LeaderNotASchedulerPod"
	CodeHandshakeMissing      = "HandshakeMissing"
	CodeHandshakeOld          = "HandshakeOldButFine"
	CodeHandshakeDeleted      = "HandshakeDeleted"
	CodeHandshakeBroken       = "HandshakeUnparsable"
	CodeHandshakeVendorKey    = "HandshakeNVIDIAKeyIgnored"
	CodeFollowerLogQuiet      = "FollowerLogsNothing"
	CodeNotChecked            = "NotChecked"
)

// ChannelState is the verdict on one channel.
type ChannelState string

const (
	// StateOK means the channel carries what the scheduler needs.
	StateOK ChannelState = "ok"
	// StateBroken means the channel is missing or unusable.
	StateBroken ChannelState = "broken"
	// StateWarning means usable, with a problem worth a look.
	StateWarning ChannelState = "warning"
	// StateUnknown means it could not be read (permissions, object missing).
	StateUnknown ChannelState = "unknown"
)

// Report is the diagnosis of one node.
type Report struct {
	// Node is the node's name.
	Node string `json:"node"`
	// Vendor is the HAMi vendor word checked ("NVIDIA").
	Vendor string `json:"vendor"`
	// Case is the first case (in the guide's order) that one of the findings causes, or
	// Healthy.
	Case Case `json:"case"`
	// Reason is a one-line summary: the summary of the finding that set Case, or why the node
	// is healthy.
	Reason string `json:"reason"`
	// Plugin, Count, Spec and Handshake are the observed channels (the plugin Pods, the device
	// count, the device specification, the liveness handshake).
	Plugin    PluginChannel    `json:"plugin"`
	Count     CountChannel     `json:"count"`
	Spec      SpecChannel      `json:"spec"`
	Handshake HandshakeChannel `json:"handshake"`
	// Scheduler is what was found about HAMi's scheduler.
	Scheduler SchedulerInfo `json:"scheduler"`
	// Findings lists everything found, errors first, then by case.
	Findings []Finding `json:"findings"`
	// Checked is when the report was made.
	Checked time.Time `json:"checked"`
}

// Errors returns the findings with SeverityError.
func (r *Report) Errors() []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if f.Severity == SeverityError {
			out = append(out, f)
		}
	}
	return out
}

// Finding returns the first finding with the code, if any.
func (r *Report) Finding(code string) (Finding, bool) {
	for _, f := range r.Findings {
		if f.Code == code {
			return f, true
		}
	}
	return Finding{}, false
}

// PluginChannel is the device plugin side: the DaemonSet and its Pods on the node.
type PluginChannel struct {
	State ChannelState `json:"state"`
	// DaemonSet is "namespace/name", empty when not found.
	DaemonSet string `json:"daemonSet,omitempty"`
	// Pods are the DaemonSet's Pods bound to the node.
	Pods []PodState `json:"pods,omitempty"`
}

// PodState is the state of one device plugin Pod.
type PodState struct {
	Name  string `json:"name"`
	Phase string `json:"phase"`
	Ready bool   `json:"ready"`
	// Reason is the most telling waiting or termination reason of its containers
	// ("CrashLoopBackOff", "PodInitializing", …), empty when Running and ready.
	Reason   string `json:"reason,omitempty"`
	Restarts int32  `json:"restarts"`
	// Message is the last termination message of the failing container, trimmed.
	Message string `json:"message,omitempty"`
}

// CountChannel is the device count the kubelet publishes.
type CountChannel struct {
	State ChannelState `json:"state"`
	// Resource is the extended resource name ("nvidia.com/gpu").
	Resource string `json:"resource"`
	// Allocatable and Capacity are the node status values (0 when absent).
	Allocatable int64 `json:"allocatable"`
	Capacity    int64 `json:"capacity"`
	// Physical is the number of devices in the register annotation and Split their split
	// count (0 when unknown); Expected is the sum of the counts of the devices the kubelet is
	// offered: Physical × Split, less the Withheld ones.
	Physical int   `json:"physical,omitempty"`
	Split    int32 `json:"split,omitempty"`
	Expected int64 `json:"expected,omitempty"`
	// Withheld is the number of devices of the annotation that the node agent gave to DRA
	// (listed in the Node's hamireg.io/agent-device-cordon): they are not offered to the
	// kubelet.
	Withheld int `json:"withheld,omitempty"`
}

// SpecChannel is the register annotation.
type SpecChannel struct {
	State ChannelState `json:"state"`
	Key   string       `json:"key"`
	// Present says whether the key is set; Length is the value's length in bytes.
	Present bool `json:"present"`
	Length  int  `json:"length,omitempty"`
	// Devices is the decoded list; Unhealthy counts devices whose health is false (or
	// missing: a missing key means unhealthy).
	Devices   []annotation.Device `json:"devices,omitempty"`
	Unhealthy int                 `json:"unhealthy,omitempty"`
	// Error is the decode failure in words; HAMiLog what HAMi's scheduler logs for it.
	Error   string `json:"error,omitempty"`
	HAMiLog string `json:"hamiLog,omitempty"`

	verdict annotation.Verdict
}

// Verdict is the scheduler's verdict on the annotation through annotation.Check.
func (s *SpecChannel) Verdict() annotation.Verdict { return s.verdict }

// HandshakeChannel is the scheduler's liveness handshake on the node.
type HandshakeChannel struct {
	State ChannelState `json:"state"`
	Key   string       `json:"key"`
	Value string       `json:"value,omitempty"`
	// Present says whether the key is set; Parsed is the state HAMi's scheduler reads from it
	// ("requesting", "deleted", "other", "absent").
	Present bool   `json:"present"`
	Parsed  string `json:"parsed"`
	// Age is how old the timestamp is (0 when it does not parse; negative in the future);
	// AgeSeconds is the same in whole seconds, for JSON.
	Age        time.Duration `json:"-"`
	AgeSeconds int64         `json:"ageSeconds,omitempty"`
	// Healthy and Reason are the scheduler's decision for this value and allocatable.
	Healthy bool   `json:"healthy"`
	Reason  string `json:"reason"`

	value handshake.Value
}

// SchedulerInfo is what was found about HAMi's scheduler.
type SchedulerInfo struct {
	// Deployment is "namespace/name", empty when not found.
	Deployment string `json:"deployment,omitempty"`
	// NodeLabelSelector is the --node-label-selector the extender runs with (empty: all nodes).
	NodeLabelSelector map[string]string `json:"nodeLabelSelector,omitempty"`
	// Lease is "namespace/name"; Leader its holder identity; LeaderPod the scheduler Pod it
	// names; LeaseValid whether it was renewed within its duration.
	Lease      string `json:"lease,omitempty"`
	Leader     string `json:"leader,omitempty"`
	LeaderPod  string `json:"leaderPod,omitempty"`
	LeaseValid bool   `json:"leaseValid"`
}

// Errors returned by Node and Nodes. Problems found in the cluster are findings, not errors;
// these are the failures to look at all.
var (
	// ErrNodeNotFound: no Node with that name.
	ErrNodeNotFound = errors.New("node not found")
	// ErrAPI: the API server could not be asked (connection, authentication, permissions on
	// nodes).
	ErrAPI = errors.New("api server request failed")
	// ErrInvalidOptions: the options do not make sense (a bad label selector).
	ErrInvalidOptions = errors.New("invalid options")
)
