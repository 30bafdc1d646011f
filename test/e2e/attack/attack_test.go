package attack_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// TestAttacks runs the attacks on HAMi's protocol one after the other against one node, each
// asserting its exact outcome, and audits the cluster for double-booked GPUs after every step.
func TestAttacks(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	pods := cp.AdminClient().CoreV1().Pods(s.ns)
	audit(t, "start")

	// The victim: a pod the scheduler placed and the node agent allocated.
	if _, err := pods.Create(t.Context(), s.gpuPod("victim", 30000, 60), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	victim := s.admit(t, "victim", 2*time.Minute)
	vgpu := strings.Split(victim.Annotations[annotation.KeyNVIDIAAllocated], ",")[0]
	if len(s.podSeries(t, "victim")) == 0 {
		t.Fatal("the extender's usage does not hold the victim")
	}
	audit(t, "the victim's placement")

	t.Run("forged annotations at create", func(t *testing.T) {
		// Issue #3041: another scheduler, HAMi's opt-out label, the victim's GPU at 40 GB.
		for who, c := range map[string]kubernetes.Interface{"attacker": s.attacker, "cluster admin": cp.AdminClient()} {
			_, err := c.CoreV1().Pods(s.ns).Create(t.Context(), forgedPod("forged", vgpu, s.g.Name), metav1.CreateOptions{})
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `admission webhook "vgpu.hami.io" denied the request: pod carries the scheduler-owned annotation hami.io/bind-phase`) {
				t.Errorf("%s creating a forged pod: %v, want the webhook's denial naming hami.io/bind-phase", who, err)
			}
		}
		// One key is enough, whichever.
		for _, key := range []string{annotation.KeyNVIDIAToAllocate, allocation.KeyNode, "hami.io/vgpu-mig-allocations"} {
			p := s.plainPod("one-key")
			p.Annotations = map[string]string{key: "x"}
			if _, err := s.attacker.CoreV1().Pods(s.ns).Create(t.Context(), p, metav1.CreateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), key) {
				t.Errorf("pod with %s: %v, want denied naming it", key, err)
			}
		}
		if _, err := pods.Get(t.Context(), "forged", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("forged pod exists: %v", err)
		}
		audit(t, "forged creates")
	})

	t.Run("forged annotations at update", func(t *testing.T) {
		mine, err := s.attacker.CoreV1().Pods(s.ns).Create(t.Context(), s.plainPod("mallory"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		deny := func(what string, err error) {
			t.Helper()
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "may not change the scheduler-owned annotation") {
				t.Errorf("%s: %v, want the webhook's denial", what, err)
			}
		}
		forged := forgedPod("", vgpu, s.g.Name).Annotations
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": forged}})
		_, err = s.attacker.CoreV1().Pods(s.ns).Patch(t.Context(), mine.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		deny("adding them to its own pod", err)
		_, err = s.attacker.CoreV1().Pods(s.ns).Patch(t.Context(), "victim", types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"hami.io/vgpu-devices-allocated":null,"hami.io/vgpu-node":null}}}`), metav1.PatchOptions{})
		deny("removing the victim's (its GPU would count as free)", err)
		_, err = s.attacker.CoreV1().Pods(s.ns).Patch(t.Context(), "victim", types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"hami.io/bind-phase":"failed"}}}`), metav1.PatchOptions{})
		deny("changing the victim's bind-phase", err)
		// Other annotations are the user's; the trusted identities may change these.
		if _, err := s.attacker.CoreV1().Pods(s.ns).Patch(t.Context(), "victim", types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"team":"a"}}}`), metav1.PatchOptions{}); err != nil {
			t.Errorf("another annotation: %v", err)
		}
		bindTime := victim.Annotations[allocation.KeyBindTime] + "0"
		if _, err := pods.Patch(t.Context(), "victim", types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"hami.io/bind-time":"`+bindTime+`"}}}`), metav1.PatchOptions{}); err != nil {
			t.Errorf("system:masters changing bind-time: %v", err)
		}
		got := s.get(t, "victim")
		if got.Annotations[allocation.KeyBindTime] != bindTime || got.Annotations[annotation.KeyNVIDIAAllocated] != victim.Annotations[annotation.KeyNVIDIAAllocated] ||
			got.Annotations[allocation.KeyBindPhase] != string(allocation.PhaseSuccess) {
			t.Errorf("victim's annotations after the updates: %v", got.Annotations)
		}
		audit(t, "forged updates")
	})

	t.Run("foreign pod to /bind", func(t *testing.T) {
		// Issue #3030: a name that does not exist with the victim's UID; the victim's name
		// with another UID; the victim's name in another namespace.
		before := s.podSeries(t, "victim")
		for _, args := range []extenderv1.ExtenderBindingArgs{
			{PodName: "ghost", PodNamespace: s.ns, PodUID: victim.UID, Node: s.g.Name},
			{PodName: "victim", PodNamespace: s.ns, PodUID: "forged-uid", Node: s.g.Name},
			{PodName: "victim", PodNamespace: "default", PodUID: victim.UID, Node: s.g.Name},
		} {
			body, code, err := s.post(t, certs.client[cnScheduler], extender.PathBind, args)
			if err != nil {
				t.Fatal(err)
			}
			var res extenderv1.ExtenderBindingResult
			if err := json.Unmarshal(body, &res); err != nil || code != 200 || !strings.Contains(res.Error, "pod not found") {
				t.Errorf("bind %s/%s uid %s: %d %s, want \"pod not found\"", args.PodNamespace, args.PodName, args.PodUID, code, body)
			}
		}
		if after := s.podSeries(t, "victim"); strings.Join(after, "\n") != strings.Join(before, "\n") {
			t.Errorf("the victim's usage changed:\n%v\nto\n%v", before, after)
		}
		if l := s.g.Lock(t); l != "" {
			t.Errorf("node lock %q after refused binds", l)
		}
		// The victim's GPU still counts: a pod that needs more than is left of it goes
		// elsewhere (another GPU of the node).
		if _, err := pods.Create(t.Context(), s.gpuPod("second", 30000, 60), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		second := s.admit(t, "second", 2*time.Minute)
		if g := strings.Split(second.Annotations[annotation.KeyNVIDIAAllocated], ",")[0]; g == vgpu {
			t.Errorf("second pod placed on the victim's GPU %s", g)
		}
		audit(t, "foreign binds")
	})

	t.Run("no client certificate", func(t *testing.T) {
		args := extenderv1.ExtenderBindingArgs{PodName: "ghost", PodNamespace: s.ns, Node: s.g.Name}
		for name, kp := range map[string]keyPair{"none": {}, "another CA": certs.foreign, "a name not allowed": certs.client[cnMallory]} {
			for _, route := range []string{extender.PathFilter, extender.PathBind, extender.PathWebhook} {
				if body, code, err := s.post(t, kp, route, args); !isTLSRefusal(err) {
					t.Errorf("%s %s: %d %s %v, want the TLS handshake refused", name, route, code, body, err)
				}
			}
		}
		audit(t, "requests without a client certificate")
	})

	t.Run("finished lock owner", func(t *testing.T) {
		// The lock's owner failed (as the kubelet's admission leaves a pod) a second after
		// taking it: the next pod binds without waiting for the 5-minute expiry.
		owner, err := pods.Create(t.Context(), s.plainPod("owner"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		owner.Status.Phase = corev1.PodFailed
		if _, err := pods.UpdateStatus(t.Context(), owner, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		lock := nodelock.NewLock(time.Now(), types.NamespacedName{Namespace: s.ns, Name: "owner"}).String()
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{nodelock.Key: lock}}})
		if _, err := cp.AdminClient().CoreV1().Nodes().Patch(t.Context(), s.g.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := pods.Create(t.Context(), s.gpuPod("next", 1000, 10), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		s.admit(t, "next", time.Minute)
		if took := time.Since(start); took > time.Minute {
			t.Errorf("bound after %v", took)
		} else {
			t.Logf("bound %v after a finished owner's lock", took.Round(time.Millisecond))
		}
		harness.Eventually(t, "the lock released after the allocation", 30*time.Second, func() bool { return s.g.Lock(t) == "" })
		audit(t, "the finished lock owner")
	})
}

// TestAutoscalerFilterWritesNothing: a /filter with whole Node objects in ExtenderArgs.Nodes
// (what the Cluster Autoscaler sends when it simulates a node) changes nothing: the API server
// sees no write (a watch on the pod, the namespace's Events and the node from the
// resourceVersion before the call sees nothing until well after it) and the extender's usage
// holds nothing for the pod.
func TestAutoscalerFilterWritesNothing(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := harness.Context(t)
	pods := cp.AdminClient().CoreV1().Pods(s.ns)
	// A pending pod no scheduler takes, asking a GPU.
	p := s.gpuPod("simulated", 1000, 10)
	p.Spec.SchedulerName = "autoscaler-simulation"
	pod, err := pods.Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node := cp.GetNode(t, s.g.Name)
	events, err := cp.AdminClient().CoreV1().Events(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	watches := map[string]watch.Interface{}
	opts := func(rv string, sel fields.Selector) metav1.ListOptions {
		return metav1.ListOptions{ResourceVersion: rv, FieldSelector: sel.String()}
	}
	if watches["pod"], err = pods.Watch(ctx, opts(pod.ResourceVersion, fields.OneTermEqualSelector("metadata.name", pod.Name))); err != nil {
		t.Fatal(err)
	}
	if watches["events"], err = cp.AdminClient().CoreV1().Events(s.ns).Watch(ctx, opts(events.ResourceVersion, fields.Everything())); err != nil {
		t.Fatal(err)
	}
	if watches["node"], err = cp.AdminClient().CoreV1().Nodes().Watch(ctx, opts(node.ResourceVersion, fields.OneTermEqualSelector("metadata.name", node.Name))); err != nil {
		t.Fatal(err)
	}
	for _, w := range watches {
		defer w.Stop()
	}
	args := extenderv1.ExtenderArgs{Pod: pod, Nodes: &corev1.NodeList{Items: []corev1.Node{*node}}}
	body, code, err := s.post(t, certs.client[cnScheduler], extender.PathFilter, args)
	if err != nil || code != 200 {
		t.Fatalf("filter: %d %s %v", code, body, err)
	}
	var res extenderv1.ExtenderFilterResult
	if err := json.Unmarshal(body, &res); err != nil {
		t.Fatal(err)
	}
	if res.Error != "" || res.Nodes == nil || len(res.Nodes.Items) != 1 || res.Nodes.Items[0].Name != node.Name {
		t.Errorf("filter answered %s, want the node back", body)
	}
	// Writes of the call would be in the watches well within this.
	deadline := time.After(3 * time.Second)
	for done := false; !done; {
		select {
		case ev := <-watches["pod"].ResultChan():
			t.Errorf("the API server saw the pod written: %s %v", ev.Type, annotationsOf(ev.Object))
		case ev := <-watches["events"].ResultChan():
			t.Errorf("the API server saw an Event written: %s %+v", ev.Type, ev.Object)
		case ev := <-watches["node"].ResultChan():
			if n, ok := ev.Object.(*corev1.Node); ok && n.Annotations[nodelock.Key] != node.Annotations[nodelock.Key] {
				t.Errorf("the API server saw the node lock written: %q", n.Annotations[nodelock.Key])
			}
		case <-deadline:
			done = true
		}
	}
	if got := s.get(t, pod.Name); got.ResourceVersion != pod.ResourceVersion {
		t.Errorf("pod resourceVersion %s, was %s: written", got.ResourceVersion, pod.ResourceVersion)
	}
	if series := s.podSeries(t, pod.Name); len(series) > 0 {
		t.Errorf("the extender's usage holds the simulated pod: %v", series)
	}
	audit(t, "the autoscaler's filter")
}

func annotationsOf(obj any) map[string]string {
	if p, ok := obj.(*corev1.Pod); ok {
		return p.Annotations
	}
	return nil
}
