package diagnose_test

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/diagnose"
)

func TestStageAndCaseText(t *testing.T) {
	for s := diagnose.StageNotAdmitted; s <= diagnose.StageRunning; s++ {
		b, err := s.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back diagnose.Stage
		if err := back.UnmarshalText(b); err != nil || back != s {
			t.Errorf("stage %d: %q read back as %d (%v)", s, b, back, err)
		}
	}
	for _, bad := range []string{"", "S5", "S-1", "S01", "s1", "S1x"} {
		var s diagnose.Stage
		if err := s.UnmarshalText([]byte(bad)); !errors.Is(err, diagnose.ErrInvalidOptions) {
			t.Errorf("stage %q: err %v, want ErrInvalidOptions", bad, err)
		}
	}
	cases := []diagnose.Case{
		diagnose.Healthy,
		diagnose.CasePluginNotScheduled, diagnose.CasePluginNotRunning, diagnose.CaseNoAllocatable,
		diagnose.CaseNoAnnotation, diagnose.CaseSchedulerExcludes,
		diagnose.P0NodeNotRegistered, diagnose.P1NotRoutedToHAMi, diagnose.P2SchedulerUnreachable,
		diagnose.P3NoNodeFits, diagnose.P4NodeLocked, diagnose.P5AllocateNeverCame,
		diagnose.P6AllocateFailed, diagnose.P7StaleAssignment, diagnose.P8RunningWithoutLimits,
	}
	seen := map[diagnose.Case]bool{}
	for _, c := range cases {
		if seen[c] {
			t.Errorf("code %q twice", c)
		}
		seen[c] = true
		if c != diagnose.Healthy && c.Number()+"-"+c.Name() != string(c) {
			t.Errorf("case %q: number %q, name %q", c, c.Number(), c.Name())
		}
		b, err := json.Marshal(diagnose.Finding{Case: c})
		if err != nil {
			t.Fatal(err)
		}
		var raw struct {
			Case any `json:"case"`
		}
		var back diagnose.Finding
		if err := json.Unmarshal(b, &raw); err != nil || raw.Case != string(c) {
			t.Errorf("case %q: JSON %s, want the code as a string", c, b)
		}
		if err := json.Unmarshal(b, &back); err != nil || back.Case != c {
			t.Errorf("case %q: read back as %q (%v)", c, back.Case, err)
		}
	}
	for c, want := range map[diagnose.Case][2]string{
		diagnose.Healthy:                {"healthy", "healthy"},
		diagnose.CasePluginNotScheduled: {"case 1", "case 1: device plugin not scheduled on the node"},
		diagnose.CaseSchedulerExcludes:  {"case 5", "case 5: scheduler does not take the node"},
		diagnose.P3NoNodeFits:           {"P3", "P3-NoNodeFits"},
		diagnose.P0NodeNotRegistered:    {"node", "P0-NodeNotRegistered"},
	} {
		if c.Short() != want[0] || c.Describe() != want[1] {
			t.Errorf("case %q: Short %q, Describe %q; want %q", c, c.Short(), c.Describe(), want)
		}
	}
	if !diagnose.CaseNoAnnotation.Node() || diagnose.P3NoNodeFits.Node() || diagnose.Healthy.Node() {
		t.Error("Node() wrong")
	}
	b, err := json.Marshal(diagnose.PodReport{Stage: diagnose.StageBound, Case: diagnose.P4NodeLocked})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m["stage"] != "S2" || m["case"] != "P4-NodeLocked" {
		t.Errorf("JSON stage %v case %v", m["stage"], m["case"])
	}
}

func basicGPUPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team", UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{SchedulerName: "hami-scheduler", Containers: []corev1.Container{{
			Name: "cuda", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				"nvidia.com/gpu": resource.MustParse("2"), "nvidia.com/gpumem": resource.MustParse("30000"),
			}},
		}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
}

func TestAnalyzePodBasics(t *testing.T) {
	opts := diagnose.Options{Clock: clocktesting.NewFakePassiveClock(now)}
	if _, err := diagnose.AnalyzePod(diagnose.PodEvidence{}, opts); !errors.Is(err, diagnose.ErrInvalidOptions) {
		t.Errorf("nil pod: %v", err)
	}
	cpu := basicGPUPod("web")
	cpu.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	r, err := diagnose.AnalyzePod(diagnose.PodEvidence{Pod: cpu}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if r.Case != diagnose.Healthy {
		t.Errorf("a pod without GPUs: case %v", r.Case)
	}
	if _, ok := r.Finding(diagnose.CodePodNoGPU); !ok {
		t.Errorf("a pod without GPUs: findings %+v, want %s", r.Findings, diagnose.CodePodNoGPU)
	}
	r, err = diagnose.AnalyzePod(diagnose.PodEvidence{Pod: basicGPUPod("train")}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if r.Stage != diagnose.StageAdmitted || len(r.Asks) != 1 || r.Asks[0] != "cuda: 2 GPU × 30000 MiB, 0 % cores" {
		t.Errorf("stage %v asks %q", r.Stage, r.Asks)
	}
}

func TestPodErrorsAndReadFailures(t *testing.T) {
	ctx := t.Context()
	opts := diagnose.Options{Clock: clocktesting.NewFakePassiveClock(now)}
	client := fake.NewClientset(basicGPUPod("train"))
	if _, err := diagnose.Pod(ctx, client, "team", "gone", opts); !errors.Is(err, diagnose.ErrPodNotFound) {
		t.Errorf("missing pod: %v", err)
	}
	client.PrependReactor("list", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("events are forbidden here")
	})
	r, err := diagnose.Pod(ctx, client, "team", "train", opts)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(r.Findings, func(f diagnose.Finding) bool {
		return f.Code == diagnose.CodePodNotChecked && f.Summary == "could not read events of the pod" &&
			slices.Contains(f.Evidence, "events are forbidden here")
	}) {
		t.Errorf("findings %+v, want NotChecked for the events", r.Findings)
	}
	reports, err := diagnose.Pods(ctx, client, "", opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(reports) != 1 || reports[0].Name != "train" {
		t.Errorf("Pods: %d reports", len(reports))
	}
}

// FuzzAnalyzePod: whatever the nodes' register annotations, the pod's HAMi annotations and
// selectors, its Events, the scheduler's configuration and the other pods' device lists hold,
// AnalyzePod returns a report (never a panic) whose error findings each say what to do, and
// Case is set exactly when there is one.
func FuzzAnalyzePod(f *testing.F) {
	reg := `[{"id":"GPU-0","count":10,"devmem":81559,"devcore":100,"type":"NVIDIA H100","mode":"hami-core","health":true}]`
	f.Add(reg, "GPU-0,NVIDIA,81000,0:;", "H100", "FilteringFailed", "no available node, 1 nodes do not meet", "extenders: [{urlPrefix: 'http://127.0.0.1:80'}]", "hami-scheduler", uint8(0))
	f.Add("[{", ";;", "", "FailedScheduling", `Post "http://x/filter": connection refused`, "{{", "default-scheduler", uint8(1))
	f.Add("", "GPU-0,NVIDIA:;", "A100", "FilteringSucceed", "find fit node(gpu-1)", "", "hami-scheduler", uint8(2))
	f.Add("null", "x", ",,", "BindingFailed", "node gpu-1 has been locked within 5m0s", "apiVersion: 1", "", uint8(3))
	f.Fuzz(func(t *testing.T, register, held, gpuType, reason, message, config, scheduler string, shape uint8) {
		pod := basicGPUPod("train")
		pod.Spec.SchedulerName = scheduler
		pod.Annotations = map[string]string{"nvidia.com/use-gputype": gpuType}
		switch shape % 4 {
		case 1:
			pod.Annotations["hami.io/vgpu-node"] = "gpu-1"
			pod.Annotations["hami.io/vgpu-time"] = message
		case 2:
			pod.Spec.NodeName = "gpu-1"
			pod.Annotations["hami.io/bind-phase"] = gpuType
			pod.Annotations["hami.io/bind-time"] = held
		case 3:
			pod.Status.Phase = corev1.PodFailed
			pod.Status.Reason, pod.Status.Message = "UnexpectedAdmissionError", message
		}
		node := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Annotations: map[string]string{
			"hami.io/node-nvidia-register": register, "hami.io/mutex.lock": gpuType}}}
		holder := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "holder", Namespace: "team", Annotations: map[string]string{
			"hami.io/vgpu-node": "gpu-1", "hami.io/vgpu-devices-allocated": held}}}
		ev := diagnose.PodEvidence{
			Pod: pod, Nodes: []corev1.Node{node}, Pods: []corev1.Pod{holder},
			Events: []corev1.Event{{Reason: reason, Message: message,
				InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "team", Name: "train"},
				Source:         corev1.EventSource{Component: scheduler}, LastTimestamp: metav1.NewTime(now.Add(-time.Minute))}},
			SchedulerConfig: &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "hami-scheduler-newversion", Namespace: "kube-system"},
				Data: map[string]string{"config.yaml": config}},
		}
		r, err := diagnose.AnalyzePod(ev, diagnose.Options{Clock: clocktesting.NewFakePassiveClock(now)})
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
