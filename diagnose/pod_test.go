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
	seen := map[string]bool{}
	for c := diagnose.PodHealthy; c <= diagnose.PodNodeNotRegistered; c++ {
		code := c.Code()
		if seen[code] {
			t.Errorf("code %q twice", code)
		}
		seen[code] = true
		var back diagnose.PodCase
		if err := back.UnmarshalText([]byte(code)); err != nil || back != c {
			t.Errorf("case %d: %q read back as %d (%v)", c, code, back, err)
		}
	}
	if got := diagnose.P3NoNodeFits.Code(); got != "P3-NoNodeFits" {
		t.Errorf("P3 code %q", got)
	}
	var c diagnose.PodCase
	if err := c.UnmarshalText([]byte("P9")); !errors.Is(err, diagnose.ErrInvalidOptions) {
		t.Errorf("P9: %v", err)
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
	if r.Case != diagnose.PodHealthy {
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
	if !slices.ContainsFunc(r.Findings, func(f diagnose.PodFinding) bool {
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
		if (r.Case == diagnose.PodHealthy) != (len(r.Errors()) == 0) {
			t.Fatalf("case %v with %d errors", r.Case, len(r.Errors()))
		}
	})
}
