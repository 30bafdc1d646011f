package diagnose

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/handshake"
)

// Case is the case a [Report] or a [PodReport] is in, and the case a [Finding] belongs to, as
// a stable code: the case's number and its name. Node cases are "N1-…" to "N5-…", the five
// cases of HAMi's "GPU node not registering" troubleshooting guide in the order the guide
// walks them; pod cases are "P1-…" to "P8-…", the cases that stop a GPU pod (the pod guide),
// and "P0-NodeNotRegistered", the hand-over of a pod to the node diagnosis. [Healthy] means
// no case applies. The value is the code, so JSON and YAML carry it as a string
// ("P3-NoNodeFits"); a code this version does not know decodes as is.
type Case string

// Healthy means no case applies: for a node, all three channels are set and nothing excludes
// it; for a pod, it runs with its limits or is on its way and not late.
const Healthy Case = "Healthy"

// The node cases, N1 to N5.
const (
	// CasePluginNotScheduled (case 1): no device plugin Pod on the node; the DaemonSet's
	// nodeSelector does not match the node's labels or the node has a taint it does not tolerate.
	CasePluginNotScheduled Case = "N1-PluginNotScheduled"
	// CasePluginNotRunning (case 2): the Pod is there but not Running: a crash loop (NVML cannot
	// load: the container runtime is not nvidia), an init container waiting for toolkit-ready,
	// the node-name environment variable missing.
	CasePluginNotRunning Case = "N2-PluginNotRunning"
	// CaseNoAllocatable (case 3): the Pod runs but the kubelet reports no devices of the resource:
	// the plugin's socket folder is not the kubelet's, or the registration was lost.
	CaseNoAllocatable Case = "N3-NoAllocatable"
	// CaseNoAnnotation (case 4): the device count is there but the register annotation is
	// missing, malformed, empty or lists no healthy device; or the plugin may not patch nodes.
	CaseNoAnnotation Case = "N4-NoAnnotation"
	// CaseSchedulerExcludes (case 5): both are there but HAMi's scheduler does not take the node:
	// its --node-label-selector excludes it, no scheduler leads, or the handshake says so.
	CaseSchedulerExcludes Case = "N5-SchedulerExcludes"
)

// The pod cases, P1 to P8, and P0, the hand-over to the node diagnosis.
const (
	// P1NotRoutedToHAMi (S0): the pod is not scheduled by HAMi's scheduler: its
	// schedulerName is another's (the webhook is missing, excludes the pod or was skipped
	// with failurePolicy Ignore, or hami.io/webhook: ignore), or spec.nodeName was set at
	// creation; the default scheduler then places it and Allocate fails with "no binding pod
	// found on node".
	P1NotRoutedToHAMi Case = "P1-NotRoutedToHAMi"
	// P2SchedulerUnreachable (S0→S1): kube-scheduler cannot call the extender (no Ready
	// scheduler Pod, an expired Lease, an extender URL that does not match its port).
	P2SchedulerUnreachable Case = "P2-SchedulerUnreachable"
	// P3NoNodeFits (S1): the extender's filter found no node: FilteringFailed; the fit is
	// recomputed to name what is short and who holds it.
	P3NoNodeFits Case = "P3-NoNodeFits"
	// P4NodeLocked (S2): the bind fails with "node <n> has been locked within 5m0s": another
	// pod holds hami.io/mutex.lock on the node (stale when its holder is gone or done, or the
	// node's plugin never releases it).
	P4NodeLocked Case = "P4-NodeLocked"
	// P5AllocateNeverCame (S2, long): bound and allocating, but the device plugin's Allocate
	// never came: the node does not offer the device count, its plugin is not running, or
	// the node is NotReady.
	P5AllocateNeverCame Case = "P5-AllocateNeverCame"
	// P6AllocateFailed (S3): the kubelet failed the pod with UnexpectedAdmissionError: the
	// plugin's Allocate returned an error ("no binding pod found on node", "device request
	// not found", "device number not matched").
	P6AllocateFailed Case = "P6-AllocateFailed"
	// P7StaleAssignment (S1→S2): the filter's annotations name a node but the pod was never
	// bound, typically since the node restarted after the filter.
	P7StaleAssignment Case = "P7-StaleAssignment"
	// P8RunningWithoutLimits (S4): the pod runs, but its GPU memory limit is not enforced
	// (the node's plugin is not HAMi's or this SDK's, CUDA_DISABLE_CONTROL is set, the pod
	// never went through HAMi).
	P8RunningWithoutLimits Case = "P8-RunningWithoutLimits"
	// P0NodeNotRegistered means the pod is stopped before S1 without a FilteringFailed Event
	// and the node diagnosis of the candidate nodes finds them not registered with HAMi's
	// scheduler (node cases N1–N5); the report carries those diagnoses.
	P0NodeNotRegistered Case = "P0-NodeNotRegistered"
)

// caseWords names the node cases the way the guide does.
var caseWords = map[Case]string{
	CasePluginNotScheduled: "device plugin not scheduled on the node",
	CasePluginNotRunning:   "device plugin not running",
	CaseNoAllocatable:      "no allocatable devices",
	CaseNoAnnotation:       "register annotation missing or unusable",
	CaseSchedulerExcludes:  "scheduler does not take the node",
}

// Number is the case's letter and number, "N1" or "P3" ("" for Healthy and unknown codes).
func (c Case) Number() string {
	n, _, ok := strings.Cut(string(c), "-")
	if !ok {
		return ""
	}
	return n
}

// Name is the case's name without its number, "NoNodeFits" (the code itself when it has no
// number: "Healthy").
func (c Case) Name() string {
	if _, name, ok := strings.Cut(string(c), "-"); ok {
		return name
	}
	return string(c)
}

// Node reports whether c is a node case (N1–N5).
func (c Case) Node() bool { return strings.HasPrefix(string(c), "N") && c.Number() != "" }

// Short is how the doctor's tables show the case: "healthy", "case 1" for a node case as the
// guide calls it, "P3" for a pod case, "node" for P0NodeNotRegistered.
func (c Case) Short() string {
	switch {
	case c == Healthy:
		return "healthy"
	case c == P0NodeNotRegistered:
		return "node"
	case c.Node():
		return "case " + strings.TrimPrefix(c.Number(), "N")
	case c.Number() != "":
		return c.Number()
	}
	return string(c)
}

// Describe names the case in words: for a node case as the guide does ("case 1: device
// plugin not scheduled on the node"), "healthy", else the code.
func (c Case) Describe() string {
	if c == Healthy {
		return "healthy"
	}
	if w, ok := caseWords[c]; ok {
		return c.Short() + ": " + w
	}
	return string(c)
}

// String is the code.
func (c Case) String() string { return string(c) }

// rank orders the node cases as the guide walks them (Healthy first, unknown codes last).
func (c Case) rank() int {
	if c == Healthy {
		return 0
	}
	if n, err := strconv.Atoi(strings.TrimLeft(c.Number(), "NP")); err == nil && c.Number() != "" {
		return n
	}
	return math.MaxInt
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

// Finding is one thing found about a node or a pod on the way, with what shows it and how
// to fix it. [Report] and [PodReport] list the same type.
type Finding struct {
	// Case is the case this finding belongs to (Healthy for notes outside any case): a node
	// case in a Report, a pod case in a PodReport.
	Case Case `json:"case"`
	// Severity says whether the finding causes its case.
	Severity Severity `json:"severity"`
	// Code is a stable identifier of the finding to branch on, e.g. "NodeSelectorMismatch"
	// or "WebhookMissing"; see the Code… constants.
	Code string `json:"code"`
	// Summary is one sentence.
	Summary string `json:"summary"`
	// Evidence lists the observed facts behind the finding, each naming its object.
	Evidence []string `json:"evidence,omitempty"`
	// Fix lists commands (kubectl, helm) to run from a workstation, with the real names, in
	// order.
	Fix []string `json:"fix,omitempty"`
	// OnNode lists commands to run on the node itself for what the API server cannot show
	// (kubelet flags, containerd configuration, files under /var/lib/kubelet).
	OnNode []string `json:"onNode,omitempty"`
}

// withCase returns f with Healthy for an empty Case.
func (f Finding) withCase() Finding {
	if f.Case == "" {
		f.Case = Healthy
	}
	return f
}

// Stable node finding codes.
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
