package diagnose_test

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/nodelock"
)

// The pods of the bind-phase tests live in namespace "default" on node gpu-1.
const bindNS = "default"

// unixAgo is a Unix-seconds annotation value d before now.
func unixAgo(d time.Duration) string { return strconv.FormatInt(now.Add(-d).Unix(), 10) }

// lockAgo is a lock value of pod ("namespace/name", "" for a legacy lock) taken d before now.
func lockAgo(d time.Duration, pod string) string {
	ns, name, _ := strings.Cut(pod, "/")
	return nodelock.Lock{Time: now.Add(-d), Namespace: ns, Name: name}.String()
}

// readyNode is gpuNode with a Ready condition that turned True d before now, and the lock
// value lock ("" for none).
func readyNode(name string, readyFor time.Duration, lock string) corev1.Node {
	n := gpuNode(name)
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastTransitionTime: metav1.NewTime(now.Add(-readyFor))}}
	if lock != "" {
		n.Annotations[nodelock.Key] = lock
	}
	return *n
}

// gpuPodIn is a HAMi pod default/name asking count GPUs of 1000 MiB, with the annotations
// (key, value pairs).
func gpuPodIn(name string, count int, kv ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: bindNS, Name: name, UID: types.UID("uid-" + name), Annotations: map[string]string{}},
		Spec: corev1.PodSpec{SchedulerName: "hami-scheduler", Containers: []corev1.Container{{Name: "cuda", Image: "cuda:12",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				"nvidia.com/gpu":    *resource.NewQuantity(int64(count), resource.DecimalSI),
				"nvidia.com/gpumem": resource.MustParse("1000"),
			}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
	for i := 0; i+1 < len(kv); i += 2 {
		p.Annotations[kv[i]] = kv[i+1]
	}
	return p
}

// filtered is a pod HAMi's filter assigned to gpu-1 d before now (S1).
func filtered(name string, d time.Duration, kv ...string) *corev1.Pod {
	return gpuPodIn(name, 1, append([]string{
		"hami.io/vgpu-node", "gpu-1", "hami.io/vgpu-time", unixAgo(d),
		"hami.io/vgpu-devices-to-allocate", gpu0 + ",NVIDIA,1000,0:;", "hami.io/vgpu-devices-allocated", gpu0 + ",NVIDIA,1000,0:;",
	}, kv...)...)
}

// bound is filtered, bound to gpu-1 d before now (S2, allocating).
func bound(name string, d time.Duration, kv ...string) *corev1.Pod {
	p := filtered(name, d+time.Second, append([]string{"hami.io/bind-phase", "allocating", "hami.io/bind-time", unixAgo(d)}, kv...)...)
	p.Spec.NodeName = "gpu-1"
	return p
}

// withPhase sets the pod's phase and node.
func withPhase(p *corev1.Pod, phase corev1.PodPhase, node string) *corev1.Pod {
	p.Status.Phase, p.Spec.NodeName = phase, node
	return p
}

// admissionFailed is a pod the kubelet failed at admission with the plugin's error.
func admissionFailed(p *corev1.Pod, desc string) *corev1.Pod {
	p.Status.Phase = corev1.PodFailed
	p.Status.Reason = "UnexpectedAdmissionError"
	p.Status.Message = "Allocate failed due to rpc error: code = Unknown desc = " + desc + ", which is unexpected"
	return p
}

var gpu0 = gpus(1)[0].ID

// podEvent is a Warning Event on the pod default/train-1, d before now.
func podEvent(reason, msg string, d time.Duration) corev1.Event {
	const name = "train-1"
	return corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: bindNS, Name: name + "." + reason},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: bindNS, Name: name},
		Type:           corev1.EventTypeWarning, Reason: reason, Message: msg, LastTimestamp: metav1.NewTime(now.Add(-d)),
	}
}

// lockedEvent is HAMi's BindingFailed for the bind of train-1 that the lock of gpu-1 refused.
func lockedEvent() corev1.Event {
	return podEvent("BindingFailed",
		"Failed to bind node [gpu-1] to default/train-1: node gpu-1 has been locked within 5m0s", 20*time.Second)
}

// bindEvidence is the evidence around pod: nodes, the other pods, events, HAMi's plugin.
func bindEvidence(pod *corev1.Pod, nodes []corev1.Node, pods []*corev1.Pod, events ...corev1.Event) diagnose.PodEvidence {
	ev := diagnose.PodEvidence{Pod: pod, Nodes: nodes, Events: events, PluginDaemonSet: pluginDaemonSet(),
		PluginPods: []corev1.Pod{*runningPod("gpu-1")}, ReadErrors: map[string]error{}}
	for _, p := range pods {
		ev.Pods = append(ev.Pods, *p)
	}
	return ev
}

type bindCase struct {
	ev       diagnose.PodEvidence
	opts     func(*diagnose.Options)
	wantCase diagnose.Case
	// wantErrors are the codes of the error findings, in order; wantInfo a code that must be
	// there as info.
	wantErrors []string
	wantInfo   string
	// wantLock checks r.Lock (nil: no lock expected).
	wantLock func(*testing.T, *diagnose.LockState)
	// wantText are substrings of the findings' summaries, evidence and fixes (all of them).
	wantText []string
	// check checks anything else.
	check func(*testing.T, diagnose.PodReport)
	// anyCase skips the comparison of the case and the error codes (check does it).
	anyCase bool
}

func runBindCases(t *testing.T, tests map[string]bindCase) {
	t.Helper()
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			o := opts()
			if tc.opts != nil {
				tc.opts(&o)
			}
			r, err := diagnose.AnalyzePod(tc.ev, o)
			if err != nil {
				t.Fatalf("AnalyzePod: %v", err)
			}
			var errs []string
			var all strings.Builder
			for _, f := range r.Findings {
				if f.Severity == diagnose.SeverityError {
					errs = append(errs, f.Code)
				}
				all.WriteString(f.Summary + "\n" + strings.Join(f.Evidence, "\n") + "\n" + strings.Join(f.Fix, "\n") + "\n")
			}
			if !tc.anyCase && (r.Case != tc.wantCase || !slices.Equal(errs, tc.wantErrors)) {
				t.Errorf("case %v, errors %v; want %v, %v\n%s", r.Case, errs, tc.wantCase, tc.wantErrors, all.String())
			}
			if tc.wantInfo != "" && !slices.ContainsFunc(r.Findings, func(f diagnose.Finding) bool {
				return f.Code == tc.wantInfo && f.Severity == diagnose.SeverityInfo
			}) {
				t.Errorf("no info finding %s:\n%s", tc.wantInfo, all.String())
			}
			for _, s := range tc.wantText {
				if !strings.Contains(all.String(), s) {
					t.Errorf("findings lack %q:\n%s", s, all.String())
				}
			}
			switch {
			case tc.wantLock == nil && r.Lock != nil:
				t.Errorf("Lock = %+v, want none", r.Lock)
			case tc.wantLock != nil && r.Lock == nil:
				t.Errorf("Lock = nil, want one")
			case tc.wantLock != nil:
				tc.wantLock(t, r.Lock)
			}
			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

// lockIs checks the lock's holder, whether the holder exists, and that Stale contains stale
// ("" for a live lock).
func lockIs(holder string, exists bool, stale string) func(*testing.T, *diagnose.LockState) {
	return func(t *testing.T, l *diagnose.LockState) {
		t.Helper()
		if l.Node != "gpu-1" || l.Holder != holder || l.HolderExists != exists || (stale == "") != (l.Stale == "") || !strings.Contains(l.Stale, stale) {
			t.Errorf("Lock = %+v, want holder %q exists %v stale %q", l, holder, exists, stale)
		}
	}
}

func TestPodNodeLocked(t *testing.T) {
	t.Parallel()
	nodes := func(lock string) []corev1.Node {
		return []corev1.Node{readyNode("gpu-1", time.Hour, lock), readyNode("gpu-2", time.Hour, "")}
	}
	pod := func() *corev1.Pod { return filtered("train-1", 30*time.Second) }
	holderDone := withPhase(bound("holder", 2*time.Minute, "hami.io/bind-phase", "success"), corev1.PodRunning, "gpu-1")
	holderForeign := withPhase(bound("holder", 2*time.Minute), corev1.PodRunning, "gpu-1") // a plugin without the protocol
	holderLive := bound("holder", 10*time.Second)
	holderSlow := bound("holder", 3*time.Minute)
	holderElsewhere := withPhase(bound("holder", 2*time.Minute), corev1.PodRunning, "gpu-2")
	unlock := "kubectl hami-doctor unlock gpu-1 --yes"
	runBindCases(t, map[string]bindCase{
		"holder gone": {
			ev:       bindEvidence(pod(), nodes(lockAgo(time.Minute, "default/gone")), nil, lockedEvent()),
			wantCase: diagnose.P4NodeLocked, wantErrors: []string{diagnose.CodeNodeLocked, diagnose.CodeLockStale},
			wantLock: lockIs("default/gone", false, "no longer exists"),
			wantText: []string{unlock, "pod default/gone: does not exist", `node gpu-1: hami.io/mutex.lock = "2026-11-30T11:59:00Z,default,gone"`,
				"event BindingFailed", "takes over a lock whose pod is gone"},
		},
		"holder unknown: pods could not be read": {
			ev: func() diagnose.PodEvidence {
				ev := bindEvidence(pod(), nodes(lockAgo(time.Minute, "default/gone")), nil, lockedEvent())
				ev.ReadErrors["pods in every namespace (GPU usage, lock holders)"] = apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("no RBAC"))
				return ev
			}(),
			wantCase: diagnose.Healthy, wantInfo: diagnose.CodePodWaiting,
			wantLock: lockIs("default/gone", false, ""),
			wantText: []string{"pod default/gone: not known whether it exists", "could not be read"},
		},
		"holder on another node": {
			ev:       bindEvidence(pod(), nodes(lockAgo(time.Minute, "default/holder")), []*corev1.Pod{holderElsewhere}, lockedEvent()),
			wantCase: diagnose.P4NodeLocked, wantErrors: []string{diagnose.CodeNodeLocked, diagnose.CodeLockStale},
			wantLock: lockIs("default/holder", true, "runs on node gpu-2"),
			wantText: []string{unlock, "kubectl -n default delete pod holder", "or wait until 2026-11-30T12:04:00Z"},
		},
		"holder done: the plugin never releases": {
			ev:       bindEvidence(pod(), nodes(lockAgo(2*time.Minute, "default/holder")), []*corev1.Pod{holderDone}, lockedEvent()),
			wantCase: diagnose.P4NodeLocked, wantErrors: []string{diagnose.CodeNodeLocked, diagnose.CodeLockNeverReleased},
			wantLock: lockIs("default/holder", true, "bind-phase success"),
			wantText: []string{unlock, "kubectl -n kube-system edit daemonset hami-device-plugin", "image projecthami/hami:v2.9.0",
				"one GPU pod per node per 5m0s", "Pod kube-system/hami-device-plugin-gpu-1"},
			check: func(t *testing.T, r diagnose.PodReport) {
				t.Helper()
				if r.Lock.HolderBindPhase != "success" || r.Lock.HolderNode != "gpu-1" || r.Lock.Expired || r.Lock.AgeSeconds != 120 {
					t.Errorf("Lock = %+v", r.Lock)
				}
			},
		},
		"holder runs still allocating: a plugin without the protocol": {
			ev:       bindEvidence(pod(), nodes(lockAgo(2*time.Minute, "default/holder")), []*corev1.Pod{holderForeign}, lockedEvent()),
			wantCase: diagnose.P4NodeLocked, wantErrors: []string{diagnose.CodeNodeLocked, diagnose.CodeLockNeverReleased},
			wantLock: lockIs("default/holder", true, "does not implement HAMi's allocation protocol"),
		},
		"holder Failed": {
			ev: bindEvidence(pod(), nodes(lockAgo(time.Minute, "default/holder")),
				[]*corev1.Pod{admissionFailed(bound("holder", time.Minute), "no binding pod found on node gpu-1")}, lockedEvent()),
			wantCase: diagnose.P4NodeLocked, wantErrors: []string{diagnose.CodeNodeLocked, diagnose.CodeLockStale},
			wantLock: lockIs("default/holder", true, "has Failed"),
		},
		"an old refusal on another node": {
			ev: bindEvidence(pod(), nodes(""), nil, podEvent("BindingFailed",
				"Failed to bind node [gpu-2] to default/train-1: node gpu-2 has been locked within 5m0s", time.Minute)),
			wantCase: diagnose.Healthy, wantInfo: diagnose.CodePodWaiting,
			check: func(t *testing.T, r diagnose.PodReport) {
				t.Helper()
				if _, ok := r.Finding(diagnose.CodePodWaiting); !ok || strings.Contains(r.Reason, "lock") {
					t.Errorf("Reason = %q", r.Reason)
				}
			},
		},
		"live lock: waiting": {
			ev:       bindEvidence(pod(), nodes(lockAgo(10*time.Second, "default/holder")), []*corev1.Pod{holderLive}, lockedEvent()),
			wantCase: diagnose.Healthy, wantInfo: diagnose.CodePodWaiting,
			wantLock: lockIs("default/holder", true, ""),
			wantText: []string{"waiting for the node lock on gpu-1, held by pod default/holder for 10s", "2026-11-30T12:04:50Z"},
			check: func(t *testing.T, r diagnose.PodReport) {
				t.Helper()
				if !strings.Contains(r.Reason, "waiting for the node lock") {
					t.Errorf("Reason = %q", r.Reason)
				}
			},
		},
		"live lock whose holder's Allocate is late": {
			ev:       bindEvidence(pod(), nodes(lockAgo(3*time.Minute, "default/holder")), []*corev1.Pod{holderSlow}, lockedEvent()),
			wantCase: diagnose.Healthy, wantInfo: diagnose.CodePodWaiting,
			wantLock: lockIs("default/holder", true, ""),
			wantText: []string{"its Allocate is late", "kubectl hami-doctor pod default/holder"},
		},
		"expired lock": {
			ev:       bindEvidence(pod(), nodes(lockAgo(7*time.Minute, "default/holder")), []*corev1.Pod{bound("holder", 7*time.Minute)}, lockedEvent()),
			wantCase: diagnose.P4NodeLocked, wantErrors: []string{diagnose.CodeNodeLocked, diagnose.CodeLockStale},
			wantLock: func(t *testing.T, l *diagnose.LockState) {
				t.Helper()
				if !l.Expired || !strings.Contains(l.Stale, "7m0s old, older than the lock timeout 5m0s") || l.AgeSeconds != 420 {
					t.Errorf("Lock = %+v", l)
				}
			},
			wantText: []string{"the lock expired, HAMi's scheduler takes it over"},
		},
		"a shorter lock timeout": {
			ev:       bindEvidence(pod(), nodes(lockAgo(2*time.Minute, "default/holder")), []*corev1.Pod{bound("holder", 2*time.Minute)}, lockedEvent()),
			opts:     func(o *diagnose.Options) { o.LockTimeout = time.Minute; o.AllocateWait = 5 * time.Minute },
			wantCase: diagnose.P4NodeLocked, wantErrors: []string{diagnose.CodeNodeLocked, diagnose.CodeLockStale},
			wantLock: lockIs("default/holder", true, "older than the lock timeout 1m0s"),
		},
		"legacy value naming no pod": {
			ev:       bindEvidence(pod(), nodes(lockAgo(time.Minute, "")), nil, lockedEvent()),
			wantCase: diagnose.P4NodeLocked, wantErrors: []string{diagnose.CodeNodeLocked, diagnose.CodeLockStale},
			wantLock: lockIs("", false, "names no pod"),
			wantText: []string{"a lock that names no pod", "or wait until 2026-11-30T12:04:00Z"},
		},
		"malformed value": {
			ev:       bindEvidence(pod(), nodes("not-a-time,default"), nil, lockedEvent()),
			wantCase: diagnose.P4NodeLocked, wantErrors: []string{diagnose.CodeNodeLocked, diagnose.CodeLockStale},
			wantLock: func(t *testing.T, l *diagnose.LockState) {
				t.Helper()
				if l.Value != "not-a-time,default" || !strings.Contains(l.Error, "expected 3 parts, got 2") || l.Stale == "" || l.Holder != "" {
					t.Errorf("Lock = %+v", l)
				}
			},
			wantText: []string{unlock, "kubectl annotate node gpu-1 hami.io/mutex.lock-", "an unreadable value"},
		},
		"node named by kube-scheduler's event only": {
			ev: bindEvidence(gpuPodIn("train-1", 1), nodes(lockAgo(time.Minute, "default/gone")), nil,
				podEvent("FailedScheduling",
					`running Bind plugin "DefaultBinder": node gpu-1 has been locked within 5m0s`, 10*time.Second)),
			wantCase: diagnose.P4NodeLocked, wantErrors: []string{diagnose.CodeNodeLocked, diagnose.CodeLockStale},
			wantLock: lockIs("default/gone", false, "no longer exists"),
			wantText: []string{"event FailedScheduling"},
		},
		"refused earlier, unlocked now": {
			ev:       bindEvidence(pod(), nodes(""), nil, lockedEvent()),
			wantCase: diagnose.Healthy, wantInfo: diagnose.CodePodWaiting,
			wantText: []string{"the node is unlocked now: kube-scheduler retries the bind"},
		},
		"the pod's own lock": {
			ev:       bindEvidence(pod(), nodes(lockAgo(time.Second, "default/train-1")), nil),
			wantCase: diagnose.Healthy, wantInfo: diagnose.CodePodWaiting,
			wantLock: lockIs("default/train-1", true, ""),
			wantText: []string{"locked for this pod itself"},
		},
	})
}

func TestPodAllocateNeverCame(t *testing.T) {
	t.Parallel()
	noGPUs := readyNode("gpu-1", time.Hour, lockAgo(5*time.Minute, "default/train-1"))
	delete(noGPUs.Status.Allocatable, "nvidia.com/gpu")
	nodeReport := diagnose.Report{Node: "gpu-1", Case: diagnose.CaseNoAllocatable, Reason: "the kubelet reports no nvidia.com/gpu",
		Findings: []diagnose.Finding{{Case: diagnose.CaseNoAllocatable, Severity: diagnose.SeverityError, Code: diagnose.CodeNoAllocatable,
			Fix: []string{"kubectl -n kube-system delete pod hami-device-plugin-gpu-1"}}}}
	notReady := readyNode("gpu-1", time.Minute, "")
	notReady.Status.Conditions[0].Status, notReady.Status.Conditions[0].Reason = corev1.ConditionFalse, "NodeStatusUnknown"
	runBindCases(t, map[string]bindCase{
		"late, the plugin is not registered": {
			ev: func() diagnose.PodEvidence {
				ev := bindEvidence(bound("train-1", 5*time.Minute), []corev1.Node{noGPUs}, nil)
				ev.NodeReports = []diagnose.Report{nodeReport}
				return ev
			}(),
			wantCase: diagnose.P5AllocateNeverCame, wantErrors: []string{diagnose.CodeAllocateLate},
			wantLock: lockIs("default/train-1", true, ""),
			wantText: []string{"bound to node gpu-1 5m0s ago", "node gpu-1: no allocatable nvidia.com/gpu", "node gpu-1: Ready=True",
				"node diagnosis case 3", "kubectl -n kube-system delete pod hami-device-plugin-gpu-1", "the kubelet retries the pod's admission once the plugin registers"},
			check: func(t *testing.T, r diagnose.PodReport) {
				t.Helper()
				if len(r.Nodes) != 1 || r.Nodes[0].Node != "gpu-1" || r.Stage != diagnose.StageBound {
					t.Errorf("Nodes = %+v, stage %v", r.Nodes, r.Stage)
				}
			},
		},
		"late, the node is NotReady": {
			ev:       bindEvidence(bound("train-1", 2*time.Minute), []corev1.Node{notReady}, nil),
			wantCase: diagnose.P5AllocateNeverCame, wantErrors: []string{diagnose.CodeAllocateLate},
			wantText: []string{"node gpu-1: Ready=False since 2026-11-30T11:59:00Z (NodeStatusUnknown)", "allocatable nvidia.com/gpu = 80"},
		},
		"young: waiting": {
			ev:       bindEvidence(bound("train-1", 12*time.Second), []corev1.Node{noGPUs}, nil),
			wantCase: diagnose.Healthy, wantInfo: diagnose.CodePodWaiting,
			wantLock: lockIs("default/train-1", true, ""),
			check: func(t *testing.T, r diagnose.PodReport) {
				t.Helper()
				if !strings.Contains(r.Reason, "bound 12s ago; waiting for the kubelet's Allocate") {
					t.Errorf("Reason = %q", r.Reason)
				}
			},
		},
		"a longer wait": {
			ev:       bindEvidence(bound("train-1", 2*time.Minute), []corev1.Node{noGPUs}, nil),
			opts:     func(o *diagnose.Options) { o.AllocateWait = 3 * time.Minute },
			wantCase: diagnose.Healthy, wantInfo: diagnose.CodePodWaiting,
			wantLock: lockIs("default/train-1", true, ""),
		},
	})
}

func TestPodAllocateFailed(t *testing.T) {
	t.Parallel()
	node := []corev1.Node{readyNode("gpu-1", time.Hour, "")}
	recreate := "kubectl -n default get pod train-1 -o json | jq"
	twoAsked := bound("train-1", time.Minute, "hami.io/vgpu-devices-to-allocate", gpu0+",NVIDIA,1000,0:;")
	twoAsked.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"] = resource.MustParse("2")
	notHAMi := withPhase(gpuPodIn("train-1", 1), corev1.PodPending, "gpu-1")
	notHAMi.Spec.SchedulerName = "default-scheduler"
	pendingFailed := bound("train-1", time.Minute, "hami.io/bind-phase", "failed")
	runBindCases(t, map[string]bindCase{
		"no binding pod found: the lock expired": {
			ev:       bindEvidence(admissionFailed(bound("train-1", 10*time.Minute), "no binding pod found on node gpu-1"), node, nil),
			wantCase: diagnose.P6AllocateFailed, wantErrors: []string{diagnose.CodeNoBindingPod},
			wantText: []string{"found no lock and no pending HAMi pod", "node gpu-1: no hami.io/mutex.lock now", "node gpu-1: no other Pending pod bound by HAMi now",
				"status.reason UnexpectedAdmissionError: Allocate failed due to rpc error", recreate, "never retried"},
		},
		"no binding pod found: not HAMi's pod": {
			ev: bindEvidence(admissionFailed(notHAMi, "no binding pod found on node gpu-1"), node, nil),
			// checkRouting makes it P1, and then this finding is info only; P6 without it.
			anyCase:  true,
			wantText: []string{"never went through HAMi's scheduler (P1)", `schedulerName "default-scheduler"`},
			check: func(t *testing.T, r diagnose.PodReport) {
				t.Helper()
				f, ok := r.Finding(diagnose.CodeNoBindingPod)
				switch {
				case !ok:
					t.Errorf("no %s finding", diagnose.CodeNoBindingPod)
				case r.Case == diagnose.P1NotRoutedToHAMi && f.Severity != diagnose.SeverityInfo:
					t.Errorf("P1 and %s as %s, want info", f.Code, f.Severity)
				case r.Case != diagnose.P1NotRoutedToHAMi && (r.Case != diagnose.P6AllocateFailed || f.Severity != diagnose.SeverityError):
					t.Errorf("case %v, %s %s; want P1, or P6 with an error", r.Case, f.Code, f.Severity)
				}
			},
		},
		"device request not found: consumed by another pod": {
			ev: bindEvidence(admissionFailed(bound("train-1", time.Minute, "hami.io/vgpu-devices-to-allocate", ";"), "device request not found"), node, nil,
				podEvent("AllocateFailed", "plugin: device request not found", time.Minute)),
			wantCase: diagnose.P6AllocateFailed, wantErrors: []string{diagnose.CodeRequestNotFound},
			wantText: []string{"#781/#3076", `hami.io/vgpu-devices-to-allocate = ";"`, `event Warning AllocateFailed`, recreate},
		},
		"device request not found: entry missing": {
			ev: bindEvidence(admissionFailed(func() *corev1.Pod {
				p := bound("train-1", time.Minute)
				delete(p.Annotations, "hami.io/vgpu-devices-to-allocate")
				return p
			}(), "device request not found"), node, nil),
			wantCase: diagnose.P6AllocateFailed, wantErrors: []string{diagnose.CodeRequestNotFound},
			wantText: []string{"hami.io/vgpu-devices-to-allocate is missing"},
		},
		"device request not found: malformed entry": {
			ev:       bindEvidence(admissionFailed(bound("train-1", time.Minute, "hami.io/vgpu-devices-to-allocate", "GPU-x,NVIDIA:;"), "no pending device allocation found"), node, nil),
			wantCase: diagnose.P6AllocateFailed, wantErrors: []string{diagnose.CodeRequestNotFound},
			wantText: []string{"does not decode"},
		},
		"device number not matched": {
			ev:       bindEvidence(admissionFailed(twoAsked, "device number not matched"), node, nil),
			wantCase: diagnose.P6AllocateFailed, wantErrors: []string{diagnose.CodeNumberMismatch},
			wantText: []string{"the kubelet asked for 2 device(s) for container cuda, but its entry in hami.io/vgpu-devices-to-allocate has 1",
				"container cuda has limit nvidia.com/gpu: 2", "entry 0 (container cuda) has 1 device(s): " + gpu0},
		},
		"another error, quoted": {
			ev:       bindEvidence(admissionFailed(bound("train-1", time.Minute), "create cache file: permission denied"), node, nil),
			wantCase: diagnose.P6AllocateFailed, wantErrors: []string{diagnose.CodeAllocateFailed},
			wantText: []string{"the device plugin's Allocate failed: create cache file: permission denied; a failed", recreate},
		},
		"bind-phase failed, not yet Failed": {
			ev: bindEvidence(pendingFailed, node, nil, podEvent("UnexpectedAdmissionError",
				"Allocate failed due to rpc error: code = Unknown desc = device number not matched", 30*time.Second)),
			wantCase: diagnose.P6AllocateFailed, wantErrors: []string{diagnose.CodeNumberMismatch},
			wantText: []string{"event UnexpectedAdmissionError", "hami.io/bind-phase failed"},
		},
		"bind-phase failed without a message": {
			ev:       bindEvidence(bound("train-1", time.Minute, "hami.io/bind-phase", "failed"), node, nil),
			wantCase: diagnose.P6AllocateFailed, wantErrors: []string{diagnose.CodeAllocateFailed},
			wantText: []string{"its error is not recorded on the pod"},
		},
		"failed for another reason": {
			ev: bindEvidence(func() *corev1.Pod {
				p := withPhase(bound("train-1", time.Hour, "hami.io/bind-phase", "success"), corev1.PodFailed, "gpu-1")
				p.Status.Reason = "Evicted"
				return p
			}(), node, nil),
			wantCase: diagnose.Healthy, wantInfo: diagnose.CodePodWaiting,
			wantText: []string{"not at the admission of its devices"},
		},
	})
}

func TestPodStaleAssignment(t *testing.T) {
	t.Parallel()
	clear := "kubectl -n default annotate pod train-1 hami.io/vgpu-node- hami.io/vgpu-time- hami.io/vgpu-devices-to-allocate- hami.io/vgpu-devices-allocated- hami.io/bind-phase- hami.io/bind-time-"
	runBindCases(t, map[string]bindCase{
		"node restarted after the filter": {
			ev:       bindEvidence(filtered("train-1", 10*time.Minute), []corev1.Node{readyNode("gpu-1", 5*time.Minute, "")}, nil),
			wantCase: diagnose.P7StaleAssignment, wantErrors: []string{diagnose.CodeNodeRestarted},
			wantText: []string{clear, "kube-scheduler retries the Pending pod and HAMi's extender filters it again", "node gpu-1: Ready=True since 2026-11-30T11:55:00Z",
				"node gpu-1: no hami.io/mutex.lock", "kubectl -n default get pod train-1 -o json", "5m0s after HAMi's filter", "(10m0s ago)"},
		},
		"never bound": {
			ev:       bindEvidence(filtered("train-1", 10*time.Minute), []corev1.Node{readyNode("gpu-1", time.Hour, "")}, nil),
			wantCase: diagnose.P7StaleAssignment, wantErrors: []string{diagnose.CodeStaleAssignment},
			wantText: []string{clear, "never bound"},
		},
		"allocating with an old bind-time, never bound": {
			ev: bindEvidence(filtered("train-1", 10*time.Minute, "hami.io/bind-phase", "allocating", "hami.io/bind-time", unixAgo(9*time.Minute)),
				[]corev1.Node{readyNode("gpu-1", time.Hour, "")}, nil),
			wantCase: diagnose.P7StaleAssignment, wantErrors: []string{diagnose.CodeStaleAssignment},
			wantText: []string{`hami.io/bind-phase "allocating", hami.io/bind-time`},
		},
		"recent bind-time: waiting": {
			ev: bindEvidence(filtered("train-1", 10*time.Minute, "hami.io/bind-phase", "allocating", "hami.io/bind-time", unixAgo(5*time.Second)),
				[]corev1.Node{readyNode("gpu-1", time.Hour, "")}, nil),
			wantCase: diagnose.Healthy, wantInfo: diagnose.CodePodWaiting,
		},
		"young: waiting for the bind": {
			ev:       bindEvidence(filtered("train-1", 10*time.Second), []corev1.Node{readyNode("gpu-1", time.Hour, "")}, nil),
			wantCase: diagnose.Healthy, wantInfo: diagnose.CodePodWaiting,
			wantText: []string{"filtered to node gpu-1 10s ago; waiting for the bind"},
		},
		"node gone": {
			ev:       bindEvidence(filtered("train-1", 10*time.Minute), []corev1.Node{readyNode("gpu-2", time.Hour, "")}, nil),
			wantCase: diagnose.P7StaleAssignment, wantErrors: []string{diagnose.CodeStaleAssignment},
			wantText: []string{"node gpu-1, which no longer exists", "node gpu-1: not found"},
		},
		"a stale lock is P4, not P7": {
			ev: bindEvidence(filtered("train-1", 10*time.Minute), []corev1.Node{readyNode("gpu-1", time.Hour, lockAgo(time.Minute, "default/gone"))}, nil,
				lockedEvent()),
			wantCase: diagnose.P4NodeLocked, wantErrors: []string{diagnose.CodeNodeLocked, diagnose.CodeLockStale},
			wantLock: lockIs("default/gone", false, "no longer exists"),
		},
	})
}

// FuzzPodBind: whatever the node lock, the pod's HAMi annotations and the kubelet's message
// hold, AnalyzePod returns a report whose error findings each say what to do, and Case is
// set exactly when there is one.
func FuzzPodBind(f *testing.F) {
	f.Add(lockAgo(time.Minute, "default/gone"), gpu0+",NVIDIA,1000,0:;", "allocating", "1764503940", "", uint8(0))
	f.Add("not-a-time,default", ";", "failed", "x", "device request not found", uint8(1))
	f.Add("2026-11-30T11:59:00Z", "GPU-x,NVIDIA:;", "success", "-1", "device number not matched", uint8(2))
	f.Add(",,", "", "", "99999999999999999999", "no binding pod found on node gpu-1", uint8(3))
	f.Fuzz(func(t *testing.T, lock, toAllocate, phase, unix, message string, shape uint8) {
		p := filtered("train-1", time.Minute, "hami.io/vgpu-devices-to-allocate", toAllocate, "hami.io/bind-phase", phase,
			"hami.io/bind-time", unix, "hami.io/vgpu-time", unix)
		switch shape % 4 {
		case 1:
			p.Spec.NodeName = "gpu-1"
		case 2:
			p = admissionFailed(p, message)
		case 3:
			p.Annotations = map[string]string{"hami.io/mutex.lock": lock}
		}
		holder := bound("gone", time.Minute, "hami.io/bind-phase", phase)
		ev := bindEvidence(p, []corev1.Node{readyNode("gpu-1", time.Hour, lock)}, []*corev1.Pod{holder},
			podEvent("BindingFailed", message+" node gpu-1 has been locked within 5m0s", time.Second))
		r, err := diagnose.AnalyzePod(ev, opts())
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range r.Errors() {
			if f.Summary == "" || len(f.Fix) == 0 {
				t.Fatalf("error finding without summary or fix: %+v", f)
			}
		}
		if (r.Case == diagnose.Healthy) != (len(r.Errors()) == 0) {
			t.Fatalf("case %v with %d errors", r.Case, len(r.Errors()))
		}
	})
}
