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

// termWork is leader-only work that records its terms.
type termWork struct {
	mu      sync.Mutex
	running bool
	runs    int
}

func (w *termWork) Run(ctx context.Context) error {
	w.mu.Lock()
	w.running, w.runs = true, w.runs+1
	w.mu.Unlock()
	<-ctx.Done()
	w.mu.Lock()
	w.running = false
	w.mu.Unlock()
	return nil
}

func (w *termWork) state() (bool, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.running, w.runs
}

func TestLeaseFollower(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		client := fake.NewClientset(lease("sched-0_1234", 15))
		clk := clocktesting.NewFakeClock(t0)
		work := &termWork{}
		f, err := NewLeaseFollower(client, work, FollowerOptions{Namespace: "hami", Name: "hami-scheduler", Identity: "sched-0", Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		runLeader(ctx, t, f)
		synctest.Wait()
		if running, runs := work.state(); !f.IsLeader() || !running || runs != 1 {
			t.Fatalf("leader %v, work running %v after %d runs; want leading, running, 1", f.IsLeader(), running, runs)
		}
		if err := f.Run(ctx); !errors.Is(err, ErrAlreadyRunning) {
			t.Errorf("second Run = %v", err)
		}

		// No renewal observed within the lease duration: leadership lapses, the work stops.
		clk.Step(16 * time.Second)
		synctest.Wait()
		if running, _ := work.state(); f.IsLeader() || running {
			t.Fatal("still leading or working after the lease lapsed")
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
		if running, runs := work.state(); !f.IsLeader() || !running || runs != 2 {
			t.Fatalf("leader %v, running %v, runs %d once the bubble settled; want a second term", f.IsLeader(), running, runs)
		}
		update("sched-01_9999")
		synctest.Wait()
		if running, _ := work.state(); f.IsLeader() || running {
			t.Fatal("still leading once the bubble settled")
		}
		if got := f.Terms(); got != 2 {
			t.Errorf("terms = %d, want 2", got)
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
		workA, workB := &termWork{}, &termWork{}
		a, err := NewElector(client, workA, opts)
		if err != nil {
			t.Fatal(err)
		}
		opts.Identity = "b"
		b, err := NewElector(client, workB, opts)
		if err != nil {
			t.Fatal(err)
		}
		stopA := runLeader(ctx, t, a)
		synctest.Wait()
		if running, _ := workA.state(); !a.IsLeader() || !running {
			t.Fatal("a does not lead and work once the bubble settled")
		}
		// Leader election keeps time with the real clock, the bubble's fake time, which runs on
		// while the test sleeps.
		runLeader(ctx, t, b)
		time.Sleep(200 * time.Millisecond)
		if running, _ := workB.state(); b.IsLeader() || running {
			t.Fatal("b leads while a holds the lease")
		}
		started := time.Now()
		stopA() // returns once a's work returned and the Lease was released
		if running, _ := workA.state(); running || a.IsLeader() {
			t.Error("a still works after its Run returned")
		}
		for !b.IsLeader() && time.Since(started) < 10*time.Second {
			time.Sleep(10 * time.Millisecond)
		}
		synctest.Wait()
		if running, _ := workB.state(); !b.IsLeader() || !running {
			t.Fatal("b did not take over within 10 s")
		}
		if took := time.Since(started); took > opts.LeaseDuration+time.Second {
			t.Errorf("takeover took %v, want under lease duration + 1 s", took)
		}
	})
}

func TestElectorOptions(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset()
	work := &termWork{}
	tests := map[string]ElectorOptions{
		"no identity":              {Namespace: "ns", Name: "l"},
		"no name":                  {Namespace: "ns", Identity: "a"},
		"renew deadline too large": {Namespace: "ns", Name: "l", Identity: "a", LeaseDuration: time.Second, RenewDeadline: 2 * time.Second},
	}
	for name, opts := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if _, err := NewElector(client, work, opts); !errors.Is(err, ErrInvalidOptions) {
				t.Errorf("NewElector = %v, want ErrInvalidOptions", err)
			}
		})
	}
	if _, err := NewElector(client, nil, ElectorOptions{Namespace: "ns", Name: "l", Identity: "a"}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("NewElector without work = %v", err)
	}
	if _, err := NewLeaseFollower(client, work, FollowerOptions{Namespace: "ns", Name: "l"}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("NewLeaseFollower without identity = %v", err)
	}
	if _, err := NewHandshaker(client, nil, HandshakerOptions{}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("NewHandshaker without cache = %v", err)
	}
}

// TestFollowerDoesNotWrite: without a running Handshaker the cache stays warm and decides
// without writing, and logs HAMi's line; once a Handshaker runs it writes from its first cycle;
// when it stops, writing stops, and the next term writes what is still decided.
func TestFollowerDoesNotWrite(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, Options{}, gpuNode("a", 8, 80, ""), gpuNode("b", 8, 0, requesting(t0.Add(-time.Hour))))
		e.follower = true
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
		if !e.cache.HasSynced() {
			t.Error("a synced follower is not synced")
		}
		if e.cache.Stats().SkippedNotLeader == 0 {
			t.Error("SkippedNotLeader = 0")
		}
		if s := e.cache.Stats(); s.PendingWrites != 1 {
			t.Errorf("pending writes = %d, want 1 (stamp a)", s.PendingWrites)
		}

		// A term whose writes fail: stopping it leaves the write to the next term.
		block := make(chan struct{})
		e.client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
			select {
			case <-block:
				return false, nil, nil
			default:
				return true, nil, context.Canceled
			}
		})
		stop := e.lead()
		synctest.Wait()
		stop()
		if s := e.cache.Stats(); s.Stamps != 0 || s.PendingWrites != 1 {
			t.Fatalf("after a cancelled term: %+v", s)
		}
		close(block)
		e.lead()
		e.settled("the stamp", func() bool { return e.cache.Stats().Stamps == 1 })
		if hs, _ := e.handshakeOf("a"); hs != requesting(e.clock.Now()) {
			t.Errorf("handshake of a = %q", hs)
		}
		if err := e.hs.Run(e.ctx); !errors.Is(err, ErrAlreadyRunning) {
			t.Errorf("second concurrent Run = %v", err)
		}
		other, err := NewHandshaker(e.client, e.cache, HandshakerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := other.Run(e.ctx); !errors.Is(err, ErrAlreadyRunning) {
			t.Errorf("a second Handshaker on the same cache = %v", err)
		}
	})
}
