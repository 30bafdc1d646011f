package doctor_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubeschedulerconfigv1 "k8s.io/kube-scheduler/config/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// hami is HAMi's scheduler as one test runs it: examples/extender, seeing the test's GPU
// node only, and kube-scheduler with a profile of a scheduler name of the test's own (the
// package's tests share a cluster: a profile named hami-scheduler in every test would have
// each kube-scheduler try every test's pods and record FailedScheduling on them).
type hami struct {
	// name is the profile's scheduler name, the pods' spec.schedulerName.
	name string
	cfg  *kubeschedulerconfigv1.KubeSchedulerConfiguration
	// sched is the running kube-scheduler, nil while it is stopped.
	sched *envtest.Scheduler
}

// startHAMi starts examples/extender with extra flags for g's node alone and kube-scheduler
// calling it.
func startHAMi(t *testing.T, g *harness.GPUNode, extra ...string) *hami {
	t.Helper()
	for _, err := range []error{errPluginBuild, errExtBuild} {
		if err != nil {
			t.Fatal(err)
		}
	}
	url := cp.StartExtender(t, extenderBin, append([]string{cp.LabelNodes(t, g)}, extra...)...)
	h := &hami{name: harness.UniqueName("hami"), cfg: harness.ExtenderSchedulerConfig(t, url)}
	for i := range h.cfg.Profiles {
		h.cfg.Profiles[i].SchedulerName = &h.name
	}
	h.start(t)
	return h
}

// start starts kube-scheduler (again); it is stopped when t ends.
func (h *hami) start(t *testing.T) {
	t.Helper()
	s, err := cp.StartScheduler(harness.Context(t), envtest.SchedulerOptions{Config: h.cfg})
	if err != nil {
		t.Fatal(err)
	}
	h.sched = s
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-scheduler log:\n%s", s.LogTail(40))
		}
		_ = s.Stop()
	})
}

// kill ends kube-scheduler at once (SIGKILL), as a crash or a node drain does: whatever it
// had in flight is cut off.
func (h *hami) kill(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(h.sched.Pid(), syscall.SIGKILL); err != nil {
		t.Fatalf("kill kube-scheduler: %v", err)
	}
	_ = h.sched.Stop()
	h.sched = nil
}

// opts are the diagnosis options of the test: its scheduler name, and a LockTimeout and
// AllocateWait given by the caller (zero: the defaults).
func (h *hami) opts(allocateWait time.Duration) diagnose.Options {
	return diagnose.Options{SchedulerName: h.name, AllocateWait: allocateWait}
}

// gpuPod is a pod of one container "cuda" asking for 1 GPU with mem MiB, for h's scheduler.
func (h *hami) gpuPod(ns, name string, mem int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{SchedulerName: h.name, Containers: []corev1.Container{{
			Name: "cuda", Image: "registry.invalid/cuda:0",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				harness.GPUResource: resource.MustParse("1"),
				"nvidia.com/gpumem": resource.MustParse(strconv.Itoa(mem)),
			}},
		}}},
	}
}

// create creates a GPU pod for h's scheduler in g's namespace.
func (h *hami) create(t *testing.T, g *harness.GPUNode, name string) *corev1.Pod {
	t.Helper()
	p, err := cp.AdminClient().CoreV1().Pods(g.Namespace).Create(t.Context(), h.gpuPod(g.Namespace, name, 1000), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	return p
}

// waitAllocating waits until the pod is bound to g's node with bind-phase allocating (S2)
// and returns it.
func waitAllocating(t *testing.T, g *harness.GPUNode, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	harness.Eventually(t, "pod "+name+" bound to "+g.Name, 45*time.Second, func() bool {
		p, ok := g.Pod(t, name)
		pod = p
		return ok && p.Spec.NodeName == g.Name && p.Annotations[allocation.KeyBindPhase] == string(allocation.PhaseAllocating)
	})
	return pod
}

// admitToS3 plays the kubelet's admission of a bound pod (Allocate per GPU container) and
// checks that the pod reached S3: bind-phase success, the node lock gone, and the diagnosis
// says StageAllocated without a case.
func admitToS3(t *testing.T, g *harness.GPUNode, h *hami, pod *corev1.Pod) {
	t.Helper()
	if _, err := g.Admit(t.Context(), pod); err != nil {
		t.Fatalf("pod %s: the kubelet's Allocate: %v", pod.Name, err)
	}
	g.WantProtocolEnd(t, pod.Name, allocation.PhaseSuccess)
	r := diagnosePod(t, pod.Namespace, pod.Name, h.opts(0))
	if r.Stage != diagnose.StageAllocated || r.Case != diagnose.PodHealthy {
		t.Errorf("pod %s after Allocate: stage %s, case %s (%s), want S3 and no case", pod.Name, r.Stage, r.Case, r.Reason)
	}
}

// diagnosePod runs the doctor as a library with the admin client.
func diagnosePod(t *testing.T, ns, name string, opts diagnose.Options) *diagnose.PodReport {
	t.Helper()
	r, err := diagnose.Pod(t.Context(), cp.AdminClient(), ns, name, opts)
	if err != nil {
		t.Fatalf("diagnose.Pod %s/%s: %v", ns, name, err)
	}
	return r
}

// waitCase diagnoses the pod until its case is want and returns that report; on a timeout
// it fails with the last report.
func waitCase(t *testing.T, ns, name string, opts diagnose.Options, want diagnose.PodCase) *diagnose.PodReport {
	t.Helper()
	var r *diagnose.PodReport
	deadline := time.Now().Add(30 * time.Second)
	for {
		r = diagnosePod(t, ns, name, opts)
		if r.Case == want {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s: case %s, want %s\n%s", ns, name, r.Case, want, dump(r))
		}
		select {
		case <-t.Context().Done():
			t.Fatal("test ended while diagnosing")
		case <-time.After(250 * time.Millisecond): // each diagnosis reads the cluster: poll gently
		}
	}
}

// wantFinding checks that r has an error finding of the case with the code, an evidence
// line containing evidence and a fix line containing fix ("": none wanted), and returns the
// finding.
func wantFinding(t *testing.T, r *diagnose.PodReport, c diagnose.PodCase, code, evidence, fix string) diagnose.PodFinding {
	t.Helper()
	f, ok := r.Finding(code)
	switch {
	case !ok:
		t.Fatalf("no finding %s\n%s", code, dump(r))
	case f.Case != c || f.Severity != diagnose.SeverityError:
		t.Errorf("finding %s: case %s severity %v, want %s and an error\n%s", code, f.Case, f.Severity, c, dump(r))
	}
	if !slices.ContainsFunc(f.Evidence, func(l string) bool { return strings.Contains(l, evidence) }) {
		t.Errorf("finding %s: no evidence line with %q: %q", code, evidence, f.Evidence)
	}
	if fix != "" && !slices.ContainsFunc(f.Fix, func(l string) bool { return strings.Contains(l, fix) }) {
		t.Errorf("finding %s: no fix line with %q: %q", code, fix, f.Fix)
	}
	return f
}

// dump renders a report for a failure message.
func dump(r *diagnose.PodReport) string {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// setNodeLock writes hami.io/mutex.lock on the node as value, as the component the test
// stands in for leaves it.
func setNodeLock(t *testing.T, node, value string) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{nodelock.Key: value}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.AdminClient().CoreV1().Nodes().Patch(t.Context(), node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("write the lock of node %s: %v", node, err)
	}
}

// waitEvent waits for an Event on the pod with the reason whose message contains text.
func waitEvent(t *testing.T, pod *corev1.Pod, reason, text string) corev1.Event {
	t.Helper()
	var got corev1.Event
	harness.Eventually(t, fmt.Sprintf("a %s Event on pod %s with %q", reason, pod.Name, text), 30*time.Second, func() bool {
		list, err := cp.AdminClient().CoreV1().Events(pod.Namespace).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range list.Items {
			if e.InvolvedObject.Name == pod.Name && e.Reason == reason && strings.Contains(e.Message, text) {
				got = e
				return true
			}
		}
		return false
	})
	return got
}

// recreate does what the report's recreate fix does (kubectl get -o json | jq 'del(.status,
// .spec.nodeName, …HAMi's annotations)' | kubectl replace --force -f -): it deletes the pod,
// waits until it is gone, and creates it again from its own spec without status, node,
// identity and HAMi's annotations.
func recreate(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	ctx := t.Context()
	pods := cp.AdminClient().CoreV1().Pods(pod.Namespace)
	if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatalf("delete pod %s: %v", pod.Name, err)
	}
	harness.Eventually(t, "pod "+pod.Name+" gone", 20*time.Second, func() bool {
		_, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	again := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, Labels: pod.Labels,
		Annotations: withoutHAMi(pod.Annotations)}, Spec: *pod.Spec.DeepCopy()}
	again.Spec.NodeName = ""
	created, err := pods.Create(ctx, again, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s again: %v", pod.Name, err)
	}
	return created
}

// hamiKeys are the pod annotations HAMi's scheduler and device plugin write.
var hamiKeys = []string{allocation.KeyNode, allocation.KeyTime, allocation.KeyBindPhase, allocation.KeyBindTime,
	"hami.io/vgpu-devices-to-allocate", "hami.io/vgpu-devices-allocated"}

// withoutHAMi copies annotations without HAMi's keys.
func withoutHAMi(in map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range in {
		if !slices.Contains(hamiKeys, k) {
			out[k] = v
		}
	}
	return out
}

// clearHAMiAnnotations does what the report's annotate fix does (kubectl annotate pod …
// hami.io/vgpu-node- …): one merge patch setting HAMi's keys to null.
func clearHAMiAnnotations(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	nulls := map[string]any{}
	for _, k := range hamiKeys {
		nulls[k] = nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": nulls}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.AdminClient().CoreV1().Pods(pod.Namespace).Patch(t.Context(), pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("clear the annotations of pod %s: %v", pod.Name, err)
	}
}

// restartNode writes the Node's Ready condition as a kubelet restart leaves it: NotReady,
// then Ready again, with a lastTransitionTime of now (after since, in whole seconds, as the
// API server keeps it).
func restartNode(t *testing.T, node string, since time.Time) {
	t.Helper()
	harness.Eventually(t, "a second after "+since.Format(time.RFC3339), 3*time.Second, func() bool {
		return time.Now().Truncate(time.Second).After(since)
	})
	for _, status := range []corev1.ConditionStatus{corev1.ConditionFalse, corev1.ConditionTrue} {
		reason := "KubeletReady"
		if status == corev1.ConditionFalse {
			reason = "KubeletNotReady"
		}
		now := time.Now().UTC().Format(time.RFC3339)
		patch := fmt.Appendf(nil, `{"status":{"conditions":[{"type":"Ready","status":%q,"reason":%q,"lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`,
			status, reason, now, now)
		if _, err := cp.AdminClient().CoreV1().Nodes().Patch(t.Context(), node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
			t.Fatalf("write the Ready condition of node %s: %v", node, err)
		}
	}
}

// unixTime reads an annotation in Unix seconds.
func unixTime(t *testing.T, pod *corev1.Pod, key string) time.Time {
	t.Helper()
	s, err := strconv.ParseInt(pod.Annotations[key], 10, 64)
	if err != nil {
		t.Fatalf("pod %s: %s = %q: %v", pod.Name, key, pod.Annotations[key], err)
	}
	return time.Unix(s, 0)
}
