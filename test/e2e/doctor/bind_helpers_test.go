package doctor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubeschedulerconfigv1 "k8s.io/kube-scheduler/config/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// The bind side's helpers (P4–P7), over helpers_test.go's.

// bindHAMi is a test's HAMi scheduler whose kube-scheduler the test may kill and start again,
// with extender flags of the test's choice (the node lock's retry timeout).
type bindHAMi struct {
	name  string
	g     *harness.GPUNode
	cfg   *kubeschedulerconfigv1.KubeSchedulerConfiguration
	sched *envtest.Scheduler
}

// startBindHAMi starts examples/extender for g's node with the extra flags and kube-scheduler
// calling it, under a scheduler name of the test's own.
func startBindHAMi(t *testing.T, g *harness.GPUNode, extra ...string) *bindHAMi {
	t.Helper()
	h := &bindHAMi{name: newSchedulerName(), g: g}
	url := startExtender(t, "", h.name, cp.LabelNodes(t, g), extra...)
	h.cfg = schedulerConfig(t, url, h.name)
	h.sched = startKubeScheduler(t, h.cfg)
	return h
}

// restart starts kube-scheduler again after kill.
func (h *bindHAMi) restart(t *testing.T) { t.Helper(); h.sched = startKubeScheduler(t, h.cfg) }

// kill ends kube-scheduler at once (SIGKILL, as a crash or an evicted Pod): what it had in
// flight is cut off.
func (h *bindHAMi) kill(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(h.sched.Pid(), syscall.SIGKILL); err != nil {
		t.Fatalf("kill kube-scheduler: %v", err)
	}
	_ = h.sched.Stop()
}

// opts are the doctor's options for the test (helpers_test.go's doctorOptions) with the
// AllocateWait (0: the default).
func (h *bindHAMi) opts(allocateWait time.Duration) diagnose.Options {
	o := doctorOptions(h.g, h.name)
	o.AllocateWait = allocateWait
	return o
}

// create creates a pod asking 1 GPU of 1000 MiB for h's scheduler in the node's namespace.
func (h *bindHAMi) create(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	return create(t, gpuPod(h.g.Namespace, name, h.name, map[string]string{harness.GPUResource: "1", "nvidia.com/gpumem": "1000"}, nil))
}

// waitBound waits until HAMi's scheduler bound the pod to the node (bind-phase allocating,
// S2) and returns it, before the kubelet's Allocate.
func (h *bindHAMi) waitBound(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	harness.Eventually(t, "pod "+name+" bound to "+h.g.Name, 45*time.Second, func() bool {
		p, ok := h.g.Pod(t, name)
		pod = p
		return ok && p.Spec.NodeName == h.g.Name && p.Annotations[allocation.KeyBindPhase] == string(allocation.PhaseAllocating)
	})
	return pod
}

// waitCase diagnoses the pod until its case is want and returns that report (logged, as
// doctor does); on a timeout it fails with the last report. Each diagnosis reads the whole
// cluster, so it polls every 250 ms, not every 5 ms as harness.Eventually.
func waitCase(t *testing.T, ns, name string, opts diagnose.Options, want diagnose.Case) *diagnose.PodReport {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := diagnose.Pod(t.Context(), cp.AdminClient(), ns, name, opts)
		if err != nil {
			t.Fatalf("diagnose.Pod %s/%s: %v", ns, name, err)
		}
		if r.Case == want || time.Now().After(deadline) {
			return doctor(t, ns, name, opts) // logs the report; wantCase checks the case
		}
		select {
		case <-t.Context().Done():
			t.Fatal("test ended while diagnosing")
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// setNodeLock writes hami.io/mutex.lock on the node as value, as the component the test
// stands in for leaves it.
func setNodeLock(t *testing.T, node, value string) {
	t.Helper()
	patch := map[string]any{"metadata": map[string]any{"annotations": map[string]string{nodelock.Key: value}}}
	mergePatch(t, "node "+node, patch, func(ctx context.Context, data []byte) error {
		_, err := cp.AdminClient().CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, data, metav1.PatchOptions{})
		return err
	})
}

// clearHAMiAnnotations does what the report's `kubectl -n NS annotate pod NAME
// hami.io/vgpu-node- hami.io/vgpu-time- …` does: one merge patch setting those keys to null.
func clearHAMiAnnotations(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	nulls := map[string]any{}
	for _, k := range []string{allocation.KeyNode, allocation.KeyTime, "hami.io/vgpu-devices-to-allocate",
		"hami.io/vgpu-devices-allocated", allocation.KeyBindPhase, allocation.KeyBindTime} {
		nulls[k] = nil
	}
	patchPod(t, pod.Namespace, pod.Name, map[string]any{"metadata": map[string]any{"annotations": nulls}})
}

// restartNode writes the Node's Ready condition as a kubelet restart leaves it: NotReady,
// then Ready again, each with a lastTransitionTime of now, once now is a whole second after
// since (the API server keeps seconds).
func restartNode(t *testing.T, node string, since time.Time) {
	t.Helper()
	harness.Eventually(t, "a second after "+since.Format(time.RFC3339), 3*time.Second, func() bool {
		return time.Now().Truncate(time.Second).After(since)
	})
	for _, c := range []struct {
		status corev1.ConditionStatus
		reason string
	}{{corev1.ConditionFalse, "KubeletNotReady"}, {corev1.ConditionTrue, "KubeletReady"}} {
		now := time.Now().UTC().Format(time.RFC3339)
		patch := fmt.Appendf(nil, `{"status":{"conditions":[{"type":"Ready","status":%q,"reason":%q,"lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`,
			c.status, c.reason, now, now)
		if _, err := cp.AdminClient().CoreV1().Nodes().Patch(t.Context(), node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
			t.Fatalf("write the Ready condition of node %s: %v", node, err)
		}
	}
}

// unixTime reads a pod annotation in Unix seconds.
func unixTime(t *testing.T, pod *corev1.Pod, key string) time.Time {
	t.Helper()
	s, err := strconv.ParseInt(pod.Annotations[key], 10, 64)
	if err != nil {
		t.Fatalf("pod %s: %s = %q: %v", pod.Name, key, pod.Annotations[key], err)
	}
	return time.Unix(s, 0)
}

// dump renders a lock for a failure message.
func dump(l *diagnose.LockState) string {
	b, err := json.Marshal(l)
	if err != nil {
		return err.Error()
	}
	return string(b)
}
