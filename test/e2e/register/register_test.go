package register_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/record"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/register"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

const key = annotation.KeyNVIDIARegister

// First write, then many rescans with nothing changed (the node agent's loop pushes the 8 GPUs
// in a new random order every time): no PATCH, no GET, not even a LIST; only the one watch.
// Then a changed device list is written at once, with one PATCH and nothing else.
func TestRegisterFirstWriteThenNoRequests(t *testing.T) {
	t.Parallel()
	ctx := harness.Context(t)
	node := harness.UniqueName("reg-steady")
	createNode(t, node, map[string]string{"owner": "ops"})
	c := newCounter(1)
	w := newWriter(t, countingClient(t, c), node, gpus(8), register.Options{})
	run(ctx, t, w)
	waitForSync(ctx, t, w, 10*time.Second)
	got := annotations(t, node)
	if got[key] != want(gpus(8)) {
		t.Fatalf("annotation after WaitForSync = %q, want %q", got[key], want(gpus(8)))
	}
	if got["owner"] != "ops" {
		t.Errorf("other annotation = %q after the write, want ops", got["owner"])
	}
	// The reflector sends its watch right after the list that Run's first sync waited for.
	harness.Eventually(t, "the watch request", 5*time.Second, func() bool { return c.snapshot()["WATCH nodes"] >= 1 })
	harness.Eventually(t, "the first write counted", 5*time.Second, func() bool { return w.Stats().Writes == 1 })
	startup := c.snapshot()
	t.Logf("startup requests: %v", startup)

	before := syncs(w)
	pushes, stopPushing := pushEvery(ctx, t, w, 50*time.Millisecond, func() []annotation.Device { return gpus(8) })
	harness.Eventually(t, "30 unchanged rescans", 20*time.Second, func() bool { return syncs(w) >= before+30 })
	stopPushing()
	if got, total := c.since(startup); total != 0 {
		t.Errorf("requests during %d pushes of unchanged devices: %v, want none", pushes(), got)
	}
	if s := w.Stats(); s.Writes != 1 || s.Failures != 0 || !w.InSync() {
		t.Errorf("Stats = %+v, in sync %v; want 1 write, no failure, in sync", s, w.InSync())
	}

	changed := gpus(8)
	changed[2].Health = false
	unchanged := c.snapshot()
	w.SetDevices(shuffled(changed))
	d := waitForSync(ctx, t, w, 5*time.Second)
	if got := annotations(t, node)[key]; got != want(changed) {
		t.Errorf("annotation after the change = %q, want %q", got, want(changed))
	}
	if got, _ := c.since(unchanged); !maps.Equal(got, map[string]int{"PATCH nodes": 1}) {
		t.Errorf("requests for a changed device list: %v, want one PATCH", got)
	}
	t.Logf("changed device list written %v after SetDevices", d)
	harness.Eventually(t, "the second write counted", 5*time.Second, func() bool { return w.Stats().Writes == 2 })
}

// A hand-deleted and a hand-edited annotation are restored from the watch within seconds,
// with no rescan loop (nothing calls SetDevices after the first, so no push can be what
// restores them), and without a GET.
func TestRegisterRestoresHandDeletedAndEditedAnnotation(t *testing.T) {
	t.Parallel()
	ctx := harness.Context(t)
	node := harness.UniqueName("reg-heal")
	createNode(t, node, nil)
	c := newCounter(1)
	w := newWriter(t, countingClient(t, c), node, gpus(8), register.Options{})
	run(ctx, t, w)
	waitForSync(ctx, t, w, 10*time.Second)
	if got := annotations(t, node)[key]; got != want(gpus(8)) {
		t.Fatalf("annotation after WaitForSync = %q, want %q", got, want(gpus(8)))
	}

	handPatch(t, node, map[string]*string{key: nil}) // kubectl annotate node NODE hami.io/node-nvidia-register-
	d := harness.Eventually(t, "restore after deletion", 5*time.Second, func() bool { return annotations(t, node)[key] == want(gpus(8)) })
	t.Logf("deleted annotation restored in %v", d)

	garbage := `[{"id":"GPU-edited-by-hand","count":1}]`
	handPatch(t, node, map[string]*string{key: &garbage})
	d = harness.Eventually(t, "restore after edit", 5*time.Second, func() bool { return annotations(t, node)[key] == want(gpus(8)) })
	t.Logf("edited annotation restored in %v", d)

	// A write is counted after its PATCH response arrives, which can be after the GET above saw it.
	harness.Eventually(t, "the heals counted", 5*time.Second, func() bool { return w.Stats().Heals >= 2 })
	if s := w.Stats(); s.Heals != 2 || s.Writes != 3 {
		t.Errorf("Stats = %+v, want 3 writes of which 2 heals", s)
	}
	if n := c.snapshot()["GET nodes"]; n != 0 {
		t.Errorf("%d GETs of the node, want 0", n)
	}
}

// The Node does not exist when the writer starts: it waits on its watch (no retry loop of
// requests, even with a 10 ms retry delay, and none at the node agent's rescans either) and
// writes as soon as the Node is created.
func TestRegisterNodeAppearsLater(t *testing.T) {
	t.Parallel()
	ctx := harness.Context(t)
	node := harness.UniqueName("reg-late")
	c := newCounter(1)
	w := newWriter(t, countingClient(t, c), node, gpus(2), register.Options{RetryInitial: 10 * time.Millisecond, RetryMax: 10 * time.Millisecond})
	run(ctx, t, w)
	harness.Eventually(t, "ErrNodeNotFound", 10*time.Second, func() bool { return errors.Is(w.Stats().LastError, register.ErrNodeNotFound) })
	// Rescans while the Node is missing: unchanged ones do not wake the writer (it waits for the
	// Node on its watch; the unit test TestRunRetriesWithBackoff shows the same while writes
	// fail), a changed one is one failed sync against the watch's cache. A retry timer, had Run
	// armed one, would add failures of its own.
	for range 5 {
		w.SetDevices(shuffled(gpus(2)))
	}
	changed := gpus(2)
	changed[1].Health = false
	w.SetDevices(changed)
	harness.Eventually(t, "the failed sync of the changed rescan", 5*time.Second, func() bool { return w.Stats().Failures >= 2 })
	before := c.snapshot()
	if before["PATCH nodes"] != 0 || before["GET nodes"] != 0 {
		t.Errorf("requests while the node is missing: %v", before)
	}
	if s := w.Stats(); s.Failures != 2 || s.Writes != 0 {
		t.Errorf("Stats = %+v while the node is missing, want 2 failures (start and the changed rescan, no retries)", s)
	}
	createNode(t, node, nil)
	d := waitForSync(ctx, t, w, 5*time.Second)
	if got := annotations(t, node)[key]; got != want(changed) {
		t.Errorf("annotation = %q, want %q", got, want(changed))
	}
	t.Logf("written %v after the node was created; requests before: %v", d, before)
}

// Another writer patches other annotations of the same Node as fast as it can while the
// writer writes, heals and rewrites its key: merge patches of disjoint keys lose nothing.
func TestRegisterConcurrentWriterLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := harness.Context(t)
	node := harness.UniqueName("reg-concurrent")
	createNode(t, node, nil)
	w := newWriter(t, cp.AdminClient(), node, gpus(4), register.Options{})
	run(ctx, t, w)

	const others = 100
	var wg sync.WaitGroup
	othersDone := make(chan struct{})
	wg.Go(func() { // the scheduler, another agent, an operator: keys of their own
		defer close(othersDone)
		for i := range others {
			v := fmt.Sprint(i)
			if err := cp.PatchNodeAnnotations(ctx, node, "", map[string]*string{fmt.Sprintf("other.example/k%d", i%10): &v}); err != nil {
				t.Error(err)
				return
			}
		}
	})
	// Meanwhile, until the other writer is done, the device list changes and the key is
	// deleted by hand. Every other change is waited for (written while the other writer
	// patches); the rest are pushed back to back, so that some arrive while a write is in
	// flight or a heal is pending.
	for i := 0; i < 20 || !closed(othersDone); i++ {
		devs := gpus(4)
		devs[i%4].Health = i%2 == 0
		w.SetDevices(shuffled(devs))
		if i%2 == 1 {
			waitForSync(ctx, t, w, 10*time.Second)
		}
		if i%5 == 0 {
			handPatch(t, node, map[string]*string{key: nil})
		}
	}
	final := gpus(4)
	final[0].Devmem = 40000
	w.SetDevices(shuffled(final))
	wg.Wait()

	harness.Eventually(t, "final device list", 10*time.Second, func() bool { return annotations(t, node)[key] == want(final) })
	got := annotations(t, node)
	for k := range 10 {
		wantV := fmt.Sprint(others - 10 + k)
		if v := got[fmt.Sprintf("other.example/k%d", k)]; v != wantV {
			t.Errorf("other.example/k%d = %q, want %q (lost by a concurrent write)", k, v, wantV)
		}
	}
	t.Logf("stats: %+v", w.Stats())
}

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// The ClusterRole of the package documentation (register.ClusterRoleRules) is all the writer
// needs: list/watch to see its Node, patch to write and heal, create events for a failed
// write (here a value the apiserver rejects as too large).
func TestRegisterMinimalClusterRole(t *testing.T) {
	t.Parallel()
	ctx := harness.Context(t)
	role := harness.UniqueName("hamireg-register")
	_, err := cp.AdminClient().RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules:      register.ClusterRoleRules(),
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create cluster role: %v", err)
	}
	ns := harness.UniqueName("reg-rbac")
	client, err := cp.ServiceAccountClient(ctx, ns, "device-plugin", role)
	if err != nil {
		t.Fatal(err)
	}
	node := harness.UniqueName("reg-rbac")
	createNode(t, node, nil)
	w := newWriter(t, client, node, gpus(2), register.Options{})
	run(ctx, t, w)
	waitForSync(ctx, t, w, 10*time.Second)
	if got := annotations(t, node)[key]; got != want(gpus(2)) {
		t.Fatalf("annotation written with the minimal role = %q, want %q", got, want(gpus(2)))
	}
	handPatch(t, node, map[string]*string{key: nil})
	harness.Eventually(t, "heal with the minimal role", 5*time.Second, func() bool { return annotations(t, node)[key] == want(gpus(2)) })

	huge := gpus(1)
	huge[0].Type = strings.Repeat("X", 300<<10) // annotations are limited to 256 KiB in all
	// A device list the apiserver rejects (too large) is written at once, and fails.
	w.SetDevices(huge)
	harness.Eventually(t, "the rejected write", 10*time.Second, func() bool { return errors.Is(w.Stats().LastError, register.ErrAPI) })
	if err := w.Stats().LastError; !apierrors.IsInvalid(err) {
		t.Errorf("LastError = %v, want an Invalid error from the apiserver", err)
	}
	if w.InSync() {
		t.Error("InSync after the rejected write")
	}
	ev := waitForEvent(t, node)
	t.Logf("event recorded by the service account: %s %s %.120s…", ev.Type, ev.Reason, ev.Message)
}

// A ServiceAccount that may not patch nodes gets the classified error naming itself and the
// check to run, and the writer records a Warning Event on the Node.
func TestRegisterForbiddenNamesServiceAccount(t *testing.T) {
	t.Parallel()
	ctx := harness.Context(t)
	role := harness.UniqueName("reg-readonly")
	_, err := cp.AdminClient().RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create cluster role: %v", err)
	}
	ns := harness.UniqueName("reg-forbidden")
	client, err := cp.ServiceAccountClient(ctx, ns, "limited", role)
	if err != nil {
		t.Fatal(err)
	}
	node := harness.UniqueName("reg-forbidden")
	createNode(t, node, nil)

	// One-shot Sync (GET + PATCH) returns the error, once it has devices to write.
	w, err := register.New(client, node, register.Options{EventRecorder: &record.FakeRecorder{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(ctx); !errors.Is(err, register.ErrNoDevices) {
		t.Fatalf("Sync before SetDevices: %v, want ErrNoDevices", err)
	}
	w.SetDevices(gpus(1))
	err = w.Sync(ctx)
	if !errors.Is(err, register.ErrForbidden) || !apierrors.IsForbidden(err) {
		t.Fatalf("Sync: %v, want ErrForbidden wrapping the apiserver's Forbidden", err)
	}
	check := fmt.Sprintf("kubectl auth can-i patch nodes --as=system:serviceaccount:%s:limited", ns)
	if !strings.Contains(err.Error(), check) || !strings.Contains(err.Error(), "ServiceAccount "+ns+"/limited") {
		t.Errorf("error %q does not name the ServiceAccount and %q", err, check)
	}
	t.Logf("classified error: %v", err)

	// Run keeps retrying, keeps the error, and records the Warning Event on the Node.
	w2 := newWriter(t, client, node, gpus(1), register.Options{})
	run(ctx, t, w2)
	harness.Eventually(t, "the forbidden error in Stats", 10*time.Second, func() bool { return errors.Is(w2.Stats().LastError, register.ErrForbidden) })
	ev := waitForEvent(t, node)
	if !strings.Contains(ev.Message, check) {
		t.Errorf("event message %q lacks %q", ev.Message, check)
	}
	if _, ok := annotations(t, node)[key]; ok || w2.InSync() {
		t.Errorf("annotation present %v, in sync %v, without permission", ok, w2.InSync())
	}
}

// waitForEvent waits for the writer's Warning Event on node and returns it.
func waitForEvent(t *testing.T, node string) corev1.Event {
	t.Helper()
	var ev corev1.Event
	sel := fields.Set{"involvedObject.kind": "Node", "involvedObject.name": node, "reason": register.EventReasonFailed}.AsSelector().String()
	harness.Eventually(t, "the Warning event on the node", 20*time.Second, func() bool {
		list, err := cp.AdminClient().CoreV1().Events(metav1.NamespaceDefault).List(t.Context(), metav1.ListOptions{FieldSelector: sel})
		if err != nil || len(list.Items) == 0 {
			return false
		}
		ev = list.Items[0]
		return true
	})
	if ev.Type != corev1.EventTypeWarning || ev.Source.Component != register.EventComponent {
		t.Errorf("event = %s %s from %q", ev.Type, ev.Reason, ev.Source.Component)
	}
	return ev
}

// The apiserver is stopped while the writer runs and the device list changes (one
// SetDevices, no rescan loop); the write fails and is retried with backoff; once the
// apiserver is back, the writer recovers by itself and the final annotation is the current
// device list. Not parallel: the apiserver is down for a while.
func TestRegisterRecoversFromAPIServerRestart(t *testing.T) {
	ctx := harness.Context(t)
	node := harness.UniqueName("reg-restart")
	createNode(t, node, nil)
	w := newWriter(t, cp.AdminClient(), node, gpus(8), register.Options{})
	run(ctx, t, w)
	waitForSync(ctx, t, w, 10*time.Second)
	if got := annotations(t, node)[key]; got != want(gpus(8)) {
		t.Fatalf("annotation after WaitForSync = %q, want %q", got, want(gpus(8)))
	}

	t.Cleanup(func() { // whatever happens, leave the apiserver running for the other tests
		if cp.APIServerPid() == 0 {
			if err := cp.StartAPIServer(context.Background()); err != nil {
				t.Errorf("start apiserver: %v", err)
			}
		}
	})
	stopStart := time.Now()
	if err := cp.StopAPIServer(); err != nil {
		// Killed after the harness's grace period: stopped all the same, like a crash.
		t.Logf("stop apiserver: %v", err)
	}
	t.Logf("apiserver stopped in %v", time.Since(stopStart))
	changed := gpus(8)
	changed[5].Health = false // a GPU fell off the bus while the control plane was down
	w.SetDevices(shuffled(changed))
	harness.Eventually(t, "a failed write", 10*time.Second, func() bool { return w.Stats().Failures >= 1 })
	// Two retries with backoff: after 1 s, then 2 s more.
	harness.Eventually(t, "two retries", 15*time.Second, func() bool { return w.Stats().Failures >= 3 })
	failures := w.Stats().Failures
	if w.InSync() {
		t.Error("InSync while the apiserver is down")
	}
	if err := cp.StartAPIServer(ctx); err != nil {
		t.Fatalf("start apiserver: %v", err)
	}
	d := harness.Eventually(t, "recovery", 30*time.Second, func() bool {
		n, err := cp.AdminClient().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && n.Annotations[key] == want(changed)
	})
	t.Logf("recovered %v after the apiserver was ready; %d failed attempts while it was down", d, failures)
	harness.Eventually(t, "LastError cleared", 10*time.Second, func() bool { return w.Stats().LastError == nil && w.InSync() })
	// The watch is back too: a hand deletion is healed. client-go's reflector backs off up to
	// 30 s between watch attempts while the apiserver is down, so the first heal after an
	// outage can take that long; later ones are immediate again.
	handPatch(t, node, map[string]*string{key: nil})
	d = harness.Eventually(t, "heal after the restart", 45*time.Second, func() bool { return annotations(t, node)[key] == want(changed) })
	t.Logf("first heal after the restart took %v", d)
}
