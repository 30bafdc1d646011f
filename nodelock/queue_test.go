package nodelock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/nodelock"
)

// acquireResult is what a Queue.Acquire in a goroutine returned.
type acquireResult struct {
	done func()
	err  error
}

func goAcquire(ctx context.Context, q *nodelock.Queue, pod string, wait time.Duration) chan acquireResult {
	ch := make(chan acquireResult, 1)
	go func() {
		done, err := q.Acquire(ctx, nodeName, parseName(pod), wait)
		ch <- acquireResult{done, err}
	}()
	return ch
}

// The second bind of a node waits for the first's turn, then for the lock, and takes it as soon
// as the lock's release is notified, without waiting for its deadline.
func TestQueueWaitsForTurnAndRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, nil, nil, "default/first", "default/second")
		l := newLocker(t, c, nodelock.Options{})
		q := nodelock.NewQueue(l, nodelock.QueueOptions{})
		first := <-goAcquire(t.Context(), q, "default/first", 10*time.Second)
		if first.err != nil {
			t.Fatalf("first Acquire: %v", first.err)
		}
		start := time.Now()
		second := goAcquire(t.Context(), q, "default/second", 10*time.Second)
		synctest.Wait()
		if len(second) != 0 {
			t.Fatal("second bind did not wait for the first's turn")
		}
		first.done()
		first.done() // harmless twice
		synctest.Wait()
		if len(second) != 0 {
			t.Fatal("second bind took a lock held by the first pod")
		}
		time.Sleep(time.Second)
		if err := l.Release(t.Context(), nodeName, parseName("default/first")); err != nil {
			t.Fatal(err)
		}
		q.Notify(nodeName)
		r := <-second
		if r.err != nil {
			t.Fatalf("second Acquire: %v", r.err)
		}
		r.done()
		if waited := time.Since(start); waited != time.Second {
			t.Errorf("second bind took the lock after %v, want 1s (woken by the release)", waited)
		}
		if got := c.lock(); !strings.HasSuffix(got, ",default,second") {
			t.Errorf("lock = %q, want second's", got)
		}
	})
}

// A lock that stays held fails the bind with the lock's error at the deadline; a cancelled
// context ends the wait at once.
func TestQueueDeadlineAndCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, map[string]string{nodelock.Key: lockAt(time.Now(), "default/holder")}, nil, "default/holder", "default/p")
		q := nodelock.NewQueue(newLocker(t, c, nodelock.Options{}), nodelock.QueueOptions{})
		start := time.Now()
		r := <-goAcquire(t.Context(), q, "default/p", 3*time.Second)
		if !errors.Is(r.err, nodelock.ErrLocked) {
			t.Fatalf("Acquire = %v, want ErrLocked", r.err)
		}
		if waited := time.Since(start); waited != 3*time.Second {
			t.Errorf("gave up after %v, want the 3s wait", waited)
		}

		ctx, cancel := context.WithCancel(t.Context())
		ch := goAcquire(ctx, q, "default/p", time.Minute)
		synctest.Wait()
		cancel()
		if r := <-ch; !errors.Is(r.err, nodelock.ErrLocked) {
			t.Errorf("Acquire after cancel = %v, want the lock's error", r.err)
		}
		// The cancelled bind gave its turn back: the next one tries at once.
		if r := <-goAcquire(t.Context(), q, "default/p", 0); !errors.Is(r.err, nodelock.ErrLocked) {
			t.Errorf("Acquire without wait = %v, want ErrLocked", r.err)
		}
	})
}

// NodeHandler wakes waiting binds on a change of the lock annotation and on a Node's add or
// delete, not on other updates; PodGone on a deleted pod's node.
func TestQueueHandlers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, map[string]string{nodelock.Key: lockAt(time.Now(), "default/holder")}, nil, "default/holder", "default/p")
		l := newLocker(t, c, nodelock.Options{})
		q := nodelock.NewQueue(l, nodelock.QueueOptions{})
		h := q.NodeHandler()
		node := func(lock string) *corev1.Node {
			return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Annotations: map[string]string{nodelock.Key: lock, "other": lock}}}
		}
		held := lockAt(time.Now(), "default/holder")
		for _, tc := range []struct {
			name  string
			event func()
			wakes bool
		}{
			{"other annotation", func() {
				o, n := node(held), node(held)
				n.Annotations["other"] = "changed"
				h.OnUpdate(o, n)
			}, false},
			{"lock changed", func() { h.OnUpdate(node(held), node("")) }, true},
			{"node added", func() { h.OnAdd(node(held), false) }, true},
			{"node deleted", func() { h.OnDelete(node(held)) }, true},
			{"pod on the node deleted", func() {
				q.PodGone(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{"hami.io/vgpu-node": nodeName}}})
			}, true},
			{"pod elsewhere deleted", func() { q.PodGone(&corev1.Pod{Spec: corev1.PodSpec{NodeName: "other"}}) }, false},
		} {
			ch := goAcquire(t.Context(), q, "default/p", time.Minute)
			synctest.Wait()
			// The holder is gone from the API: the next try takes the lock over.
			if err := c.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), "default", "holder"); err != nil && tc.wakes {
				t.Fatal(err)
			}
			tc.event()
			synctest.Wait()
			if woke := len(ch) != 0; woke != tc.wakes {
				t.Errorf("%s: woke = %v, want %v", tc.name, woke, tc.wakes)
			}
			// Reset: end the wait, put the holder's lock back.
			q.Notify(nodeName)
			if r := <-ch; r.err == nil {
				r.done()
				if err := l.Release(t.Context(), nodeName, parseName("default/p")); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.Tracker().Add(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "holder"}}); err != nil {
				t.Fatal(err)
			}
			c.edit(func(n *corev1.Node) { n.Annotations[nodelock.Key] = lockAt(time.Now(), "default/holder") })
		}
	})
}
