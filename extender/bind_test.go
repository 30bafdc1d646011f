package extender

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hamireg/hamireg/nodelock"
)

// lockOf is the node lock pod took at at.
func lockOf(pod string, at time.Time) string {
	return nodelock.Lock{Time: at, Namespace: "default", Name: pod}.String()
}

func TestBind(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		pod         *corev1.Pod
		lock        string // on the node before
		others      []runtime.Object
		failBinding bool
		wantErr     string
		wantLock    string
		wantWrites  []string
		opts        Options
	}{
		"success: lock, binding with bind-phase allocating": {
			pod:      gpuPod("p", map[string]string{"nvidia.com/gpu": "1"}),
			wantLock: lockOf("p", t0),
			wantWrites: []string{
				`patch nodes n {"metadata":{"annotations":{"hami.io/mutex.lock":"2026-05-19T09:00:00Z,default,p"},"resourceVersion":""}}`,
				`create pods/binding p->n {"hami.io/bind-phase":"allocating","hami.io/bind-time":"1779181200"}`,
			},
		},
		"no GPU: no lock, binding with bind-phase allocating": {
			pod:        gpuPod("p", map[string]string{"cpu": "1"}),
			wantWrites: []string{`create pods/binding p->n {"hami.io/bind-phase":"allocating","hami.io/bind-time":"1779181200"}`},
		},
		"locked by another live pod: HAMi's message, nothing written": {
			opts:     Options{NodeLockWait: -1}, // HAMi v2.9.0: no wait
			pod:      gpuPod("p", map[string]string{"nvidia.com/gpu": "1"}),
			lock:     lockOf("other", t0.Add(-time.Minute)),
			others:   []runtime.Object{gpuPod("other", nil)},
			wantErr:  "node n has been locked within 5m0s",
			wantLock: lockOf("other", t0.Add(-time.Minute)),
		},
		"binding fails: lock released, bind-phase failed": {
			pod:         gpuPod("p", map[string]string{"nvidia.com/gpu": "1"}),
			failBinding: true,
			wantErr:     "create binding",
			wantWrites: []string{
				`patch nodes n {"metadata":{"annotations":{"hami.io/mutex.lock":"2026-05-19T09:00:00Z,default,p"},"resourceVersion":""}}`,
				`create pods/binding p->n {"hami.io/bind-phase":"allocating","hami.io/bind-time":"1779181200"}`,
				`patch nodes n {"metadata":{"annotations":{"hami.io/mutex.lock":null},"resourceVersion":""}}`,
				`patch pods p {"metadata":{"annotations":{"hami.io/bind-phase":"failed","hami.io/bind-time":"1779181200"}}}`,
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				node := registered("n", 1, 23028)
				if tc.lock != "" {
					node.Annotations[nodelock.Key] = tc.lock
				}
				e := setup(t, tc.opts, append(tc.others, node, tc.pod)...)
				if tc.failBinding {
					e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
						if a.GetSubresource() != "binding" {
							return false, nil, nil
						}
						return true, nil, apierrors.NewInternalError(errors.New("etcd down"))
					})
				}
				e.run()
				e.client.ClearActions()
				err := e.ext.Bind(e.ctx, &bindingArgs{PodName: "p", PodNamespace: "default", PodUID: tc.pod.UID, Node: "n"})
				if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
					t.Fatalf("Bind = %v, want %q", err, tc.wantErr)
				}
				if diff := cmp.Diff(tc.wantWrites, e.writes(), cmpEmpty); diff != "" {
					t.Errorf("writes (-want +got):\n%s", diff)
				}
				n, _ := e.client.CoreV1().Nodes().Get(e.ctx, "n", metaGet)
				if got := n.Annotations[nodelock.Key]; got != tc.wantLock {
					t.Errorf("lock after = %q, want %q", got, tc.wantLock)
				}
				ev := e.events()
				want := "Normal " + EventBindingSucceed + " Successfully binding node [n] to default/p"
				if tc.wantErr != "" {
					want = "Warning " + EventBindingFailed
				}
				if len(ev) != 1 || !strings.HasPrefix(ev[0], want) {
					t.Errorf("events = %q, want one %q", ev, want)
				}
			})
		})
	}
}

func TestBindPodNotFound(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Options{}, registered("n", 1, 23028), gpuPod("p", nil))
		if err := e.ext.Bind(e.ctx, &bindingArgs{PodName: "gone", PodNamespace: "default", Node: "n"}); !errors.Is(err, ErrPodNotFound) {
			t.Errorf("Bind(missing pod) = %v", err)
		}
		if err := e.ext.Bind(e.ctx, &bindingArgs{PodName: "p", PodNamespace: "default", PodUID: "other", Node: "n"}); !errors.Is(err, ErrPodNotFound) {
			t.Errorf("Bind(other UID) = %v", err)
		}
		if s := e.ext.Stats(); s.BindErrors != 2 || s.Binds != 0 {
			t.Errorf("stats = %+v", s)
		}
	})
}

// A bind to a node that another pod holds waits for that pod's device plugin to release the
// lock, instead of failing into kube-scheduler's back-off; it gives up after NodeLockWait.
func TestBindWaitsForTheNodeLock(t *testing.T) {
	t.Parallel()
	for name, release := range map[string]bool{"released within the wait": true, "held past the wait": false} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				node := registered("n", 1, 23028)
				node.Annotations[nodelock.Key] = lockOf("other", t0.Add(-time.Minute))
				pod := gpuPod("p", map[string]string{"nvidia.com/gpu": "1"})
				e := setup(t, Options{NodeLockWait: 2 * time.Second}, gpuPod("other", nil), node, pod)
				e.run()
				done := make(chan error, 1)
				go func() {
					done <- e.ext.Bind(e.ctx, &bindingArgs{PodName: "p", PodNamespace: "default", PodUID: pod.UID, Node: "n"})
				}()
				synctest.Wait()
				if len(done) != 0 {
					t.Fatalf("Bind returned at once: %v", <-done)
				}
				if release {
					locker, err := nodelock.New(e.client.CoreV1(), nodelock.Options{Clock: e.clock})
					if err != nil {
						t.Fatal(err)
					}
					if err := locker.Release(e.ctx, "n", types.NamespacedName{Namespace: "default", Name: "other"}); err != nil {
						t.Fatal(err)
					}
				}
				synctest.Wait()
				if release != (len(done) != 0) {
					// Woken by the Node informer: no time passes between the release and the
					// bind; a held lock keeps it waiting.
					t.Fatalf("after the release (%v) and no time passing, Bind returned %v, want %v", release, len(done) != 0, release)
				}
				for len(done) == 0 { // until the 2 s are over
					e.clock.Step(100 * time.Millisecond)
					synctest.Wait()
				}
				err := <-done
				n, _ := e.client.CoreV1().Nodes().Get(e.ctx, "n", metaGet)
				if release {
					if err != nil || !strings.HasSuffix(n.Annotations[nodelock.Key], ",default,p") {
						t.Errorf("Bind = %v, lock %q; want bound with p's lock", err, n.Annotations[nodelock.Key])
					}
				} else if err == nil || !strings.Contains(err.Error(), "has been locked within 5m0s") {
					t.Errorf("Bind = %v, want HAMi's locked error after the wait", err)
				}
			})
		})
	}
}

// Binds to one node queue: while the first pod's lock is held, the next bind reads the lock
// from the informer's copy of the Node and sends no request; once the device plugin released
// it, the lock costs one patch.
func TestBindQueuesWithoutRequests(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		gpu := map[string]string{"nvidia.com/gpu": "1"}
		first, second := gpuPod("first", gpu), gpuPod("second", gpu)
		e := start(t, Options{NodeLockWait: 2 * time.Second}, registered("n", 2, 23028), first, second)
		if err := e.ext.Bind(e.ctx, &bindingArgs{PodName: "first", PodNamespace: "default", PodUID: first.UID, Node: "n"}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the informers have the lock
		e.client.ClearActions()
		done := make(chan error, 1)
		go func() {
			done <- e.ext.Bind(e.ctx, &bindingArgs{PodName: "second", PodNamespace: "default", PodUID: second.UID, Node: "n"})
		}()
		for range 10 { // time passing alone wakes nothing
			synctest.Wait()
			e.clock.Step(100 * time.Millisecond)
		}
		synctest.Wait()
		if len(done) != 0 {
			t.Fatalf("Bind returned while the node was locked: %v", <-done)
		}
		if a := e.client.Actions(); len(a) != 0 {
			t.Errorf("%d requests while waiting for the lock, want none: %v", len(a), a)
		}
		locker, err := nodelock.New(e.client.CoreV1(), nodelock.Options{Clock: e.clock})
		if err != nil {
			t.Fatal(err)
		}
		if err := locker.Release(e.ctx, "n", types.NamespacedName{Namespace: "default", Name: "first"}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the informer's event wakes the bind: no time passes
		if len(done) == 0 {
			t.Fatal("Bind still waiting after the release reached the informer")
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		want := []string{
			`patch nodes n {"metadata":{"annotations":{"hami.io/mutex.lock":null},"resourceVersion":""}}`, // the release
			`patch nodes n {"metadata":{"annotations":{"hami.io/mutex.lock":"2026-05-19T09:00:01Z,default,second"},"resourceVersion":""}}`,
			`create pods/binding second->n {"hami.io/bind-phase":"allocating","hami.io/bind-time":"1779181201"}`,
		}
		if diff := cmp.Diff(want, e.writes(), cmpEmpty); diff != "" {
			t.Errorf("writes of the release and the bind (-want +got):\n%s", diff)
		}
		if n := len(e.client.Actions()); n != len(want)+1 {
			t.Errorf("%d requests, want %d (the release's GET, its patch and the bind's two; no GET of the bind): %v", n, len(want)+1, e.client.Actions())
		}
	})
}

// A bind waiting for the lock of a pod that is then deleted takes the lock over at once: the
// pod informer's delete wakes it (nodelock lets anyone take a lock whose owner is gone).
func TestBindWokenByTheOwnersDeletion(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		node := registered("n", 1, 23028)
		node.Annotations[nodelock.Key] = lockOf("other", t0.Add(-time.Minute))
		other, pod := placedPod("other", "n", "GPU-n-0,NVIDIA,1000,10:;"), gpuPod("p", map[string]string{"nvidia.com/gpu": "1"})
		e := start(t, Options{NodeLockWait: 5 * time.Second}, other, node, pod)
		done := make(chan error, 1)
		go func() {
			done <- e.ext.Bind(e.ctx, &bindingArgs{PodName: "p", PodNamespace: "default", PodUID: pod.UID, Node: "n"})
		}()
		synctest.Wait()
		if len(done) != 0 {
			t.Fatalf("Bind returned while the owner lives: %v", <-done)
		}
		if err := e.client.CoreV1().Pods("default").Delete(e.ctx, "other", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if len(done) == 0 {
			t.Fatal("Bind still waiting after the lock's owner was deleted")
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		n, _ := e.client.CoreV1().Nodes().Get(e.ctx, "n", metaGet)
		if got := n.Annotations[nodelock.Key]; !strings.HasSuffix(got, ",default,p") {
			t.Errorf("lock %q, want p's", got)
		}
	})
}

// A bind that gives up (its context ends) leaves nothing behind: no goroutine (TestMain's
// goleak), and the node's signal is dropped at the next change.
func TestBindWaitEndsWithItsContext(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		node := registered("n", 1, 23028)
		node.Annotations[nodelock.Key] = lockOf("other", t0.Add(-time.Minute))
		pod := gpuPod("p", map[string]string{"nvidia.com/gpu": "1"})
		e := start(t, Options{NodeLockWait: time.Hour}, gpuPod("other", nil), node, pod)
		ctx, cancel := context.WithCancel(e.ctx)
		done := make(chan error, 1)
		go func() {
			done <- e.ext.Bind(ctx, &bindingArgs{PodName: "p", PodNamespace: "default", PodUID: pod.UID, Node: "n"})
		}()
		synctest.Wait()
		cancel()
		synctest.Wait()
		if len(done) == 0 {
			t.Fatal("Bind still waiting after its context ended")
		}
		if err := <-done; !errors.Is(err, nodelock.ErrLocked) {
			t.Errorf("Bind = %v, want the lock's error", err)
		}
		locker, err := nodelock.New(e.client.CoreV1(), nodelock.Options{Clock: e.clock})
		if err != nil {
			t.Fatal(err)
		}
		if err := locker.Release(e.ctx, "n", types.NamespacedName{Namespace: "default", Name: "other"}); err != nil {
			t.Fatal(err)
		}
	})
}

// A bind naming a pod that does not exist, with the UID of a pod that holds GPUs (HAMi #3030),
// or naming that pod with another UID, leaves its reservation alone; only a reservation cached
// under the request's own name, whose pod the API server no longer has, is dropped.
func TestBindForeignPodKeepsReservations(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		held := placedPod("held", "n", "GPU-n-0,NVIDIA,1000,10:;")
		e := start(t, Options{}, registered("n", 1, 23028), held)
		before, ok := e.ext.usage.Pod("default/held")
		if !ok {
			t.Fatal("the placed pod holds nothing")
		}
		for _, args := range []*bindingArgs{
			{PodName: "ghost", PodNamespace: "default", PodUID: held.UID, Node: "n"},
			{PodName: "held", PodNamespace: "other", PodUID: held.UID, Node: "n"},
			{PodName: "held", PodNamespace: "default", PodUID: "forged", Node: "n"},
		} {
			if err := e.ext.Bind(e.ctx, args); !errors.Is(err, ErrPodNotFound) {
				t.Errorf("Bind(%+v) = %v, want ErrPodNotFound", args, err)
			}
			if got, ok := e.ext.usage.Pod("default/held"); !ok || !cmp.Equal(got.GPUs, before.GPUs) {
				t.Errorf("after Bind(%+v): reservation %v, %v; want %v", args, got.GPUs, ok, before.GPUs)
			}
		}
		if n := e.ext.usage.Node("n")["GPU-n-0"]; n.Usedmem != 1000 {
			t.Errorf("node usage after = %+v", n)
		}

		// A reservation assumed for a pod deleted before the informer showed it placed.
		gone := gpuPod("gone", map[string]string{"nvidia.com/gpu": "1"})
		e.ext.usage.Assume(gone, "n", before.Devices)
		if _, ok := e.ext.usage.Pod("default/gone"); !ok {
			t.Fatal("assumed nothing")
		}
		if err := e.ext.Bind(e.ctx, &bindingArgs{PodName: "gone", PodNamespace: "default", PodUID: gone.UID, Node: "n"}); !errors.Is(err, ErrPodNotFound) {
			t.Errorf("Bind(gone) = %v", err)
		}
		if _, ok := e.ext.usage.Pod("default/gone"); ok {
			t.Error("the reservation of a pod the API server does not have was kept")
		}
		if _, ok := e.ext.usage.Pod("default/held"); !ok {
			t.Error("another pod's reservation was dropped")
		}
	})
}

// A bind waiting for a node lock is woken when the lock's owner finishes (phase Failed, as an
// admission failure leaves it) and takes the lock over at once, not after the 5-minute expiry.
func TestBindWokenByTheOwnerFinishing(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		node := registered("n", 1, 23028)
		node.Annotations[nodelock.Key] = lockOf("other", t0.Add(-time.Minute))
		other, pod := placedPod("other", "n", "GPU-n-0,NVIDIA,1000,10:;"), gpuPod("p", map[string]string{"nvidia.com/gpu": "1"})
		e := start(t, Options{NodeLockWait: 5 * time.Second}, other, node, pod)
		done := make(chan error, 1)
		go func() {
			done <- e.ext.Bind(e.ctx, &bindingArgs{PodName: "p", PodNamespace: "default", PodUID: pod.UID, Node: "n"})
		}()
		synctest.Wait()
		if len(done) != 0 {
			t.Fatalf("Bind returned while the owner runs: %v", <-done)
		}
		failed := other.DeepCopy()
		failed.Status.Phase = corev1.PodFailed
		if _, err := e.client.CoreV1().Pods("default").UpdateStatus(e.ctx, failed, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if len(done) == 0 {
			t.Fatal("Bind still waiting after the lock's owner failed")
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		n, _ := e.client.CoreV1().Nodes().Get(e.ctx, "n", metaGet)
		if got := n.Annotations[nodelock.Key]; !strings.HasSuffix(got, ",default,p") {
			t.Errorf("lock %q, want p's", got)
		}
	})
}
