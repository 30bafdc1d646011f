package doctor_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// TestP1PlacedByDefaultScheduler: no MutatingWebhookConfiguration is installed, so a GPU pod
// keeps spec.schedulerName default-scheduler; a real kube-scheduler with the upstream default
// profile binds it to the GPU node (which offers nvidia.com/gpu), and the kubelet's Allocate
// fails in examples/deviceplugin with "no binding pod found on node <n>", which the kubelet
// writes into the pod's status (Failed, UnexpectedAdmissionError). The doctor names
// P1-NotRoutedToHAMi with the missing webhook as evidence and, as fix, the pod created again
// with HAMi's scheduler name; applied, HAMi's scheduler binds it and the Allocate succeeds.
//
// Not parallel: the default-scheduler profile would take the other tests' pods without a
// scheduler name; parallel tests wait until this one ends.
func TestP1PlacedByDefaultScheduler(t *testing.T) {
	g := gpuNode(t)
	startKubeScheduler(t, nil)
	pod := create(t, gpuPod(g.Namespace, "default-placed", "", map[string]string{harness.GPUResource: "1"}, nil))
	harness.Eventually(t, "the default scheduler to bind the pod", 45*time.Second, func() bool {
		p, _ := g.Pod(t, pod.Name)
		pod = p
		return p != nil && p.Spec.NodeName == g.Name
	})
	if pod.Spec.SchedulerName != corev1.DefaultSchedulerName {
		t.Fatalf("spec.schedulerName %q, want %q", pod.Spec.SchedulerName, corev1.DefaultSchedulerName)
	}
	_, err := g.Admit(t.Context(), pod)
	want := "no binding pod found on node " + g.Name
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("the kubelet's Allocate: %v, want an error with %q", err, want)
	}
	pod = g.FailAdmission(t, pod, err)
	t.Logf("pod status: %s: %s", pod.Status.Reason, pod.Status.Message)

	name := newSchedulerName()
	opts := doctorOptions(g, name)
	r := doctor(t, g.Namespace, pod.Name, opts)
	wantCase(t, r, diagnose.P1NotRoutedToHAMi, diagnose.CodeWebhookMissing, "mutatingwebhookconfigurations: none", "")
	f := wantCase(t, r, diagnose.P1NotRoutedToHAMi, diagnose.CodeDefaultScheduled, "spec.nodeName "+g.Name, "kubectl replace --force")
	fix := fixLine(t, f, fmt.Sprintf(`.spec.schedulerName=%q`, name))
	if !strings.Contains(fix, fmt.Sprintf("kubectl -n %s get pod %s -o json", g.Namespace, pod.Name)) {
		t.Errorf("fix %q does not read the pod %s/%s", fix, g.Namespace, pod.Name)
	}

	// The fix: HAMi's scheduler (its name, the extender) and the pod again with that name.
	url := startExtender(t, "", name, cp.LabelNodes(t, g))
	startKubeScheduler(t, schedulerConfig(t, url, name))
	recreate(t, pod, func(p *corev1.Pod) { p.Spec.SchedulerName = name })
	allocated(t, g, pod.Name, opts)
}

// TestP2ExtenderDown: kube-scheduler runs examples/extender's configuration with the
// extender's URL on a port where nothing listens; its FailedScheduling Event names the
// extender's /filter and "connection refused". The doctor names P2-SchedulerUnreachable with
// that Event as evidence and, as fix, a restart of HAMi's scheduler; applied (the extender
// started on the configured port), kube-scheduler's retry binds the pod and the Allocate
// succeeds.
func TestP2ExtenderDown(t *testing.T) {
	t.Parallel()
	g := gpuNode(t)
	name := newSchedulerName()
	addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	startKubeScheduler(t, schedulerConfig(t, "http://"+addr, name))
	pod := create(t, gpuPod(g.Namespace, "extender-down", name, map[string]string{harness.GPUResource: "1", "nvidia.com/gpumem": "4000"}, nil))
	msg := waitEvent(t, g.Namespace, pod.Name, "FailedScheduling", "connection refused")
	t.Logf("FailedScheduling: %s", msg)

	opts := doctorOptions(g, name)
	r := doctor(t, g.Namespace, pod.Name, opts)
	if r.Stage != diagnose.StageAdmitted {
		t.Errorf("stage %s, want S0", r.Stage)
	}
	wantCase(t, r, diagnose.P2SchedulerUnreachable, diagnose.CodeExtenderUnreachable, "connection refused", "rollout restart deployment")

	// The fix: HAMi's scheduler running again, where kube-scheduler calls it.
	startExtender(t, addr, name, cp.LabelNodes(t, g))
	allocated(t, g, pod.Name, opts)
}
