package diagnose_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/handshake"
)

// The GPUs of the fit tests: two nodes with two 40000 MiB GPUs each.
const (
	fitGPU1A = "GPU-1a000000-0000-0000-0000-000000000000"
	fitGPU1B = "GPU-1b000000-0000-0000-0000-000000000000"
	fitGPU2C = "GPU-2c000000-0000-0000-0000-000000000000"
	fitGPU2D = "GPU-2d000000-0000-0000-0000-000000000000"
)

func fitGPU(id string, index uint, numa int) annotation.Device {
	return annotation.Device{ID: id, Index: index, Count: 10, Devmem: 40000, Devcore: 100,
		Type: "NVIDIA A100-SXM4-40GB", Numa: numa, Mode: "hami-core", Health: true}
}

func fitNode(name string, devs ...annotation.Device) corev1.Node {
	q := resource.MustParse(fmt.Sprint(10 * len(devs)))
	return corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"gpu": "on"},
			Annotations: map[string]string{
				annotation.KeyNVIDIARegister:  annotation.Encode(devs),
				annotation.KeyNVIDIAHandshake: handshake.Requesting(now.Add(-10*time.Second), time.UTC),
			}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{annotation.ResourceNVIDIAGPU: q}},
	}
}

// fitPod is the pending pod ml/train asking count GPUs of mem MiB each.
func fitPod(count, mem int, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ml", UID: "uid-train", Annotations: annotations},
		Spec: corev1.PodSpec{SchedulerName: "hami-scheduler", Containers: []corev1.Container{{Name: "cuda",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				"nvidia.com/gpu":    resource.MustParse(fmt.Sprint(count)),
				"nvidia.com/gpumem": resource.MustParse(fmt.Sprint(mem)),
			}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
}

// fitHolder is a running pod ml/name holding mem MiB of the GPU uuid on node.
func fitHolder(name, node, uuid string, mem int32) corev1.Pod {
	pd := allocation.PodDevices{{{UUID: uuid, Type: "NVIDIA", Usedmem: mem}}}
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml", Annotations: map[string]string{
			allocation.KeyNode: node, allocation.KeyBindPhase: "success",
			annotation.KeyNVIDIAAllocated: allocation.EncodePodDevices(pd)}},
		Spec: corev1.PodSpec{NodeName: node, SchedulerName: "hami-scheduler", Containers: []corev1.Container{{Name: "cuda",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				"nvidia.com/gpu": resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse(fmt.Sprint(mem))}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

// fitSchedulerPod is HAMi's scheduler Pod, Running and Ready.
func fitSchedulerPod() corev1.Pod {
	p := *schedulerPod()
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	return p
}

func fitEvent(reason, message string, at time.Time) corev1.Event {
	return corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("train.%x", len(message)), Namespace: "ml"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "ml", Name: "train", UID: "uid-train"},
		Reason:         reason, Message: message, Type: corev1.EventTypeWarning, Count: 3,
		Source:        corev1.EventSource{Component: "hami-scheduler"},
		LastTimestamp: metav1.NewTime(at), FirstTimestamp: metav1.NewTime(at.Add(-time.Minute))}
}

// fitFailed are the FilteringFailed Events of one failed filter 30 s ago.
func fitFailed(messages ...string) []corev1.Event {
	var out []corev1.Event
	for _, m := range messages {
		out = append(out, fitEvent("FilteringFailed", m, now.Add(-30*time.Second)))
	}
	return out
}

// fitEvidence is the memory shortage: gpu-1's GPUs hold 20000 MiB each (pods a, b), gpu-2 has
// GPU C idle and GPU D with 25000 MiB held by pods c and d.
func fitEvidence(pod *corev1.Pod, events ...corev1.Event) diagnose.PodEvidence {
	return diagnose.PodEvidence{
		Pod:    pod,
		Events: events,
		Nodes: []corev1.Node{
			fitNode("gpu-2", fitGPU(fitGPU2C, 0, 0), fitGPU(fitGPU2D, 1, 1)),
			fitNode("gpu-1", fitGPU(fitGPU1A, 0, 0), fitGPU(fitGPU1B, 1, 0)),
		},
		Pods: []corev1.Pod{
			fitHolder("a", "gpu-1", fitGPU1A, 20000),
			fitHolder("b", "gpu-1", fitGPU1B, 20000),
			fitHolder("c", "gpu-2", fitGPU2D, 15000),
			fitHolder("d", "gpu-2", fitGPU2D, 10000),
		},
		Scheduler:     schedulerDeployment(),
		SchedulerPods: []corev1.Pod{fitSchedulerPod()},
		Lease:         lease("hami-scheduler-7d9f8b6c5-x2x4q_2b1c0f7e-5f1d-4e7a-9a57-0c3f1f0b6d11", now.Add(-2*time.Second)),
	}
}

const (
	fitMemEvent     = "2 nodes CardInsufficientMemory(gpu-1,gpu-2)"
	fitCardsEvent   = "1 nodes AllocatedCardsInsufficientRequest(gpu-2)"
	fitSummaryEvent = "no available node, 2 nodes do not meet"
)

type fitWant struct {
	// caseCode is the report's case; first the code and severity of the first finding of
	// the case P3.
	caseCode diagnose.Case
	first    string
	severity diagnose.Severity
	// summary, evidence and fix are substrings of the first P3 finding's lines.
	summary  string
	evidence []string
	absent   []string
	fix      []string
	// codes are further P3 findings expected (by code).
	codes []string
	// shortage, reasons and fits are the FitExplanation's.
	shortage string
	reasons  map[string]int
	fits     string
}

func TestAnalyzePodFit(t *testing.T) {
	memShort := fitWant{
		caseCode: diagnose.P3NoNodeFits, first: diagnose.CodeFitShort, severity: diagnose.SeverityError,
		shortage: "2 × 30000 MiB asked; the best node gpu-2 has one GPU with ≥ 30000 MiB free; " + fitGPU2D + " is held by pods ml/c, ml/d",
		summary:  "no node fits the pod: 2 × 30000 MiB asked; the best node gpu-2",
		reasons:  map[string]int{"AllocatedCardsInsufficientRequest": 1, "CardInsufficientMemory": 2},
		evidence: []string{
			`pod ml/train asks cuda: 2 GPU × 30000 MiB, 0 % cores`,
			`pod ml/train: Event FilteringFailed from hami-scheduler at 2026-11-30T11:59:30Z, 3 times: "` + fitMemEvent + `"`,
			`"` + fitSummaryEvent + `"`,
			`recomputed now: 2 of 2 candidate nodes do not fit: 1 nodes AllocatedCardsInsufficientRequest(gpu-2), 2 nodes CardInsufficientMemory(gpu-1,gpu-2)`,
			`node gpu-1: 2/2 CardInsufficientMemory; no GPU with ≥ 30000 MiB free`,
			`node gpu-2: 1/2 AllocatedCardsInsufficientRequest, 1/2 CardInsufficientMemory; one GPU with ≥ 30000 MiB free`,
		},
		fix: []string{
			"kubectl -n ml delete pod c    # frees its share of " + fitGPU2D + " on node gpu-2",
			"kubectl -n ml delete pod d",
			`.spec.containers[0].resources.limits["nvidia.com/gpumem"]="15000"`,
		},
		absent: []string{"disagree"},
	}
	v290 := memShort
	v290.evidence = append(slices.Clone(memShort.evidence), `Event FailedScheduling from default-scheduler at 2026-11-30T11:59:30Z, 3 times: "0/2 nodes are available: 2 NodeUnfitPod. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod."`,
		`"NodeUnfitPod" is HAMi v2.9.0's word for any registered node that does not fit`)
	garbled := memShort
	garbled.evidence = append(slices.Clone(memShort.evidence), "node gpu-3: not a candidate: decode hami.io/node-nvidia-register: annotation malformed")

	tests := []struct {
		name string
		ev   func() diagnose.PodEvidence
		opts func(*diagnose.Options)
		want fitWant
	}{{
		name: "memory short, holders named",
		ev: func() diagnose.PodEvidence {
			return fitEvidence(fitPod(2, 30000, nil), fitFailed(fitCardsEvent, fitMemEvent, fitSummaryEvent)...)
		},
		want: memShort,
	}, {
		name: "v2.9.0 wording",
		ev: func() diagnose.PodEvidence {
			ev := fitEvidence(fitPod(2, 30000, nil), fitFailed(fitCardsEvent, fitMemEvent, fitSummaryEvent)...)
			fs := fitEvent("FailedScheduling", "0/2 nodes are available: 2 NodeUnfitPod. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod.", now.Add(-30*time.Second))
			fs.Source.Component = "default-scheduler"
			ev.Events = append(ev.Events, fs)
			return ev
		},
		opts: func(o *diagnose.Options) { o.HAMiVersion = handshake.VersionV290 },
		want: v290,
	}, {
		name: "garbled register annotation skipped",
		ev: func() diagnose.PodEvidence {
			ev := fitEvidence(fitPod(2, 30000, nil), fitFailed(fitCardsEvent, fitMemEvent, fitSummaryEvent)...)
			bad := fitNode("gpu-3", fitGPU("GPU-3", 0, 0))
			bad.Annotations[annotation.KeyNVIDIARegister] = `[{"id":"GPU-3","count":`
			ev.Nodes = append(ev.Nodes, bad)
			return ev
		},
		want: garbled,
	}, {
		name: "type selector matches no GPU",
		ev: func() diagnose.PodEvidence {
			return fitEvidence(fitPod(1, 1000, map[string]string{"nvidia.com/use-gputype": "H100"}),
				fitFailed("2 nodes CardTypeMismatch(gpu-1,gpu-2)", fitSummaryEvent)...)
		},
		want: fitWant{
			caseCode: diagnose.P3NoNodeFits, first: diagnose.CodeTypeSelector, severity: diagnose.SeverityError,
			summary:  `the pod's nvidia.com/use-gputype "H100" matches no GPU type of the candidate nodes, which have NVIDIA A100-SXM4-40GB (gpu-1, gpu-2)`,
			evidence: []string{`pod ml/train: nvidia.com/use-gputype = "H100"`},
			fix: []string{"kubectl -n ml annotate pod train nvidia.com/use-gputype-",
				"kubectl -n ml annotate pod train --overwrite 'nvidia.com/use-gputype=NVIDIA A100-SXM4-40GB'"},
			codes:    []string{diagnose.CodeFitShort},
			shortage: "1 × 1000 MiB asked; the best node gpu-1 has 2 GPUs with ≥ 1000 MiB free, but it fails with 2/2 CardTypeMismatch",
			reasons:  map[string]int{"CardTypeMismatch": 2},
		},
	}, {
		name: "UUID selector names no candidate GPU",
		ev: func() diagnose.PodEvidence {
			return fitEvidence(fitPod(1, 1000, map[string]string{"nvidia.com/use-gpuuuid": "GPU-ffffffff"}),
				fitFailed("2 nodes CardUuidMismatch(gpu-1,gpu-2)", fitSummaryEvent)...)
		},
		want: fitWant{
			caseCode: diagnose.P3NoNodeFits, first: diagnose.CodeUUIDSelector, severity: diagnose.SeverityError,
			summary:  `the pod's nvidia.com/use-gpuuuid "GPU-ffffffff" names no GPU of a candidate node`,
			evidence: []string{`pod ml/train: nvidia.com/use-gpuuuid = "GPU-ffffffff"`, "on no candidate node: GPU-ffffffff"},
			fix:      []string{"kubectl -n ml annotate pod train nvidia.com/use-gpuuuid-"},
			codes:    []string{diagnose.CodeFitShort},
			shortage: "1 × 1000 MiB asked; the best node gpu-1 has 2 GPUs with ≥ 1000 MiB free, but it fails with 2/2 CardUuidMismatch",
			reasons:  map[string]int{"CardUuidMismatch": 2},
		},
	}, {
		name: "namespace quota on GPU memory",
		ev: func() diagnose.PodEvidence {
			ev := fitEvidence(fitPod(1, 30000, nil), fitFailed("2 nodes ResourceQuotaNotFit(gpu-1,gpu-2)", fitSummaryEvent)...)
			ev.Quotas = []corev1.ResourceQuota{{ObjectMeta: metav1.ObjectMeta{Name: "gpu-quota", Namespace: "ml"},
				Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"limits.nvidia.com/gpumem": resource.MustParse("80000")}}}}
			return ev
		},
		want: fitWant{
			caseCode: diagnose.P3NoNodeFits, first: diagnose.CodeQuotaExceeded, severity: diagnose.SeverityError,
			summary: "ResourceQuota ml/gpu-quota allows limits.nvidia.com/gpumem 80000; the namespace's other pods hold 65000 MiB and the pod asks 30000 MiB",
			evidence: []string{`resourcequota ml/gpu-quota: spec.hard["limits.nvidia.com/gpumem"] = 80000`,
				"namespace ml: pods holding GPU quota: ml/a 20000 MiB, 0 % cores; ml/b 20000 MiB, 0 % cores; ml/c 15000 MiB"},
			fix: []string{`kubectl -n ml patch resourcequota gpu-quota --type merge -p '{"spec":{"hard":{"limits.nvidia.com/gpumem":"95000"}}}'`,
				"kubectl -n ml delete pod a    # or free the 20000 MiB, 0 % cores of the quota it holds"},
			codes:    []string{diagnose.CodeFitShort},
			shortage: "1 × 30000 MiB asked; the best node gpu-2 has one GPU with ≥ 30000 MiB free, but it fails with 2/2 ResourceQuotaNotFit",
			reasons:  map[string]int{"ResourceQuotaNotFit": 2},
		},
	}, {
		name: "NUMA binding",
		ev: func() diagnose.PodEvidence {
			ev := fitEvidence(fitPod(2, 10000, map[string]string{"nvidia.com/numa-bind": "true"}),
				fitFailed("1 nodes AllocatedCardsInsufficientRequest(gpu-n)", "1 nodes NumaNotFit(gpu-n)", "no available node, 1 nodes do not meet")...)
			ev.Nodes = []corev1.Node{fitNode("gpu-n", fitGPU(fitGPU2C, 0, 0), fitGPU(fitGPU2D, 1, 1))}
			ev.Pods = nil
			return ev
		},
		want: fitWant{
			caseCode: diagnose.P3NoNodeFits, first: diagnose.CodeNUMABind, severity: diagnose.SeverityError,
			summary:  "the pod's nvidia.com/numa-bind=true puts the 2 GPUs of a container on one NUMA node; the best is node gpu-n NUMA 0, which has one GPU with ≥ 10000 MiB free",
			evidence: []string{`pod ml/train: nvidia.com/numa-bind = "true"`},
			fix:      []string{"kubectl -n ml annotate pod train nvidia.com/numa-bind-"},
			codes:    []string{diagnose.CodeFitShort},
			shortage: "2 × 10000 MiB asked; the best node gpu-n has 2 GPUs with ≥ 10000 MiB free, but it fails with 1/2 AllocatedCardsInsufficientRequest, 1/2 NumaNotFit",
			reasons:  map[string]int{"AllocatedCardsInsufficientRequest": 1, "NumaNotFit": 1},
		},
	}, {
		name: "fits now: the holders left after the filter",
		ev: func() diagnose.PodEvidence {
			ev := fitEvidence(fitPod(2, 30000, nil), fitFailed(fitCardsEvent, fitMemEvent, fitSummaryEvent)...)
			ev.Pods = ev.Pods[:2] // ml/c and ml/d were deleted since
			return ev
		},
		want: fitWant{
			caseCode: diagnose.Healthy, first: diagnose.CodeFitChanged, severity: diagnose.SeverityWarning,
			summary: "the extender found no node at 2026-11-30T11:59:30Z, but node gpu-2 fits the pod now",
			evidence: []string{"the Events and the recomputed fit disagree (2 nodes do not meet in the Events, 1 now; " +
				"AllocatedCardsInsufficientRequest: 1 in the Events, 0 now; CardInsufficientMemory: 2 in the Events, 1 now)"},
			fix:     []string{"kubectl -n ml get pod train -w"},
			reasons: map[string]int{"CardInsufficientMemory": 1},
			fits:    "gpu-2",
		},
	}, {
		name: "init container: the largest container is named",
		ev: func() diagnose.PodEvidence {
			p := fitPod(2, 30000, nil)
			p.Spec.InitContainers = []corev1.Container{{Name: "warmup", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				"nvidia.com/gpu": resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse("1000")}}}}
			return fitEvidence(p, fitFailed(fitCardsEvent, fitMemEvent, fitSummaryEvent)...)
		},
		want: func() fitWant {
			w := memShort
			w.evidence = []string{"pod ml/train asks warmup: 1 GPU × 1000 MiB, 0 % cores", "pod ml/train asks cuda: 2 GPU × 30000 MiB, 0 % cores"}
			w.fix = []string{`.spec.containers[0].resources.limits["nvidia.com/gpumem"]="15000"`}
			return w
		}(),
	}, {
		name: "the extender reads no request",
		ev: func() diagnose.PodEvidence {
			return fitEvidence(fitPod(1, 1000, nil), fitFailed("does not request any resource")...)
		},
		want: fitWant{
			caseCode: diagnose.P3NoNodeFits, first: diagnose.CodeFitShort, severity: diagnose.SeverityError,
			summary:  `the extender says the pod "does not request any resource", though it asks cuda: 1 GPU × 1000 MiB, 0 % cores`,
			evidence: []string{`Event FilteringFailed from hami-scheduler at 2026-11-30T11:59:30Z, 3 times: "does not request any resource"`},
			fix:      []string{"kubectl -n kube-system get deployment hami-scheduler -o yaml"},
			fits:     "gpu-1", // binpack: the busier node
		},
	}, {
		name: "memory percentage; a holder with a malformed device list holds nothing",
		ev: func() diagnose.PodEvidence {
			p := fitPod(2, 0, nil)
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{
				"nvidia.com/gpu": resource.MustParse("2"), "nvidia.com/gpumem-percentage": resource.MustParse("80")}
			ev := fitEvidence(p, fitFailed(fitCardsEvent, fitMemEvent, fitSummaryEvent)...)
			bad := fitHolder("e", "gpu-2", fitGPU2C, 1)
			bad.Annotations[annotation.KeyNVIDIAAllocated] = "GPU-2c,NVIDIA,notanumber"
			ev.Pods = append(ev.Pods, bad)
			return ev
		},
		want: fitWant{
			caseCode: diagnose.P3NoNodeFits, first: diagnose.CodeFitShort, severity: diagnose.SeverityError,
			summary:  "no node fits the pod: 2 × 80 % of a GPU's memory asked",
			evidence: []string{"pod ml/train asks cuda: 2 GPU × 80 % memory, 0 % cores"},
			fix:      []string{"kubectl -n ml delete pod c", "kubectl -n ml delete pod d"},
			shortage: "2 × 80 % of a GPU's memory asked; the best node gpu-2 has one GPU with ≥ 80 % of its memory free; " + fitGPU2D + " is held by pods ml/c, ml/d",
			reasons:  memShort.reasons,
		},
	}, {
		name: "no FilteringFailed yet",
		ev:   func() diagnose.PodEvidence { return fitEvidence(fitPod(2, 30000, nil)) },
		want: fitWant{
			caseCode: diagnose.Healthy, first: diagnose.CodeFitShort, severity: diagnose.SeverityWarning,
			summary:  "the extender has not said so yet (no FilteringFailed Event)",
			evidence: []string{"recomputed now: 2 of 2 candidate nodes do not fit"},
			absent:   []string{"Event FilteringFailed"},
			fix:      []string{"kubectl -n ml delete pod c"},
			shortage: memShort.shortage,
			reasons:  memShort.reasons,
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := opts()
			if tt.opts != nil {
				tt.opts(&o)
			}
			r, err := diagnose.AnalyzePod(tt.ev(), o)
			if err != nil {
				t.Fatal(err)
			}
			checkFitReport(t, r, tt.want)
		})
	}
}

func checkFitReport(t *testing.T, r diagnose.PodReport, w fitWant) {
	t.Helper()
	if testing.Verbose() {
		b, _ := json.MarshalIndent(r, "", "  ")
		t.Logf("%s", b)
	}
	if r.Case != w.caseCode {
		t.Errorf("case = %s, want %s (reason %q)", r.Case, w.caseCode, r.Reason)
	}
	var p3 []diagnose.Finding
	for _, f := range r.Findings {
		if f.Case == diagnose.P3NoNodeFits {
			p3 = append(p3, f)
		}
	}
	if len(p3) == 0 {
		t.Fatalf("no P3 finding; findings %+v", r.Findings)
	}
	f := p3[0]
	if f.Code != w.first || f.Severity != w.severity {
		t.Errorf("first P3 finding = %s (%s), want %s (%s): %q", f.Code, f.Severity, w.first, w.severity, f.Summary)
	}
	if !strings.Contains(f.Summary, w.summary) {
		t.Errorf("summary = %q, want it to contain %q", f.Summary, w.summary)
	}
	for _, e := range w.evidence {
		if !slices.ContainsFunc(f.Evidence, func(s string) bool { return strings.Contains(s, e) }) {
			t.Errorf("no evidence line contains %q; evidence:\n%s", e, strings.Join(f.Evidence, "\n"))
		}
	}
	for _, e := range w.absent {
		if slices.ContainsFunc(f.Evidence, func(s string) bool { return strings.Contains(s, e) }) {
			t.Errorf("an evidence line contains %q; evidence:\n%s", e, strings.Join(f.Evidence, "\n"))
		}
	}
	for _, x := range w.fix {
		if !slices.ContainsFunc(f.Fix, func(s string) bool { return strings.Contains(s, x) }) {
			t.Errorf("no fix line contains %q; fix:\n%s", x, strings.Join(f.Fix, "\n"))
		}
	}
	for _, c := range w.codes {
		if !slices.ContainsFunc(p3, func(f diagnose.Finding) bool { return f.Code == c }) {
			t.Errorf("no P3 finding %s", c)
		}
	}
	if r.Fit == nil {
		t.Fatal("Fit is nil")
	}
	if r.Fit.Shortage != w.shortage {
		t.Errorf("shortage = %q, want %q", r.Fit.Shortage, w.shortage)
	}
	if !maps.Equal(r.Fit.Reasons, w.reasons) {
		t.Errorf("reasons = %v, want %v", r.Fit.Reasons, w.reasons)
	}
	if r.Fit.Fits != w.fits {
		t.Errorf("fits = %q, want %q", r.Fit.Fits, w.fits)
	}
}
