package nodelock_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// conflictCounter counts the 409 answers to the PATCH requests a client sends.
type conflictCounter struct{ n atomic.Int64 }

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (c *conflictCounter) wrap(next http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		if err == nil && req.Method == http.MethodPatch && resp.StatusCode == http.StatusConflict {
			c.n.Add(1)
		}
		return resp, err
	})
}

// Two schedulers, each with its own ServiceAccount bound to exactly ClusterRoleRules, race
// for one node's lock 200 times while a third writer keeps adding annotations to the same
// Node. Every round exactly one holds the lock, the other is told who; the holder's Release
// always removes it; no annotation of the other writer is lost.
func TestNodeLockRace(t *testing.T) {
	t.Parallel()
	ctx := harness.Context(t)
	role := lockRole(t)
	ns := harness.UniqueName("lock-race")
	pods := createPods(t, ns, "a", "b")
	node := harness.UniqueName("lock-race")
	createNode(t, node, nil)

	var conflicts conflictCounter
	lockers := make([]*nodelock.Locker, len(pods))
	for i := range lockers {
		cfg, err := cp.ServiceAccountConfig(ctx, ns, fmt.Sprintf("scheduler-%d", i), role)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Wrap(conflicts.wrap)
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		lockers[i] = newLocker(t, client, nodelock.Options{})
	}

	// The other writer: the register agent, the handshake, an operator. One new key per
	// patch, so that any lost write would show as a missing key. It writes ten times a
	// second, far more than anything writes a real Node, yet slowly enough that a lock call
	// does not meet a conflict on every one of its re-reads: a writer whose period is close to
	// the latency of a PATCH would starve any GET-then-conditional-PATCH client (on this
	// loaded test machine a PATCH under -race takes tens of milliseconds).
	writerCtx, stopWriter := context.WithCancel(ctx)
	var written atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
				fmt.Sprintf("other.example/k%d", i): "v",
			}}})
			if _, err := cp.AdminClient().CoreV1().Nodes().Patch(writerCtx, node, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
				if writerCtx.Err() == nil {
					t.Errorf("other writer: %v", err)
				}
				return
			}
			written.Store(int64(i + 1))
			time.Sleep(100 * time.Millisecond)
		}
	})

	const rounds = 200
	var wins [2]int
	start := time.Now()
	for round := range rounds {
		var errs [2]error
		var race sync.WaitGroup
		gate := make(chan struct{})
		for i := range lockers {
			race.Go(func() {
				<-gate
				errs[i] = lockers[i].Acquire(ctx, node, pods[i])
			})
		}
		close(gate)
		race.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Fatalf("round %d: both pods hold the lock", round)
			case err == nil:
				winner = i
			case !errors.Is(err, nodelock.ErrLocked):
				t.Fatalf("round %d: %s: %v", round, pods[i], err)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: nobody holds the lock: %v", round, errs)
		}
		wins[winner]++
		var le *nodelock.LockedError
		if loser := 1 - winner; !errors.As(errs[loser], &le) || le.Holder() != "pod "+pods[winner].String() ||
			!strings.HasPrefix(errs[loser].Error(), "node "+node+" has been locked within 5m0s by pod "+pods[winner].String()) {
			t.Fatalf("round %d: loser told %v, want the holder %s", round, errs[loser], pods[winner])
		}
		held, err := nodelock.Parse(lockOf(t, node))
		if owner, _ := held.Owner(); err != nil || owner != pods[winner] {
			t.Fatalf("round %d: lock %+v (%v), want %s's", round, held, err, pods[winner])
		}
		if err := lockers[winner].Release(ctx, node, pods[winner]); err != nil {
			t.Fatalf("round %d: release: %v", round, err)
		}
		if got := lockOf(t, node); got != "<absent>" {
			t.Fatalf("round %d: lock %q after the release", round, got)
		}
	}
	elapsed := time.Since(start)
	stopWriter()
	wg.Wait()

	n, err := cp.AdminClient().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lost := 0
	for i := range written.Load() {
		if _, ok := n.Annotations[fmt.Sprintf("other.example/k%d", i)]; !ok {
			lost++
		}
	}
	if lost > 0 || written.Load() == 0 {
		t.Errorf("other writer: %d of %d annotations lost", lost, written.Load())
	}
	t.Logf("%d rounds in %v: wins %v, %d conflicts answered by re-reading, %d concurrent writes of other annotations, none lost",
		rounds, elapsed.Round(time.Millisecond), wins, conflicts.n.Load(), written.Load())
}

// Takeovers against the real API server, all with the minimal ClusterRole.
func TestNodeLockTakeover(t *testing.T) {
	t.Parallel()
	ns := harness.UniqueName("lock-takeover")
	client := serviceAccountClient(t, ns, "scheduler", lockRole(t))
	pods := createPods(t, ns, "holder", "next")
	holder, next := pods[0], pods[1]
	later := func() *testingclock.FakeClock { return testingclock.NewFakeClock(time.Now().Add(6 * time.Minute)) }
	locker := newLocker(t, client, nodelock.Options{})

	tests := map[string]struct {
		// The lock written before the test: raw as is, else one of lockPod ("" for a legacy
		// lock) taken lockAge ago; neither means none.
		raw     string
		lockPod string
		lockAge time.Duration
		// first is what Acquire by next with the real clock gives; with afterwards, a Locker
		// whose clock runs 6 minutes ahead must then take the lock over.
		first      error
		wantHolder string
		afterwards bool
	}{
		"expired by its time": {lockPod: holder.Name, lockAge: 6 * time.Minute},
		"expired by the clock": {
			lockPod: holder.Name, first: nodelock.ErrLocked, wantHolder: "pod " + holder.String(), afterwards: true,
		},
		"owner pod never existed": {lockPod: "gone-pod"},
		"legacy lock, fresh": {
			lockAge: time.Minute, first: nodelock.ErrLocked, wantHolder: "an unknown owner (legacy lock without a pod)", afterwards: true,
		},
		"legacy lock, expired": {lockAge: 6 * time.Minute},
		"unreadable value": {
			raw: "not-a-time,default", first: nodelock.ErrMalformed, wantHolder: `an unreadable value "not-a-time,default"`, afterwards: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := harness.Context(t)
			node := harness.UniqueName("lock-takeover")
			createNode(t, node, map[string]string{"hami.io/node-nvidia-register": "[]"})
			v := tc.raw
			if v == "" {
				l := nodelock.Lock{Time: time.Now().Add(-tc.lockAge)}
				if tc.lockPod != "" {
					l.Namespace, l.Name = ns, tc.lockPod
				}
				v = l.String()
			}
			body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{nodelock.Key: v}}})
			if _, err := cp.AdminClient().CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			err := locker.Acquire(ctx, node, next)
			if !errors.Is(err, tc.first) {
				t.Fatalf("Acquire: %v, want %v", err, tc.first)
			}
			if err != nil {
				var le *nodelock.LockedError
				if !errors.As(err, &le) || le.Holder() != tc.wantHolder || !errors.Is(err, nodelock.ErrLocked) {
					t.Fatalf("Acquire: %v, want ErrLocked by %s", err, tc.wantHolder)
				}
				t.Logf("first attempt: %v", err)
			}
			if tc.afterwards {
				if err := newLocker(t, client, nodelock.Options{Clock: later()}).Acquire(ctx, node, next); err != nil {
					t.Fatalf("Acquire 6 minutes later: %v", err)
				}
			}
			held, err := nodelock.Parse(lockOf(t, node))
			if owner, _ := held.Owner(); err != nil || owner != next {
				t.Errorf("lock %+v (%v), want %s's", held, err, next)
			}
			if got := annotationOf(t, node, "hami.io/node-nvidia-register"); got != "[]" {
				t.Errorf("other annotation = %q", got)
			}
		})
	}

	// A lock whose pod is deleted is taken over at once.
	t.Run("owner deleted", func(t *testing.T) {
		t.Parallel()
		ctx := harness.Context(t)
		node := harness.UniqueName("lock-deleted")
		createNode(t, node, nil)
		shortLived := createPods(t, ns, harness.UniqueName("short-lived"))[0]
		if err := locker.Acquire(ctx, node, shortLived); err != nil {
			t.Fatal(err)
		}
		if err := locker.Acquire(ctx, node, next); !errors.Is(err, nodelock.ErrLocked) {
			t.Fatalf("Acquire while the owner exists: %v", err)
		}
		if err := cp.AdminClient().CoreV1().Pods(ns).Delete(ctx, shortLived.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		if err := locker.Acquire(ctx, node, next); err != nil {
			t.Fatalf("Acquire after the owner was deleted: %v", err)
		}
	})

	// Release leaves another pod's lock; ForceRelease removes it.
	t.Run("release by another pod", func(t *testing.T) {
		t.Parallel()
		ctx := harness.Context(t)
		node := harness.UniqueName("lock-release")
		createNode(t, node, nil)
		if err := locker.Acquire(ctx, node, holder); err != nil {
			t.Fatal(err)
		}
		before := lockOf(t, node)
		if err := locker.Release(ctx, node, next); !errors.Is(err, nodelock.ErrNotOwner) {
			t.Fatalf("Release by another pod: %v, want ErrNotOwner", err)
		}
		if got := lockOf(t, node); got != before {
			t.Errorf("lock %q after another pod's Release, want %q", got, before)
		}
		if err := locker.ForceRelease(ctx, node); err != nil {
			t.Fatal(err)
		}
		if got := lockOf(t, node); got != "<absent>" {
			t.Errorf("lock %q after ForceRelease", got)
		}
		if err := locker.Release(ctx, node, holder); err != nil {
			t.Errorf("Release without a lock: %v", err)
		}
	})
}

func annotationOf(tb testing.TB, node, key string) string {
	tb.Helper()
	n, err := cp.AdminClient().CoreV1().Nodes().Get(tb.Context(), node, metav1.GetOptions{})
	if err != nil {
		tb.Fatalf("get node %s: %v", node, err)
	}
	return n.Annotations[key]
}

// A ServiceAccount that may read nodes and pods but not patch nodes gets a Forbidden error
// that says what the lock needs, at once (a refusal is not retried), and nothing is written.
func TestNodeLockForbiddenWithoutPatch(t *testing.T) {
	t.Parallel()
	ctx := harness.Context(t)
	role := harness.UniqueName("lock-readonly")
	_, err := cp.AdminClient().RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create cluster role: %v", err)
	}
	ns := harness.UniqueName("lock-forbidden")
	client := serviceAccountClient(t, ns, "limited", role)
	pod := createPods(t, ns, "p")[0]
	node := harness.UniqueName("lock-forbidden")
	createNode(t, node, nil)

	start := time.Now()
	err = newLocker(t, client, nodelock.Options{}).Acquire(ctx, node, pod)
	if !apierrors.IsForbidden(err) {
		t.Fatalf("Acquire: %v, want Forbidden", err)
	}
	for _, want := range []string{"see nodelock.ClusterRoleRules", `cannot patch resource "nodes"`, "system:serviceaccount:" + ns + ":limited"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Forbidden answered after %v: retried?", d)
	}
	if got := lockOf(t, node); got != "<absent>" {
		t.Errorf("lock %q written without permission", got)
	}
	t.Logf("classified error: %v", err)
}
