package doctor_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// noScheduler is a scheduler name nobody serves: the holders the tests bind by hand must not
// be placed by the default-scheduler profile other tests of the package run.
const noScheduler = "e2e-nobody"

// The bind side of a GPU pod (P4–P7), each reproduced with kube-scheduler, examples/extender,
// the kubelet's device manager and examples/deviceplugin --simulate, diagnosed with
// diagnose.Pod, repaired as the report says, and taken to S3 by the test's Allocate.

// TestP4PluginNeverReleases: pod 1 is bound and allocated; its node lock is then left on the
// node as a device plugin without HAMi's protocol leaves it (HAMi §8.1, #1130: the lock stays
// until the 5 min timeout). Pod 2 on the same node gets BindingFailed "node <n> has been
// locked within 5m0s" → P4-NodeLocked with NodeLockNeverReleased; `kubectl hami-doctor unlock
// <node>` (the plugin binary's dry run) shows the lock and its holder and writes nothing;
// `unlock <node> --yes` removes it, kube-scheduler retries pod 2, which binds and reaches S3.
func TestP4PluginNeverReleases(t *testing.T) {
	t.Parallel()
	harness.BuildDoctor(t, cp.Dir()) // before the scenario: the build takes a while
	g := gpuNode(t)
	h := startBindHAMi(t, g, "--node-lock-retry-timeout=-1s") // fail a bind at once, as HAMi v2.9.0

	holder := h.waitBound(t, h.create(t, "holder").Name)
	left := g.Lock(t) // "<bind time>,<ns>,holder"
	if !strings.HasSuffix(left, ","+g.Namespace+",holder") {
		t.Fatalf("lock of bound pod holder: %q", left)
	}
	if _, err := g.Admit(t.Context(), holder); err != nil {
		t.Fatal(err)
	}
	g.WantProtocolEnd(t, "holder", allocation.PhaseSuccess)
	setNodeLock(t, g.Name, left) // what a plugin that never releases leaves

	h.create(t, "second")
	waitEvent(t, g.Namespace, "second", "BindingFailed", "node "+g.Name+" has been locked within")
	opts := h.opts(0)
	r := waitCase(t, g.Namespace, "second", opts, diagnose.P4NodeLocked)
	wantCase(t, r, diagnose.P4NodeLocked, diagnose.CodeNodeLocked, fmt.Sprintf("node %s: %s = %q", g.Name, nodelock.Key, left), "")
	wantCase(t, r, diagnose.P4NodeLocked, diagnose.CodeLockNeverReleased, "is done allocating (bind-phase success)", "kubectl hami-doctor unlock "+g.Name+" --yes")
	if r.Lock == nil {
		t.Fatal("no lock in the report")
	}
	if l := r.Lock; l.Node != g.Name || l.Value != left || l.Holder != g.Namespace+"/holder" || !l.HolderExists ||
		l.HolderBindPhase != string(allocation.PhaseSuccess) || l.Stale == "" || l.Expired {
		t.Errorf("lock %+v, want holder %s/holder, success, stale and not expired", *l, g.Namespace)
	}

	// The plugin's dry run shows the lock and its holder and writes nothing.
	dry := doctorCLI(t, "", opts, "unlock", g.Name)
	if dry.Code != 0 {
		t.Errorf("unlock %s (dry run): exit %d, want 0 (removable)", g.Name, dry.Code)
	}
	for _, want := range []string{fmt.Sprintf("hami.io/mutex.lock = %q", left), "Holder   " + g.Namespace + "/holder", "Nothing written"} {
		if !strings.Contains(dry.Stdout, want) {
			t.Errorf("unlock %s (dry run) prints no %q:\n%s", g.Name, want, dry.Stdout)
		}
	}
	if l := g.Lock(t); l != left {
		t.Fatalf("lock after the dry run: %q, want it unchanged %q", l, left)
	}

	// The fix, as the report says: kubectl hami-doctor unlock <node> --yes.
	fix := doctorCLI(t, "", opts, "unlock", g.Name, "--yes")
	if fix.Code != 0 || !strings.Contains(fix.Stdout, fmt.Sprintf("Removed hami.io/mutex.lock %q from node %s.", left, g.Name)) {
		t.Fatalf("unlock %s --yes: exit %d, want 0 and the lock removed:\n%s%s", g.Name, fix.Code, fix.Stdout, fix.Stderr)
	}
	if l := g.Lock(t); l != "" {
		t.Fatalf("lock after the repair: %q", l)
	}
	allocated(t, g, "second", opts)
}

// TestP4StaleLock: locks that stop a pod although nobody should wait for them, and the lock
// of a deleted holder. The SDK's extender (nodelock) takes over a lock whose holder is gone,
// so that one stops no pod: it is found with diagnose.LockOf on the node (Stale, holder gone)
// and removed with RemoveStaleLock; a pod after it is not stopped either way. The two locks
// that do stop a pod for real, with the extender refusing the bind: HAMi's legacy value (a
// time alone, naming no pod: no plugin releases it) within the timeout, and a holder that
// exists but was bound to another node.
func TestP4StaleLock(t *testing.T) {
	t.Parallel()
	g := gpuNode(t)
	h := startBindHAMi(t, g, "--node-lock-retry-timeout=-1s")
	opts := h.opts(0)

	// stopped creates the pod while the node carries value, waits for the extender's refusal
	// and the P4 diagnosis with the code, repairs the lock as the report says and takes the pod
	// to S3.
	stopped := func(t *testing.T, name, value, code string) *diagnose.PodReport {
		t.Helper()
		setNodeLock(t, g.Name, value)
		h.create(t, name)
		waitEvent(t, g.Namespace, name, "BindingFailed", "node "+g.Name+" has been locked within")
		r := waitCase(t, g.Namespace, name, opts, diagnose.P4NodeLocked)
		wantCase(t, r, diagnose.P4NodeLocked, diagnose.CodeNodeLocked, fmt.Sprintf("node %s: %s = %q", g.Name, nodelock.Key, value), "")
		f := wantCase(t, r, diagnose.P4NodeLocked, code, "node "+g.Name+": ", "kubectl hami-doctor unlock "+g.Name+" --yes")
		t.Logf("%s: %q", f.Summary, f.Evidence)
		if r.Lock == nil || r.Lock.Value != value || r.Lock.Stale == "" {
			t.Fatalf("lock in the report: %s, want %q and stale", dump(r.Lock), value)
		}
		if err := diagnose.RemoveStaleLock(t.Context(), cp.AdminClient(), *r.Lock, opts); err != nil {
			t.Fatalf("RemoveStaleLock: %v", err)
		}
		allocated(t, g, name, opts)
		return r
	}

	t.Run("legacy value naming no pod", func(t *testing.T) {
		r := stopped(t, "after-legacy", time.Now().UTC().Format(time.RFC3339), diagnose.CodeLockStale)
		if r.Lock.Holder != "" || r.Lock.HolderExists {
			t.Errorf("a legacy lock has a holder: %+v", *r.Lock)
		}
	})

	t.Run("holder bound to another node", func(t *testing.T) {
		// The holder exists and runs elsewhere: a bind of it to this node failed, the lock
		// left behind, and it was placed on another node (bound with a plain Binding here).
		other := cp.CreateNode(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: harness.UniqueName("other")}})
		holder := create(t, gpuPod(g.Namespace, "elsewhere", noScheduler, map[string]string{harness.GPUResource: "1"}, nil))
		cp.Bind(t, holder, other.Name)
		value := nodelock.NewLock(time.Now(), types.NamespacedName{Namespace: g.Namespace, Name: "elsewhere"}).String()
		r := stopped(t, "after-elsewhere", value, diagnose.CodeLockStale)
		if !r.Lock.HolderExists || r.Lock.HolderNode != other.Name {
			t.Errorf("lock %+v, want a holder on %s", *r.Lock, other.Name)
		}
	})

	t.Run("holder deleted", func(t *testing.T) {
		holder := create(t, gpuPod(g.Namespace, "gone", noScheduler, map[string]string{harness.GPUResource: "1"}, nil))
		value := nodelock.NewLock(time.Now(), types.NamespacedName{Namespace: g.Namespace, Name: holder.Name}).String()
		setNodeLock(t, g.Name, value)
		if err := cp.AdminClient().CoreV1().Pods(g.Namespace).Delete(t.Context(), holder.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		harness.Eventually(t, "holder gone", 20*time.Second, func() bool { _, ok := g.Pod(t, holder.Name); return !ok })
		l, err := diagnose.LockOf(t.Context(), cp.AdminClient(), g.Name, opts)
		if err != nil {
			t.Fatalf("LockOf: %v", err)
		}
		if l.Value != value || l.Holder != g.Namespace+"/gone" || l.HolderExists || l.Stale == "" {
			t.Fatalf("LockOf = %+v, want the value %q of a holder that is gone, stale", *l, value)
		}
		t.Logf("stale: %s", l.Stale)
		if err := diagnose.RemoveStaleLock(t.Context(), cp.AdminClient(), *l, opts); err != nil {
			t.Fatalf("RemoveStaleLock: %v", err)
		}
		if got := g.Lock(t); got != "" {
			t.Fatalf("lock after the repair: %q", got)
		}
		if _, err := diagnose.LockOf(t.Context(), cp.AdminClient(), g.Name, opts); !errors.Is(err, diagnose.ErrNoLock) {
			t.Errorf("LockOf after the repair: %v, want ErrNoLock", err)
		}
		// Not repaired, the same lock does not stop a pod: the extender takes it over.
		setNodeLock(t, g.Name, value)
		allocated(t, g, h.create(t, "after-gone").Name, opts)
	})
}

// TestP5PluginStoppedAfterBind: the pod is bound (bind-phase allocating) and the node's
// device plugin stops before the kubelet's Allocate: the device manager reports the devices
// unhealthy, the kubelet's node status 0 allocatable. With AllocateWait 2 s the diagnosis is
// P5-AllocateNeverCame with the node's diagnosis attached; starting the plugin again lets
// the kubelet admit the pod: S3.
func TestP5PluginStoppedAfterBind(t *testing.T) {
	t.Parallel()
	g := gpuNode(t)
	h := startBindHAMi(t, g)
	pod := h.waitBound(t, h.create(t, "late").Name)

	g.Plugin.Stop(t)
	harness.Eventually(t, "the device manager without healthy "+harness.GPUResource, 20*time.Second, func() bool {
		res, err := g.DM.Capacity(t.Context())
		return err == nil && res.Allocatable[harness.GPUResource] == 0
	})
	if err := g.DM.UpdateNodeStatus(t.Context(), cp.AdminClient().CoreV1(), g.Name); err != nil {
		t.Fatal(err)
	}
	r := waitCase(t, g.Namespace, "late", h.opts(2*time.Second), diagnose.P5AllocateNeverCame)
	wantCase(t, r, diagnose.P5AllocateNeverCame, diagnose.CodeAllocateLate, "node "+g.Name+": allocatable "+harness.GPUResource+" = 0", "")
	if len(r.Nodes) == 0 || r.Nodes[0].Node != g.Name {
		t.Errorf("the report hands over to no diagnosis of node %s: %+v", g.Name, r.Nodes)
	}
	if r.Stage != diagnose.StageBound {
		t.Errorf("stage %s, want S2", r.Stage)
	}

	// The fix: the plugin runs again and registers; the kubelet retries the pod.
	g.StartPlugin(t)
	harness.WaitForResources(t, g.DM, harness.GPUResource, harness.SimulatedGPUs*harness.DefaultSplit, harness.SimulatedGPUs*harness.DefaultSplit)
	g.MakeReady(t)
	allocated(t, g, pod.Name, h.opts(0))
}

// TestP6CountMismatch: the kubelet asks the plugin for a different count than the pod's
// entry holds. The pod asks nvidia.com/gpu 1 and the extender writes one device; the entry
// is then rewritten with two devices, as a scheduler whose count disagrees with the
// kubelet's leaves it (a count from another resource name, an edit), so the plugin's
// Allocate fails with "device number not matched"; the test writes the pod status as the
// kubelet does (Failed, UnexpectedAdmissionError, "Allocate failed due to rpc error: …").
// The diagnosis is P6-AllocateFailed with DeviceNumberNotMatched; recreating the pod, as the
// report says, gets it to S3.
func TestP6CountMismatch(t *testing.T) {
	t.Parallel()
	g := gpuNode(t)
	h := startBindHAMi(t, g)
	pod := h.waitBound(t, h.create(t, "mismatch").Name)

	key := annotation.KeyNVIDIAToAllocate
	pd, err := allocation.DecodePodDevices(pod.Annotations[key], allocation.VersionMaster)
	if err != nil || len(pd) != 1 || len(pd[0]) != 1 {
		t.Fatalf("%s = %q (%v), want one entry of one device", key, pod.Annotations[key], err)
	}
	extra := g.Share(0, 1000, 0)
	if extra.UUID == pd[0][0].UUID {
		extra = g.Share(1, 1000, 0)
	}
	pd[0] = append(pd[0], extra)
	cp.PatchPodAnnotation(t, pod, key, allocation.EncodePodDevices(pd))
	pod, _ = g.Pod(t, pod.Name)
	_, err = g.Admit(t.Context(), pod)
	if err == nil || !strings.Contains(err.Error(), "device number not matched") {
		t.Fatalf("Allocate: %v, want device number not matched", err)
	}
	g.FailAdmission(t, pod, err)

	r := waitCase(t, g.Namespace, pod.Name, h.opts(0), diagnose.P6AllocateFailed)
	f := wantCase(t, r, diagnose.P6AllocateFailed, diagnose.CodeNumberMismatch, "device number not matched", "kubectl -n "+g.Namespace)
	t.Logf("evidence: %q; fix: %q", f.Evidence, f.Fix)

	// The fix: create the pod again (a failed admission never retries).
	allocated(t, g, recreate(t, pod, func(*corev1.Pod) {}).Name, h.opts(0))
}

// TestP7NodeRestartedAfterFilter: the pod is filtered (hami.io/vgpu-node and the device
// annotations written) but never bound: its bind waits in the extender for the node lock of
// another pod, and kube-scheduler is killed meanwhile, cutting the bind off. The other pod
// is then admitted (its lock released), and the node restarts: its Ready condition goes
// NotReady and Ready again after hami.io/vgpu-time. The diagnosis is P7-StaleAssignment with
// NodeRestartedAfterFilter; clearing the annotations (the report's kubectl annotate) and a
// kube-scheduler running again (the component that retries the Pending pod) get it to S3.
func TestP7NodeRestartedAfterFilter(t *testing.T) {
	t.Parallel()
	g := gpuNode(t)
	h := startBindHAMi(t, g, "--node-lock-retry-timeout=60s")
	first := h.waitBound(t, h.create(t, "first").Name)

	h.create(t, "stale")
	var pod *corev1.Pod
	harness.Eventually(t, "pod stale filtered onto "+g.Name, 30*time.Second, func() bool {
		p, ok := g.Pod(t, "stale")
		pod = p
		return ok && p.Annotations[allocation.KeyNode] == g.Name
	})
	h.kill(t)
	if _, err := g.Admit(t.Context(), first); err != nil {
		t.Fatal(err)
	}
	g.WantProtocolEnd(t, "first", allocation.PhaseSuccess)
	pod, _ = g.Pod(t, "stale")
	if pod.Spec.NodeName != "" || pod.Annotations[allocation.KeyBindPhase] != "" {
		t.Fatalf("pod stale got bound: node %q, bind-phase %q", pod.Spec.NodeName, pod.Annotations[allocation.KeyBindPhase])
	}
	restartNode(t, g.Name, unixTime(t, pod, allocation.KeyTime))

	r := waitCase(t, g.Namespace, "stale", h.opts(2*time.Second), diagnose.P7StaleAssignment)
	wantCase(t, r, diagnose.P7StaleAssignment, diagnose.CodeNodeRestarted, "node "+g.Name+": Ready=True since", "annotate pod stale hami.io/vgpu-node-")
	if r.Stage != diagnose.StageFiltered || r.Lock != nil && r.Lock.Value != "" {
		t.Errorf("stage %s, lock %+v, want S1 and no lock", r.Stage, r.Lock)
	}

	// The fix: clear the filter's annotations; kube-scheduler, running again, retries.
	clearHAMiAnnotations(t, pod)
	h.restart(t)
	allocated(t, g, "stale", h.opts(0))
}
