package register_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/register"
)

// startRun runs w.Run in the background and returns a function that cancels it and checks
// that it returned nil. In a synctest bubble the 10 s it waits for Run are the bubble's fake
// time.
func startRun(ctx context.Context, t *testing.T, w *register.Writer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	stopped := false
	stop = func() {
		t.Helper()
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after cancellation")
		}
	}
	t.Cleanup(stop)
	return stop
}

// step waits until every other goroutine of the test's synctest bubble is blocked, checks that
// Run then waits on its timer, and advances the fake clock.
func step(t *testing.T, clk *testingclock.FakeClock, d time.Duration) {
	t.Helper()
	synctest.Wait()
	if !clk.HasWaiters() {
		t.Fatal("Run does not wait on its timer")
	}
	clk.Step(d)
}

func TestRunSteadyStateAndSetDevices(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		cs := newClientset(newNode(nil))
		clk := testingclock.NewFakeClock(time.Unix(0, 0))
		w, err := newWriter(cs, gpus(8), register.Options{Clock: clk, EventRecorder: &record.FakeRecorder{}})
		if err != nil {
			t.Fatal(err)
		}
		if w.Node() != nil {
			t.Error("Node before Run")
		}
		stop := startRun(ctx, t, w)
		settled(t, "the first write", func() bool { return w.Stats().Writes == 1 })
		settled(t, "the watch's copy of the write", func() bool {
			n := w.Node()
			return n != nil && n.Annotations[annotation.KeyNVIDIARegister] == want(gpus(8))
		})

		// Ten scans with nothing changed, in other orders: ten no-ops, no patch, no GET.
		for i := range 10 {
			w.SetDevices(shuffled(gpus(8)))
			settled(t, "a no-op sync", func() bool { return w.Stats().NoOps == uint64(i+1) })
		}
		if p, g := count(cs, "patch"), count(cs, "get"); p != 1 || g != 0 {
			t.Errorf("after 10 unchanged scans: %d patches, %d gets; want 1, 0", p, g)
		}

		// A device change is written at once, without the clock moving.
		devs := gpus(8)
		devs[3].Health = false
		w.SetDevices(devs)
		settled(t, "the second write", func() bool { return w.Stats().Writes == 2 })
		if got, _ := nodeAnnotation(t, cs, annotation.KeyNVIDIARegister); got != want(devs) {
			t.Errorf("annotation = %s, want %s", got, want(devs))
		}
		stop()
		if w.Node() != nil {
			t.Error("Node after Run returned")
		}
		if s := w.Stats(); s.Heals != 0 || s.Failures != 0 {
			t.Errorf("Stats = %+v", s)
		}
	})
}

// Run writes nothing before the first SetDevices; WaitForSync waits, without polling, until
// the Node carries the devices last set; SetDevices made in a row coalesce.
func TestRunWaitsForDevices(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		cs := newClientset(newNode(nil))
		clk := testingclock.NewFakeClock(time.Unix(0, 0))
		w, err := register.New(cs, nodeName, register.Options{Clock: clk, EventRecorder: &record.FakeRecorder{}})
		if err != nil {
			t.Fatal(err)
		}
		startRun(ctx, t, w)
		synced := make(chan error, 1)
		go func() { synced <- w.WaitForSync(ctx) }()
		synctest.Wait()
		if p := count(cs, "patch"); p != 0 || w.InSync() || len(synced) != 0 {
			t.Fatalf("before SetDevices: %d patches, in sync %v, WaitForSync returned %d", p, w.InSync(), len(synced))
		}
		w.SetDevices(gpus(2))
		settled(t, "the first write", func() bool { return w.Stats().Writes == 1 && len(synced) == 1 })
		if err := <-synced; err != nil || !w.InSync() {
			t.Fatalf("WaitForSync = %v, InSync = %v", err, w.InSync())
		}
		devs := gpus(2)
		devs[1].Health = false
		w.SetDevices(gpus(2)) // superseded before Run looked
		w.SetDevices(devs)
		if w.InSync() {
			t.Error("InSync right after SetDevices with new devices")
		}
		if err := w.WaitForSync(ctx); err != nil {
			t.Fatal(err)
		}
		settled(t, "the write after SetDevices", func() bool { return w.Stats().Writes >= 2 })
		if got, _ := nodeAnnotation(t, cs, annotation.KeyNVIDIARegister); got != want(devs) {
			t.Errorf("annotation = %s, want %s", got, want(devs))
		}
		// The bubble has settled: a third write would have come before settled returned.
		if s := w.Stats(); s.Writes != 2 {
			t.Errorf("Stats = %+v, want 2 writes", s)
		}
	})
}

// A hand-deleted or hand-edited annotation is restored from the watch, without the clock
// moving and without a GET; a change of another annotation triggers nothing.
func TestRunHealsDrift(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		cs := newClientset(newNode(map[string]string{"other": "1"}))
		clk := testingclock.NewFakeClock(time.Unix(0, 0))
		w, err := newWriter(cs, gpus(4), register.Options{Clock: clk, EventRecorder: &record.FakeRecorder{}})
		if err != nil {
			t.Fatal(err)
		}
		startRun(ctx, t, w)
		settled(t, "the first write", func() bool { return w.Stats().Writes == 1 })

		setAnnotations(t, cs, map[string]string{"other": "1"}) // kubectl annotate node gpu-1 key-
		settled(t, "the deleted annotation to be restored", func() bool {
			v, _ := nodeAnnotation(t, cs, annotation.KeyNVIDIARegister)
			return v == want(gpus(4)) && w.Stats().Heals == 1
		})

		setAnnotations(t, cs, map[string]string{"other": "1", annotation.KeyNVIDIARegister: `[{"id":"GPU-x"}]`})
		settled(t, "the edited annotation to be restored", func() bool {
			v, _ := nodeAnnotation(t, cs, annotation.KeyNVIDIARegister)
			return v == want(gpus(4)) && w.Stats().Heals == 2
		})

		before := syncs(w)
		setAnnotations(t, cs, map[string]string{"other": "2", annotation.KeyNVIDIARegister: want(gpus(4))})
		synctest.Wait() // the watch delivered the update and the writer is idle again
		if got := syncs(w); got != before {
			t.Errorf("a change of another annotation caused %d syncs", got-before)
		}
		if g := count(cs, "get"); g != 0 {
			t.Errorf("%d GETs, want 0", g)
		}
		if p := count(cs, "patch"); p != 3 {
			t.Errorf("%d patches, want 3 (write + 2 heals)", p)
		}
	})
}

// A failed write is retried after RetryInitial, doubling up to RetryMax, until it succeeds.
func TestRunRetriesWithBackoff(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		cs := newClientset(newNode(nil))
		failPatches(cs, 4, apierrors.NewServiceUnavailable("apiserver restarting"))
		clk := testingclock.NewFakeClock(time.Unix(0, 0))
		w, err := newWriter(cs, gpus(2), register.Options{Clock: clk, EventRecorder: &record.FakeRecorder{}})
		if err != nil {
			t.Fatal(err)
		}
		startRun(ctx, t, w)
		for i, delay := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second} {
			settled(t, "a failed attempt", func() bool { return w.Stats().Failures == uint64(i+1) })
			w.SetDevices(shuffled(gpus(2))) // an unchanged scan does not cut the backoff short
			synctest.Wait()
			if n := count(cs, "patch"); n != i+1 {
				t.Fatalf("an unchanged SetDevices while failing sent a patch (%d, want %d)", n, i+1)
			}
			step(t, clk, delay-time.Millisecond)
			synctest.Wait() // Run is idle again, still waiting for the last millisecond
			if n := count(cs, "patch"); n != i+1 {
				t.Fatalf("attempt %d came before its %v delay", n, delay)
			}
			clk.Step(time.Millisecond)
		}
		settled(t, "the write after four failures", func() bool { return w.Stats().Writes == 1 })
		if got, _ := nodeAnnotation(t, cs, annotation.KeyNVIDIARegister); got != want(gpus(2)) {
			t.Errorf("annotation = %s", got)
		}
	})
}

// The node does not exist when Run starts: the writer waits on the watch, and writes as soon
// as the Node appears, without the clock moving.
func TestRunWaitsForNode(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		cs := newClientset()
		clk := testingclock.NewFakeClock(time.Unix(0, 0))
		w, err := newWriter(cs, gpus(1), register.Options{Clock: clk, EventRecorder: &record.FakeRecorder{}})
		if err != nil {
			t.Fatal(err)
		}
		startRun(ctx, t, w)
		settled(t, "the node-not-found failure", func() bool {
			return errors.Is(w.Stats().LastError, register.ErrNodeNotFound)
		})
		if _, err := cs.CoreV1().Nodes().Create(ctx, newNode(nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		settled(t, "the write after the node appeared", func() bool { return w.Stats().Writes == 1 })
		if got, _ := nodeAnnotation(t, cs, annotation.KeyNVIDIARegister); got != want(gpus(1)) {
			t.Errorf("annotation = %s", got)
		}
	})
}

// Without an EventRecorder, Run records the failure as an Event on the Node through its own
// broadcaster, and stops the broadcaster when it returns (TestMain checks for leaks).
func TestRunDefaultEventRecorder(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		cs := newClientset(newNode(nil))
		failPatches(cs, -1, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "gpu-1",
			errors.New(`User "system:serviceaccount:kube-system:hami-device-plugin" cannot patch resource "nodes" in API group "" at the cluster scope`)))
		clk := testingclock.NewFakeClock(time.Unix(0, 0))
		w, err := newWriter(cs, gpus(1), register.Options{Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		stop := startRun(ctx, t, w)
		var ev corev1.Event
		settled(t, "the Warning event", func() bool {
			list, err := cs.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
			if err != nil || len(list.Items) == 0 {
				return false
			}
			ev = list.Items[0]
			return true
		})
		stop()
		if ev.Type != corev1.EventTypeWarning || ev.Reason != register.EventReasonFailed ||
			ev.InvolvedObject.Kind != "Node" || ev.InvolvedObject.Name != "gpu-1" || ev.Source.Component != register.EventComponent {
			t.Errorf("event = %+v", ev)
		}
		if !errors.Is(w.Stats().LastError, register.ErrForbidden) {
			t.Errorf("LastError = %v, want ErrForbidden", w.Stats().LastError)
		}
	})
}

func TestRunTwice(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		cs := newClientset(newNode(nil))
		w, err := newWriter(cs, gpus(1), register.Options{Clock: testingclock.NewFakeClock(time.Unix(0, 0)), EventRecorder: &record.FakeRecorder{}})
		if err != nil {
			t.Fatal(err)
		}
		stop := startRun(ctx, t, w)
		settled(t, "the first write", func() bool { return w.Stats().Writes == 1 })
		if err := w.Run(ctx); !errors.Is(err, register.ErrAlreadyRunning) {
			t.Errorf("second Run: %v, want ErrAlreadyRunning", err)
		}
		stop()
		// Sequential runs are fine; the second adopts the value already written.
		stop = startRun(ctx, t, w)
		settled(t, "a no-op sync", func() bool { return w.Stats().NoOps == 1 })
		stop()
		if p := count(cs, "patch"); p != 1 {
			t.Errorf("%d patches, want 1", p)
		}
	})
}

// Run returns promptly when cancelled before the Node was ever listed (e.g. the API server is
// unreachable).
//
// It runs outside a synctest bubble: the reflector reports the failed list to client-go's
// HandleError, whose process-wide back-off (k8s.io/apimachinery/pkg/util/runtime) sleeps for
// its minimum period minus the time since the last error anywhere in the process. That time
// is real time, and a bubble's clock starts in 2000, so in a bubble the reflector would sleep
// for decades of fake time and Run could not return.
func TestRunCancelledBeforeSync(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	cs := newClientset()
	listed := make(chan struct{})
	var once sync.Once
	cs.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		once.Do(func() { close(listed) })
		return true, nil, errors.New("connection refused")
	})
	w, err := newWriter(cs, gpus(1), register.Options{EventRecorder: &record.FakeRecorder{}})
	if err != nil {
		t.Fatal(err)
	}
	stop := startRun(ctx, t, w)
	select {
	case <-listed:
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for a list attempt")
	}
	stop()
}
