package schedcache

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

func TestHolderMatches(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		holder, id string
		want       bool
	}{
		"equal":                        {"sched-0", "sched-0", true},
		"kube-scheduler identity":      {"sched-0_6f1c2a3e-8d2b-4c55-9f0e-1a2b3c4d5e6f", "sched-0", true},
		"prefix without separator":     {"sched-01_6f1c2a3e", "sched-0", false},
		"other host":                   {"sched-1_6f1c2a3e", "sched-0", false},
		"empty holder":                 {"", "sched-0", false},
		"empty identity":               {"sched-0", "", false},
		"identity longer than holder":  {"sched", "sched-0", false},
		"separator only":               {"sched-0_", "sched-0", true},
		"HAMi issue 2154: node-1 / 10": {"node-10_abc", "node-1", false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := HolderMatches(tc.holder, tc.id); got != tc.want {
				t.Errorf("HolderMatches(%q, %q) = %v, want %v", tc.holder, tc.id, got, tc.want)
			}
		})
	}
}

func lease(holder string, seconds int32) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "hami", Name: "hami-scheduler"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To(seconds)},
	}
}

// runLeader runs r until the test ends and checks that Run returns nil.
func runLeader(ctx context.Context, t *testing.T, r interface{ Run(context.Context) error }) context.CancelFunc {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func TestLeaseFollower(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		client := fake.NewClientset(lease("sched-0_1234", 15))
		clk := clocktesting.NewFakeClock(t0)
		f, err := NewLeaseFollower(client, FollowerOptions{Namespace: "hami", Name: "hami-scheduler", Identity: "sched-0", Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		runLeader(ctx, t, f)
		synctest.Wait()
		if !f.IsLeader() {
			t.Fatal("not leading once the bubble settled")
		}
		term := f.Term()
		if !term.Leading || term.Seq != 1 {
			t.Fatalf("term = %+v", term)
		}
		if err := f.Run(ctx); !errors.Is(err, ErrAlreadyRunning) {
			t.Errorf("second Run = %v", err)
		}

		// No renewal observed within the lease duration: leadership lapses.
		clk.Step(16 * time.Second)
		synctest.Wait()
		select {
		case <-term.Changed:
		default:
			t.Fatal("term did not end when the lease lapsed")
		}
		if f.IsLeader() {
			t.Error("still leader after the lease lapsed")
		}

		// A renewal by us: leading again. A holder that merely shares the prefix: not leading.
		update := func(holder string) {
			l, err := client.CoordinationV1().Leases("hami").Get(ctx, "hami-scheduler", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			l.Spec.HolderIdentity = ptr.To(holder)
			l.Spec.RenewTime = &metav1.MicroTime{Time: clk.Now()}
			if _, err := client.CoordinationV1().Leases("hami").Update(ctx, l, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		update("sched-0_1234")
		synctest.Wait()
		if !f.IsLeader() {
			t.Fatal("not leading again once the bubble settled")
		}
		update("sched-01_9999")
		synctest.Wait()
		if f.IsLeader() {
			t.Fatal("still leading once the bubble settled")
		}
		if got := f.Term().Seq; got != 4 {
			t.Errorf("term seq = %d, want 4 (gain, lapse, gain, loss)", got)
		}
		if err := client.CoordinationV1().Leases("hami").Delete(ctx, "hami-scheduler", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})
}

func TestElectorTakeover(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		client := fake.NewClientset()
		opts := ElectorOptions{Namespace: "kube-system", Name: "hamireg", LeaseDuration: time.Second, RenewDeadline: 500 * time.Millisecond, RetryPeriod: 50 * time.Millisecond}
		opts.Identity = "a"
		a, err := NewElector(client, opts)
		if err != nil {
			t.Fatal(err)
		}
		opts.Identity = "b"
		b, err := NewElector(client, opts)
		if err != nil {
			t.Fatal(err)
		}
		stopA := runLeader(ctx, t, a)
		synctest.Wait()
		if !a.IsLeader() {
			t.Fatal("a does not lead once the bubble settled")
		}
		// Leader election keeps time with the real clock, the bubble's fake time, which runs on
		// while the test blocks. The test blocks on b's term, which ends when b starts leading:
		// for four of b's retry periods while a holds the lease, then until b takes over.
		bTerm := b.Term()
		runLeader(ctx, t, b)
		select {
		case <-bTerm.Changed:
		case <-time.After(200 * time.Millisecond):
		}
		if b.IsLeader() {
			t.Fatal("b leads while a holds the lease")
		}
		started := time.Now()
		stopA()
		select {
		case <-bTerm.Changed:
		case <-time.After(10 * time.Second):
		}
		if !b.IsLeader() {
			t.Fatal("b did not take over within 10 s")
		}
		if took := time.Since(started); took > opts.LeaseDuration+time.Second {
			t.Errorf("takeover took %v, want under lease duration + 1 s", took)
		}
		if a.IsLeader() || a.Term().Leading {
			t.Error("a still leads after stopping")
		}
	})
}

func TestElectorOptions(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset()
	tests := map[string]ElectorOptions{
		"no identity":              {Namespace: "ns", Name: "l"},
		"no name":                  {Namespace: "ns", Identity: "a"},
		"renew deadline too large": {Namespace: "ns", Name: "l", Identity: "a", LeaseDuration: time.Second, RenewDeadline: 2 * time.Second},
	}
	for name, opts := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if _, err := NewElector(client, opts); !errors.Is(err, ErrInvalidOptions) {
				t.Errorf("NewElector = %v, want ErrInvalidOptions", err)
			}
		})
	}
	if _, err := NewLeaseFollower(client, FollowerOptions{Namespace: "ns", Name: "l"}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("NewLeaseFollower without identity = %v", err)
	}
}

// TestFollowerDoesNotWrite: a follower keeps its cache warm without writing and logs HAMi's
// line; once it leads it writes from its first cycle, and it is ready only after that cycle.
func TestFollowerDoesNotWrite(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		leader := newTestLeader(false)
		e := newEnv(t, Options{Leader: leader}, gpuNode("a", 8, 80, ""), gpuNode("b", 8, 0, requesting(t0.Add(-time.Hour))))
		// Writes block until the test checked readiness in the new term, to see the order.
		release := make(chan struct{})
		e.client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
			<-release
			return false, nil, nil
		})
		e.run()
		e.waitState("a", StateRegistered)
		e.waitState("b", StateUnhealthy)
		e.tick(DefaultTick)
		if p := e.patches(); len(p) != 0 {
			t.Fatalf("follower patched: %q", p)
		}
		if !e.logs.has("Scheduler is not leader yet, skipping ...", 5) {
			t.Errorf("no follower log in\n%s", e.logs)
		}
		if !e.cache.Ready() {
			t.Error("a synced follower is not ready")
		}
		if e.cache.Stats().SkippedNotLeader == 0 {
			t.Error("SkippedNotLeader = 0")
		}

		leader.ts.set(true)
		e.settled("the new term's cycle", func() bool { return e.cache.Stats().Cycles >= 2 })
		e.settled("ready in the new term", e.cache.Ready)
		close(release)
		e.until("the stamp", func() bool { hs, _ := e.handshakeOf("a"); return hs == requesting(e.clock.Now()) })
		if got := e.cache.Stats().Stamps; got != 1 {
			t.Errorf("stamps = %d, want 1", got)
		}

		// Losing and regaining leadership: not ready until the new term's first cycle ran.
		leader.ts.set(false)
		leader.ts.set(true)
		if c := e.cache.Stats().Cycles; !e.cache.Ready() {
			e.settled("ready again", e.cache.Ready)
			if e.cache.Stats().Cycles <= c {
				t.Error("ready without a cycle in the new term")
			}
		}
	})
}

// TestReadyTiedToTerm checks Ready against the term directly.
func TestReadyTiedToTerm(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		leader := newTestLeader(true)
		e := start(t, Options{Leader: leader}, gpuNode("a", 8, 80, requesting(t0)))
		e.settled("ready", e.cache.Ready)
		// A term the cache has not started yet (the cycle loop is busy): not ready.
		e.cache.cycleMu.Lock()
		leader.ts.set(false)
		leader.ts.set(true)
		if e.cache.Ready() {
			t.Error("ready before the new term's first cycle")
		}
		e.cache.cycleMu.Unlock()
		e.settled("ready in the new term", e.cache.Ready)
		if _, ok := e.cache.Node("a"); !ok {
			t.Error("node a missing")
		}
	})
}
