package nodelock_test

import (
	"cmp"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/nodelock"
)

// A lock whose owner exists but no longer holds it is taken over at once, in one conditional
// write, without waiting for the timeout: the owner finished (Succeeded, Failed), or the pod
// of that name was created after the lock (another pod under the same name). A live owner
// created before the lock, in the lock's second, or within the clock skew allowed after it,
// keeps it.
func TestAcquireTakesOverAnOwnerThatNoLongerHoldsIt(t *testing.T) {
	t.Parallel()
	lockTime := t0.Add(-time.Minute)
	other := lockAt(lockTime, "default/other")
	mine := lockAt(t0, "default/gpu-pod")
	tests := map[string]struct {
		phase    corev1.PodPhase
		created  time.Time
		lister   bool // the owner is in Options.Pods, not asked from the API server
		wantLock string
		wantGets int
	}{
		"running, created before the lock":             {phase: corev1.PodRunning, created: lockTime.Add(-time.Hour), wantGets: 1},
		"pending, created in the lock's second":        {phase: corev1.PodPending, created: lockTime.Add(900 * time.Millisecond), wantGets: 1},
		"pending, no creation time":                    {phase: corev1.PodPending, wantGets: 1},
		"succeeded":                                    {phase: corev1.PodSucceeded, created: lockTime.Add(-time.Hour), wantLock: mine, wantGets: 1},
		"failed":                                       {phase: corev1.PodFailed, created: lockTime.Add(-time.Hour), wantLock: mine, wantGets: 1},
		"created within the clock skew after the lock": {phase: corev1.PodPending, created: lockTime.Add(5 * time.Second), wantGets: 1},
		"another pod under the name, created after":    {phase: corev1.PodPending, created: lockTime.Add(6 * time.Second), wantLock: mine, wantGets: 1},
		"failed, from the lister: no request":          {phase: corev1.PodFailed, created: lockTime.Add(-time.Hour), lister: true, wantLock: mine},
		"replaced, from the lister: no request":        {phase: corev1.PodPending, created: lockTime.Add(time.Minute), lister: true, wantLock: mine},
		"running, from the lister: locked, no request": {phase: corev1.PodRunning, created: lockTime.Add(-time.Hour), lister: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			c := newCluster(t, lockAnnotation(other), nil, "default/gpu-pod")
			owner := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "other", UID: types.UID("uid-other"),
				CreationTimestamp: metav1.NewTime(tc.created)}, Status: corev1.PodStatus{Phase: tc.phase}}
			opts := nodelock.Options{Clock: testingclock.NewFakeClock(t0)}
			if tc.lister {
				idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
				if err := idx.Add(owner); err != nil {
					t.Fatal(err)
				}
				opts.Pods = corev1listers.NewPodLister(idx)
			} else if err := c.Tracker().Add(owner); err != nil {
				t.Fatal(err)
			}
			l := newLocker(t, c, opts)
			err := l.Acquire(ctx, nodeName, gpuPod)
			wantPatches := 0
			if tc.wantLock != "" {
				wantPatches = 1
				if err != nil {
					t.Fatalf("Acquire: %v, want a takeover", err)
				}
			} else if !errors.Is(err, nodelock.ErrLocked) {
				t.Fatalf("Acquire: %v, want ErrLocked", err)
			}
			c.check(t, cmp.Or(tc.wantLock, other), wantPatches)
			if got := c.count("get", "pods"); got != tc.wantGets {
				t.Errorf("%d pod GETs, want %d", got, tc.wantGets)
			}
		})
	}
}
