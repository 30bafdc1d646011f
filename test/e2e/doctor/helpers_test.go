package doctor_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubeschedulerconfigv1 "k8s.io/kube-scheduler/config/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// gpuNode starts a Ready GPU node (harness.GPUNode with this binary's plugin) in a namespace
// of its own, labelled for this test's extender.
func gpuNode(t *testing.T) *harness.GPUNode {
	t.Helper()
	if errPluginBuild != nil {
		t.Fatal(errPluginBuild)
	}
	g := cp.StartGPUNode(t, harness.GPUNodeOptions{Bin: pluginBin, Namespace: harness.UniqueName("doc")})
	g.MakeReady(t)
	return g
}

// hamiScheduler is one test's HAMi scheduler: examples/extender and kube-scheduler with the
// extender's configuration, under a scheduler name of the test's own (tests run in parallel
// on one cluster; each kube-scheduler takes only its own profile's pods).
type hamiScheduler struct {
	// name is the profile's scheduler name (the extender's --scheduler-name); url the
	// extender's.
	name, url string
}

// newSchedulerName is a HAMi scheduler name for one test.
func newSchedulerName() string { return harness.UniqueName("hami-scheduler") }

// schedulerConfig is examples/extender's KubeSchedulerConfiguration with the extender at url
// and the profile named name.
func schedulerConfig(t *testing.T, url, name string) *kubeschedulerconfigv1.KubeSchedulerConfiguration {
	t.Helper()
	cfg := harness.ExtenderSchedulerConfig(t, url)
	if len(cfg.Profiles) != 1 {
		t.Fatalf("the extender's scheduler configuration has %d profiles, want 1", len(cfg.Profiles))
	}
	cfg.Profiles[0].SchedulerName = &name
	return cfg
}

// startKubeScheduler runs kube-scheduler with cfg (nil: upstream defaults, the
// default-scheduler profile) until t ends, and returns it.
func startKubeScheduler(t *testing.T, cfg *kubeschedulerconfigv1.KubeSchedulerConfiguration) *envtest.Scheduler {
	t.Helper()
	sched, err := cp.StartScheduler(t.Context(), envtest.SchedulerOptions{Config: cfg})
	if err != nil {
		t.Fatalf("start kube-scheduler: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-scheduler log:\n%s", sched.LogTail(40))
		}
		_ = sched.Stop()
	})
	return sched
}

// startExtender runs examples/extender at addr ("" for a free port) for the nodes of
// nodeFlag (cp.LabelNodes) under the scheduler name, with extra flags, and returns its URL.
func startExtender(t *testing.T, addr, name, nodeFlag string, extra ...string) string {
	t.Helper()
	if errExtBuild != nil {
		t.Fatal(errExtBuild)
	}
	args := append([]string{"--scheduler-name=" + name, nodeFlag}, extra...)
	if addr == "" {
		return cp.StartExtender(t, extenderBin, args...)
	}
	return cp.StartExtenderAt(t, extenderBin, addr, args...)
}

// startHAMi starts the extender for the nodes and kube-scheduler with its configuration.
func startHAMi(t *testing.T, nodes ...*harness.GPUNode) *hamiScheduler {
	t.Helper()
	h := &hamiScheduler{name: newSchedulerName()}
	h.url = startExtender(t, "", h.name, cp.LabelNodes(t, nodes...))
	startKubeScheduler(t, schedulerConfig(t, h.url, h.name))
	return h
}

// doctorOptions point the pod diagnosis at the test's objects: HAMi's namespace is the GPU
// node's (no chart is installed: its Deployment, DaemonSet and Lease are absent), the
// scheduler name the test's, and the candidate nodes the test's node (the cluster holds the
// other tests' GPU nodes).
func doctorOptions(g *harness.GPUNode, schedulerName string) diagnose.Options {
	return diagnose.Options{
		Namespace:         g.Namespace,
		SchedulerName:     schedulerName,
		NodeLabelSelector: map[string]string{harness.TestLabel: g.Name},
	}
}

// doctor runs the doctor as a library: diagnose.Pod with the admin client, as `doctor pod
// NAMESPACE/NAME` does, and logs the report.
func doctor(t *testing.T, ns, name string, opts diagnose.Options) *diagnose.PodReport {
	t.Helper()
	r, err := diagnose.Pod(t.Context(), cp.AdminClient(), ns, name, opts)
	if err != nil {
		t.Fatalf("diagnose.Pod %s/%s: %v", ns, name, err)
	}
	b, _ := json.MarshalIndent(r, "", "  ")
	t.Logf("doctor pod %s/%s: stage %s, case %s: %s\n%s", ns, name, r.Stage, r.Case, r.Reason, b)
	return r
}

// wantCase checks the report's case and returns its finding with the code, which must have
// an evidence line containing evidence and a fix line containing fix ("" to skip either).
func wantCase(t *testing.T, r *diagnose.PodReport, c diagnose.Case, code, evidence, fix string) diagnose.Finding {
	t.Helper()
	if r.Case != c {
		t.Errorf("case %s (%s), want %s", r.Case, r.Reason, c)
	}
	f, ok := r.Finding(code)
	if !ok {
		t.Fatalf("no finding %s; findings: %+v", code, r.Findings)
	}
	for _, w := range []struct {
		what, want string
		lines      []string
	}{{"evidence", evidence, f.Evidence}, {"fix", fix, f.Fix}} {
		if w.want != "" && !containsLine(w.lines, w.want) {
			t.Errorf("finding %s: no %s line contains %q:\n%s", code, w.what, w.want, strings.Join(w.lines, "\n"))
		}
	}
	return f
}

// containsLine reports whether a line contains s.
func containsLine(lines []string, s string) bool {
	for _, l := range lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// fixLine returns the first fix line of f containing s.
func fixLine(t *testing.T, f diagnose.Finding, s string) string {
	t.Helper()
	for _, l := range f.Fix {
		if strings.Contains(l, s) {
			return l
		}
	}
	t.Fatalf("finding %s: no fix line contains %q: %q", f.Code, s, f.Fix)
	return ""
}

// gpuPod is a pod of one container "cuda" with the limits (nvidia.com/gpu, gpumem, …), the
// scheduler name ("" for the default scheduler) and annotations.
func gpuPod(ns, name, schedulerName string, limits map[string]string, annotations map[string]string) *corev1.Pod {
	rl := corev1.ResourceList{}
	for k, v := range limits {
		rl[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: annotations},
		Spec: corev1.PodSpec{SchedulerName: schedulerName, Containers: []corev1.Container{{
			Name: "cuda", Image: "registry.invalid/cuda:0", Resources: corev1.ResourceRequirements{Limits: rl}}}},
	}
}

// create creates pod.
func create(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	out, err := cp.AdminClient().CoreV1().Pods(pod.Namespace).Create(t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	return out
}

// getPod reads a pod.
func getPod(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	p, err := cp.AdminClient().CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get pod %s/%s: %v", ns, name, err)
	}
	return p
}

// deletePod deletes a pod at once (kubectl delete --grace-period=0 --force: no kubelet
// confirms the deletion) and waits until it is gone.
func deletePod(t *testing.T, ns, name string) {
	t.Helper()
	pods := cp.AdminClient().CoreV1().Pods(ns)
	if err := pods.Delete(t.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
		t.Fatalf("delete pod %s/%s: %v", ns, name, err)
	}
	harness.Eventually(t, "pod "+ns+"/"+name+" gone", 20*time.Second, func() bool {
		_, err := pods.Get(t.Context(), name, metav1.GetOptions{})
		return err != nil
	})
}

// waitEvent waits until the pod has an Event with the reason whose message contains text,
// and returns the message.
func waitEvent(t *testing.T, ns, name, reason, text string) string {
	t.Helper()
	var msg string
	harness.Eventually(t, "Event "+reason+" on pod "+ns+"/"+name+" with "+text, 45*time.Second, func() bool {
		list, err := cp.AdminClient().CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range list.Items {
			if e.InvolvedObject.Name == name && e.Reason == reason && strings.Contains(e.Message, text) {
				msg = e.Message
				return true
			}
		}
		return false
	})
	return msg
}

// allocated waits until HAMi's scheduler has bound the pod (bind-phase allocating on the
// node), plays the kubelet's admission (Allocate per GPU container) and checks S3:
// bind-phase success and the node lock gone; then the doctor finds the pod at S3 with no case.
func allocated(t *testing.T, g *harness.GPUNode, name string, opts diagnose.Options) {
	t.Helper()
	var pod *corev1.Pod
	harness.Eventually(t, "pod "+name+" bound by HAMi's scheduler", 45*time.Second, func() bool {
		p, ok := g.Pod(t, name)
		pod = p
		return ok && p.Spec.NodeName == g.Name && p.Annotations[allocation.KeyBindPhase] == string(allocation.PhaseAllocating)
	})
	if _, err := g.Admit(t.Context(), pod); err != nil {
		t.Fatalf("the kubelet's Allocate of pod %s: %v", name, err)
	}
	g.WantProtocolEnd(t, name, allocation.PhaseSuccess)
	r := doctor(t, g.Namespace, name, opts)
	if r.Stage != diagnose.StageAllocated || r.Case != diagnose.Healthy {
		t.Errorf("after the fix: stage %s, case %s (%s), want S3 and Healthy", r.Stage, r.Case, r.Reason)
	}
}

// recreate does what the doctor's recreate fix (`kubectl get pod -o json | jq 'del(.status,
// .spec.nodeName, …, HAMi's annotations) | edits' | kubectl replace --force -f -`) means:
// the pod is deleted and created again from its spec without status, node and HAMi's
// annotations, after edit.
func recreate(t *testing.T, pod *corev1.Pod, edit func(*corev1.Pod)) *corev1.Pod {
	t.Helper()
	p := getPod(t, pod.Namespace, pod.Name)
	deletePod(t, p.Namespace, p.Name)
	fresh := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, Labels: p.Labels, Annotations: map[string]string{}}, Spec: p.Spec}
	for k, v := range p.Annotations {
		if !strings.HasPrefix(k, "hami.io/") {
			fresh.Annotations[k] = v
		}
	}
	fresh.Spec.NodeName = ""
	edit(fresh)
	return create(t, fresh)
}

// mergePatch merge-patches an object with the JSON of patch through do.
func mergePatch(t *testing.T, what string, patch any, do func(ctx context.Context, data []byte) error) {
	t.Helper()
	data, err := json.Marshal(patch)
	if err != nil {
		t.Fatal(err)
	}
	if err := do(t.Context(), data); err != nil {
		t.Fatalf("patch %s: %v", what, err)
	}
}

// patchPod merge-patches a pod.
func patchPod(t *testing.T, ns, name string, patch any) {
	t.Helper()
	mergePatch(t, "pod "+ns+"/"+name, patch, func(ctx context.Context, data []byte) error {
		_, err := cp.AdminClient().CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, data, metav1.PatchOptions{})
		return err
	})
}
