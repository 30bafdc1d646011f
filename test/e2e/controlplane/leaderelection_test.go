package controlplane_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/hamireg/hamireg/test/e2e/harness"
)

// Two client-go leader-election candidates on one Lease: the standby takes over when the
// leader stops (its context is cancelled and it releases the Lease).
func TestLeaderElectionHandsOverWhenLeaderStops(t *testing.T) {
	t.Parallel()
	ns := harness.UniqueName("lease")
	if err := cp.EnsureNamespace(t.Context(), ns); err != nil {
		t.Fatal(err)
	}

	type candidate struct {
		cancel  context.CancelFunc
		leading chan time.Time
		done    chan struct{}
	}
	start := func(id string) *candidate {
		lock, err := resourcelock.New(resourcelock.LeasesResourceLock, ns, "hamireg-scheduler",
			nil, cp.AdminClient().CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
		if err != nil {
			t.Fatalf("resource lock: %v", err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		c := &candidate{cancel: cancel, leading: make(chan time.Time, 1), done: make(chan struct{})}
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   3 * time.Second,
			RenewDeadline:   2 * time.Second,
			RetryPeriod:     500 * time.Millisecond,
			ReleaseOnCancel: true,
			Name:            id,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) { c.leading <- time.Now() },
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			t.Fatalf("leader elector: %v", err)
		}
		go func() {
			defer close(c.done)
			le.Run(ctx)
		}()
		t.Cleanup(func() {
			cancel()
			<-c.done
		})
		return c
	}

	a := start("candidate-a")
	select {
	case <-a.leading:
	case <-time.After(15 * time.Second):
		t.Fatal("candidate-a did not become leader of a free Lease")
	}
	b := start("candidate-b")
	select {
	case <-b.leading:
		t.Fatal("candidate-b became leader while candidate-a held the Lease")
	case <-time.After(1500 * time.Millisecond):
	}

	stopped := time.Now()
	a.cancel()
	<-a.done
	select {
	case at := <-b.leading:
		t.Logf("candidate-b took over %v after candidate-a stopped", at.Sub(stopped).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("candidate-b did not take over within 10s of candidate-a stopping")
	}
	lease, err := cp.AdminClient().CoordinationV1().Leases(ns).Get(t.Context(), "hamireg-scheduler", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get lease: %v", err)
	}
	if got := *lease.Spec.HolderIdentity; got != "candidate-b" {
		t.Errorf("lease holder = %q, want candidate-b", got)
	}
}
