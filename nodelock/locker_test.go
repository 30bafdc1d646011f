package nodelock_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/nodelock"
)

func TestNew(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset().CoreV1()
	tests := map[string]struct {
		client      nodelock.Client
		opts        nodelock.Options
		wantErr     error
		wantTimeout time.Duration
	}{
		"defaults":          {client: client, wantTimeout: nodelock.DefaultTimeout},
		"own timeout":       {client: client, opts: nodelock.Options{Timeout: 30 * time.Second}, wantTimeout: 30 * time.Second},
		"one try":           {client: client, opts: nodelock.Options{Backoff: wait.Backoff{Steps: 1}}, wantTimeout: nodelock.DefaultTimeout},
		"nil client":        {wantErr: nodelock.ErrInvalidOptions},
		"negative timeout":  {client: client, opts: nodelock.Options{Timeout: -time.Second}, wantErr: nodelock.ErrInvalidOptions},
		"no tries":          {client: client, opts: nodelock.Options{Backoff: wait.Backoff{Duration: time.Second}}, wantErr: nodelock.ErrInvalidOptions},
		"negative duration": {client: client, opts: nodelock.Options{Backoff: wait.Backoff{Duration: -time.Second, Steps: 3}}, wantErr: nodelock.ErrInvalidOptions},
		"negative jitter":   {client: client, opts: nodelock.Options{Backoff: wait.Backoff{Jitter: -1, Steps: 3}}, wantErr: nodelock.ErrInvalidOptions},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l, err := nodelock.New(tc.client, tc.opts)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("New: %v, want %v", err, tc.wantErr)
			}
			if err == nil && l.Timeout() != tc.wantTimeout {
				t.Errorf("Timeout() = %v, want %v", l.Timeout(), tc.wantTimeout)
			}
		})
	}
}

func TestDefaultBackoffIsHAMis(t *testing.T) {
	t.Parallel()
	want := wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: 5}
	if got := nodelock.DefaultBackoff(); got != want {
		t.Errorf("DefaultBackoff() = %+v, want %+v", got, want)
	}
}

func TestAcquire(t *testing.T) {
	t.Parallel()
	mine := lockAt(t0, "default/gpu-pod")
	tests := map[string]struct {
		lock    string // "" means no lock
		managed []metav1.ManagedFieldsEntry
		pods    []string // pods that exist besides default/gpu-pod
		timeout time.Duration
		wantErr error
		// wantLock is the lock afterwards; "" means unchanged.
		wantLock    string
		wantPatches int
		wantPodGets int
	}{
		"free node": {wantLock: mine, wantPatches: 1},
		"held by a live pod": {
			lock: lockAt(t0.Add(-time.Minute), "default/other"), pods: []string{"default/other"},
			wantErr: nodelock.ErrLocked, wantPodGets: 1,
		},
		"held by a live pod for exactly the timeout": { // HAMi: expired only when older
			lock: lockAt(t0.Add(-5*time.Minute), "default/other"), pods: []string{"default/other"},
			wantErr: nodelock.ErrLocked, wantPodGets: 1,
		},
		"expired one second after the timeout": {
			lock: lockAt(t0.Add(-5*time.Minute-time.Second), "default/other"), pods: []string{"default/other"},
			wantLock: mine, wantPatches: 1,
		},
		"expired 6 minutes ago, no pod lookup": {
			lock: lockAt(t0.Add(-6*time.Minute), "default/other"), pods: []string{"default/other"},
			wantLock: mine, wantPatches: 1,
		},
		"own timeout": {
			lock: lockAt(t0.Add(-time.Minute), "default/other"), pods: []string{"default/other"}, timeout: 30 * time.Second,
			wantLock: mine, wantPatches: 1,
		},
		"owner pod gone": {
			lock:     lockAt(t0.Add(-time.Minute), "default/gone"),
			wantLock: mine, wantPatches: 1, wantPodGets: 1,
		},
		"same name in another namespace is another pod": {
			lock: lockAt(t0.Add(-time.Minute), "other-ns/gpu-pod"), pods: []string{"other-ns/gpu-pod"},
			wantErr: nodelock.ErrLocked, wantPodGets: 1,
		},
		"own lock is acquired without a write": {lock: lockAt(t0.Add(-time.Minute), "default/gpu-pod")},
		"own expired lock is renewed": {
			lock: lockAt(t0.Add(-6*time.Minute), "default/gpu-pod"), wantLock: mine, wantPatches: 1,
		},
		"legacy lock, fresh: nobody to ask": {lock: lockAt(t0.Add(-time.Minute), ""), wantErr: nodelock.ErrLocked},
		"legacy lock, expired":              {lock: lockAt(t0.Add(-6*time.Minute), ""), wantLock: mine, wantPatches: 1},
		"empty owner parts, fresh":          {lock: t0.Add(-time.Minute).Format(time.RFC3339) + ",,", wantErr: nodelock.ErrLocked},
		"namespace without pod, fresh":      {lock: t0.Add(-time.Minute).Format(time.RFC3339) + ",default,", wantErr: nodelock.ErrLocked},
		"future lock of a live pod": { // HAMi's vectors: a 2099 lock counts as recent
			lock: "2099-01-01T00:00:00Z,default,other", pods: []string{"default/other"},
			wantErr: nodelock.ErrLocked, wantPodGets: 1,
		},
		"future lock of a gone pod": {
			lock: "2099-01-01T00:00:00Z,default,gone", wantLock: mine, wantPatches: 1, wantPodGets: 1,
		},
		// Deliberate difference: HAMi fails every bind on an unreadable value, forever. Its
		// age comes from the API server's record of the key's last write (managedFields).
		"unreadable value written a minute ago": {
			lock: "not-a-time,default", managed: managedAt(t0.Add(-time.Minute)), wantErr: nodelock.ErrMalformed,
		},
		"unreadable value written 6 minutes ago": {
			lock: "not-a-time,default", managed: managedAt(t0.Add(-6 * time.Minute)), wantLock: mine, wantPatches: 1,
		},
		"unreadable value without a recorded write": {lock: "not-a-time,default", wantLock: mine, wantPatches: 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			c := newCluster(t, lockAnnotation(tc.lock), tc.managed, append(tc.pods, "default/gpu-pod")...)
			l := newLocker(t, c, nodelock.Options{Clock: testingclock.NewFakeClock(t0), Timeout: tc.timeout})
			err := l.Acquire(ctx, nodeName, gpuPod)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Acquire: %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr != nil && !errors.Is(err, nodelock.ErrLocked) {
				t.Errorf("Acquire: %v does not wrap ErrLocked", err)
			}
			c.check(t, cmp.Or(tc.wantLock, tc.lock, "<absent>"), tc.wantPatches)
			if got := c.count("get", "pods"); got != tc.wantPodGets {
				t.Errorf("%d pod GETs, want %d", got, tc.wantPodGets)
			}
		})
	}
}

// The contention error carries the detail and starts with HAMi's words.
func TestLockedError(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		lock     string
		managed  []metav1.ManagedFieldsEntry
		pods     []string
		want     string
		wantLock nodelock.Lock
		wantAge  time.Duration
	}{
		"pod": {
			lock: "2026-05-19T09:18:30Z,default,train-0", pods: []string{"default/train-0"},
			want:     "node node1 has been locked within 5m0s by pod default/train-0 since 2026-05-19T09:18:30Z (1m30s ago)",
			wantLock: nodelock.Lock{Time: t0.Add(-90 * time.Second), Namespace: "default", Name: "train-0"}, wantAge: 90 * time.Second,
		},
		"legacy": {
			lock:     "2026-05-19T11:19:00+02:00",
			want:     "node node1 has been locked within 5m0s by an unknown owner (legacy lock without a pod) since 2026-05-19T09:19:00Z (1m0s ago)",
			wantLock: nodelock.Lock{Time: t0.Add(-time.Minute)}, wantAge: time.Minute,
		},
		"future": {
			lock: "2099-01-01T00:00:00Z,default,train-0", pods: []string{"default/train-0"},
			want:     "node node1 has been locked within 5m0s by pod default/train-0 since 2099-01-01T00:00:00Z (636590h40m0s in the future)",
			wantLock: nodelock.Lock{Time: time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC), Namespace: "default", Name: "train-0"},
			wantAge:  t0.Sub(time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)),
		},
		"unreadable": {
			lock: "not-a-time,default", managed: managedAt(t0.Add(-2 * time.Minute)),
			want: `node node1 has been locked within 5m0s by an unreadable value "not-a-time,default", last written at 2026-05-19T09:18:00Z (2m0s ago): ` +
				`parse node lock "not-a-time,default": expected 3 parts, got 2 (want <RFC 3339 time>,<namespace>,<pod>): malformed node lock`,
			wantAge: 2 * time.Minute,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			c := newCluster(t, map[string]string{nodelock.Key: tc.lock}, tc.managed, tc.pods...)
			l := newLocker(t, c, nodelock.Options{Clock: testingclock.NewFakeClock(t0)})
			err := l.Acquire(ctx, nodeName, gpuPod)
			var le *nodelock.LockedError
			if !errors.As(err, &le) {
				t.Fatalf("Acquire: %v, want a *LockedError", err)
			}
			if err.Error() != tc.want {
				t.Errorf("message:\n got %s\nwant %s", err, tc.want)
			}
			if le.Node != nodeName || le.Value != tc.lock || le.Lock != tc.wantLock || le.Age != tc.wantAge || le.Timeout != nodelock.DefaultTimeout {
				t.Errorf("LockedError = %+v", le)
			}
		})
	}
}

// A 409 Conflict means someone wrote the Node after Acquire read it: read again, decide
// again. Another scheduler's lock is never overwritten.
func TestAcquireConflict(t *testing.T) {
	t.Parallel()
	otherLock := lockAt(t0, "default/other")
	setOther := func(n *corev1.Node) { n.Annotations[nodelock.Key] = otherLock }
	touch := func(n *corev1.Node) { n.Annotations["hami.io/node-handshake"] = "Requesting_2026-05-19 09:20:00" }
	tests := map[string]struct {
		lock        string
		before      func(*corev1.Node) // the write that gets in before each patch
		times       int                // how many patches it precedes (-1: all)
		wantErr     error
		wantLock    string
		wantPatches int
	}{
		"unrelated write, then the lock": {before: touch, times: 1, wantLock: lockAt(t0, "default/gpu-pod"), wantPatches: 2},
		"another scheduler took the free lock first": {
			before: setOther, times: 1, wantErr: nodelock.ErrLocked, wantLock: otherLock, wantPatches: 1,
		},
		// Deliberate difference: HAMi's forced removal before a takeover re-reads the Node and
		// removes whatever lock is there, including one just taken by another scheduler.
		"another scheduler took over the expired lock first": {
			lock: lockAt(t0.Add(-6*time.Minute), "default/stale"), before: setOther, times: 1,
			wantErr: nodelock.ErrLocked, wantLock: otherLock, wantPatches: 1,
		},
		"another scheduler took over from a gone owner first": {
			lock: lockAt(t0.Add(-time.Minute), "default/gone"), before: setOther, times: 1,
			wantErr: nodelock.ErrLocked, wantLock: otherLock, wantPatches: 1,
		},
		"writes that never stop": {
			before: touch, times: -1, wantErr: errConflict, wantLock: "<absent>", wantPatches: 11,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			c := newCluster(t, lockAnnotation(tc.lock), nil, "default/gpu-pod", "default/other")
			c.editBeforePatches(tc.times, tc.before)
			l := newLocker(t, c, nodelock.Options{Clock: testingclock.NewFakeClock(t0)})
			err := l.Acquire(ctx, nodeName, gpuPod)
			switch {
			case errors.Is(tc.wantErr, errConflict):
				if !apierrors.IsConflict(err) {
					t.Fatalf("Acquire: %v, want the last Conflict", err)
				}
			case !errors.Is(err, tc.wantErr):
				t.Fatalf("Acquire: %v, want %v", err, tc.wantErr)
			}
			var le *nodelock.LockedError
			if errors.As(err, &le) && le.Holder() != "pod default/other" {
				t.Errorf("holder %q, want the scheduler that got there first", le.Holder())
			}
			c.check(t, tc.wantLock, tc.wantPatches)
			if got := c.count("get", "nodes"); got != tc.wantPatches+btoi(errors.Is(tc.wantErr, nodelock.ErrLocked)) {
				t.Errorf("%d node GETs for %d patches", got, tc.wantPatches)
			}
		})
	}
}

// errConflict marks a test case that expects the API server's Conflict.
var errConflict = errors.New("conflict")

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Transient errors are retried with HAMi's backoff; refusals are not retried. Time runs in
// a synctest bubble, so the waits take no real time and their lengths can be checked.
func TestAcquireRetries(t *testing.T) {
	t.Parallel()
	unavailable := apierrors.NewServiceUnavailable("etcd leader changed")
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, nodeName,
		errors.New(`User "system:serviceaccount:kube-system:hami-scheduler" cannot patch resource "nodes"`))
	tests := map[string]struct {
		verb, resource string
		failures       int
		err            error
		wantCalls      int
		// wantWait is the least total wait; jitter adds up to half of it.
		wantWait  time.Duration
		wantErr   func(error) bool
		wantInMsg string
		wantLock  bool
	}{
		"patch unavailable twice": {
			verb: "patch", resource: "nodes", failures: 2, err: unavailable,
			wantCalls: 3, wantWait: 300 * time.Millisecond, wantLock: true,
		},
		"get failing four times": {
			verb: "get", resource: "nodes", failures: 4, err: apierrors.NewInternalError(errors.New("boom")),
			wantCalls: 5, wantWait: 1500 * time.Millisecond, wantLock: true,
		},
		"patch always unavailable": {
			verb: "patch", resource: "nodes", failures: -1, err: unavailable,
			wantCalls: 5, wantWait: 1500 * time.Millisecond, wantErr: apierrors.IsServiceUnavailable, wantInMsg: "gave up after 5 tries",
		},
		"forbidden is not retried": {
			verb: "patch", resource: "nodes", failures: -1, err: forbidden,
			wantCalls: 1, wantErr: apierrors.IsForbidden, wantInMsg: "see nodelock.ClusterRoleRules",
		},
		"missing node is not retried": {
			verb: "get", resource: "nodes", failures: -1, err: apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, nodeName),
			wantCalls: 1, wantErr: apierrors.IsNotFound, wantInMsg: `get node "node1"`,
		},
		"pod lookup forbidden: no takeover": {
			verb: "get", resource: "pods", failures: -1,
			err:       apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "other", errors.New("no")),
			wantCalls: 1, wantErr: apierrors.IsForbidden, wantInMsg: `get pod "default/other"`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				_, ctx := ktesting.NewTestContext(t)
				ann := map[string]string{}
				if tc.resource == "pods" {
					ann[nodelock.Key] = lockAt(time.Now().Add(-time.Minute), "default/other")
				}
				c := newCluster(t, ann, nil, "default/gpu-pod", "default/other")
				c.fail(tc.verb, tc.resource, tc.failures, tc.err)
				l := newLocker(t, c, nodelock.Options{}) // the real clock, bubbled
				start := time.Now()
				err := l.Acquire(ctx, nodeName, gpuPod)
				waited := time.Since(start)
				switch {
				case tc.wantErr == nil && err != nil:
					t.Fatalf("Acquire: %v", err)
				case tc.wantErr != nil && !tc.wantErr(err):
					t.Fatalf("Acquire: %v, not the expected class", err)
				}
				if err != nil && !strings.Contains(err.Error(), tc.wantInMsg) {
					t.Errorf("error %q lacks %q", err, tc.wantInMsg)
				}
				if got := c.count(tc.verb, tc.resource); got != tc.wantCalls {
					t.Errorf("%d %s %s, want %d", got, tc.verb, tc.resource, tc.wantCalls)
				}
				if waited < tc.wantWait || waited > tc.wantWait*3/2 {
					t.Errorf("waited %v, want %v to %v", waited, tc.wantWait, tc.wantWait*3/2)
				}
				if _, has := c.node().Annotations[nodelock.Key]; has != (tc.wantLock || tc.resource == "pods") {
					t.Errorf("lock present = %v", has)
				}
			})
		})
	}
}

// A cancelled context ends the wait between retries at once, with the cause.
func TestAcquireCancelledDuringBackoff(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		c := newCluster(t, nil, nil)
		c.fail("patch", "nodes", -1, apierrors.NewTooManyRequests("slow down", 1))
		l := newLocker(t, c, nodelock.Options{Backoff: wait.Backoff{Duration: time.Hour, Steps: 3}})
		ctx, cancel := context.WithCancelCause(ctx)
		cause := errors.New("bind request abandoned")
		done := make(chan error)
		go func() { done <- l.Acquire(ctx, nodeName, gpuPod) }()
		synctest.Wait() // Acquire is waiting for its first retry
		cancel(cause)
		err := <-done
		if !errors.Is(err, cause) || !apierrors.IsTooManyRequests(err) {
			t.Errorf("Acquire: %v, want the cause and the last API error", err)
		}
		if got := c.count("patch", "nodes"); got != 1 {
			t.Errorf("%d patches, want 1", got)
		}
	})
}

func TestInvalidArguments(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		node string
		pod  types.NamespacedName
	}{
		"empty node":      {pod: gpuPod},
		"empty namespace": {node: nodeName, pod: types.NamespacedName{Name: "p"}},
		"empty name":      {node: nodeName, pod: types.NamespacedName{Namespace: "default"}},
		"comma in name":   {node: nodeName, pod: types.NamespacedName{Namespace: "default", Name: "a,b"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			c := newCluster(t, nil, nil)
			l := newLocker(t, c, nodelock.Options{})
			if err := l.Acquire(ctx, tc.node, tc.pod); !errors.Is(err, nodelock.ErrInvalidArgument) {
				t.Errorf("Acquire: %v", err)
			}
			if err := l.Release(ctx, tc.node, tc.pod); !errors.Is(err, nodelock.ErrInvalidArgument) {
				t.Errorf("Release: %v", err)
			}
			if len(c.Actions()) != 0 {
				t.Errorf("requests sent: %v", c.Actions())
			}
		})
	}
	_, ctx := ktesting.NewTestContext(t)
	if err := newLocker(t, newCluster(t, nil, nil), nodelock.Options{}).ForceRelease(ctx, ""); !errors.Is(err, nodelock.ErrInvalidArgument) {
		t.Errorf("ForceRelease: %v", err)
	}
}

func TestRelease(t *testing.T) {
	t.Parallel()
	mine := lockAt(t0.Add(-time.Minute), "default/gpu-pod")
	otherLock := lockAt(t0, "default/other")
	tests := map[string]struct {
		lock        string
		before      func(*corev1.Node) // a write that gets in before the first patch
		wantErr     error
		wantLock    string
		wantPatches int
	}{
		"own lock":  {lock: mine, wantLock: "<absent>", wantPatches: 1},
		"no lock":   {wantLock: "<absent>"},
		"other pod": {lock: otherLock, wantErr: nodelock.ErrNotOwner, wantLock: otherLock},
		"same name in another namespace": {
			lock: lockAt(t0, "kube-system/gpu-pod"), wantErr: nodelock.ErrNotOwner, wantLock: lockAt(t0, "kube-system/gpu-pod"),
		},
		"legacy lock": {lock: lockAt(t0, ""), wantErr: nodelock.ErrNotOwner, wantLock: lockAt(t0, "")},
		// HAMi's test is the suffix ",<namespace>,<pod>", so it removes an unreadable value
		// that names the pod; so does Release.
		"unreadable value naming this pod": {lock: "yesterday,default,gpu-pod", wantLock: "<absent>", wantPatches: 1},
		"own expired lock":                 {lock: lockAt(t0.Add(-time.Hour), "default/gpu-pod"), wantLock: "<absent>", wantPatches: 1},
		"unrelated write first": {
			lock: mine, before: func(n *corev1.Node) { n.Annotations["x"] = "y" }, wantLock: "<absent>", wantPatches: 2,
		},
		"taken over in between": { // re-read: now it is another pod's, left in place
			lock: mine, before: func(n *corev1.Node) { n.Annotations[nodelock.Key] = otherLock },
			wantErr: nodelock.ErrNotOwner, wantLock: otherLock, wantPatches: 1,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			c := newCluster(t, lockAnnotation(tc.lock), nil)
			c.editBeforePatches(1, tc.before)
			l := newLocker(t, c, nodelock.Options{Clock: testingclock.NewFakeClock(t0)})
			err := l.Release(ctx, nodeName, gpuPod)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Release: %v, want %v", err, tc.wantErr)
			}
			var ne *nodelock.NotOwnerError
			if errors.As(err, &ne) {
				if ne.Node != nodeName || ne.Pod != gpuPod || ne.Value != tc.wantLock {
					t.Errorf("NotOwnerError = %+v", ne)
				}
				if !strings.Contains(err.Error(), "NodeLock is not set by this pod") {
					t.Errorf("message %q lacks HAMi's words", err)
				}
			}
			c.check(t, tc.wantLock, tc.wantPatches)
		})
	}
}

func TestNotOwnerErrorMessage(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	c := newCluster(t, map[string]string{nodelock.Key: "2026-05-19T09:14:52Z,default,b"}, nil)
	err := newLocker(t, c, nodelock.Options{}).Release(ctx, nodeName, types.NamespacedName{Namespace: "default", Name: "a"})
	want := "release lock of node node1 for pod default/a: NodeLock is not set by this pod: held by pod default/b since 2026-05-19T09:14:52Z: not the lock owner"
	if err == nil || err.Error() != want {
		t.Errorf("Release:\n got %v\nwant %s", err, want)
	}
}

func TestForceRelease(t *testing.T) {
	t.Parallel()
	newer := lockAt(t0, "default/newer")
	tests := map[string]struct {
		lock        string
		before      func(*corev1.Node)
		wantPatches int
	}{
		"another pod's lock": {lock: lockAt(t0, "default/other"), wantPatches: 1},
		"unreadable value":   {lock: "garbage", wantPatches: 1},
		"no lock":            {},
		"a newer lock written in between is removed in turn": {
			lock: lockAt(t0, "default/other"), before: func(n *corev1.Node) { n.Annotations[nodelock.Key] = newer }, wantPatches: 2,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			c := newCluster(t, lockAnnotation(tc.lock), nil)
			c.editBeforePatches(1, tc.before)
			if err := newLocker(t, c, nodelock.Options{}).ForceRelease(ctx, nodeName); err != nil {
				t.Fatalf("ForceRelease: %v", err)
			}
			c.check(t, "<absent>", tc.wantPatches)
		})
	}
}

// The writes are JSON merge patches of the lock key alone, in HAMi's shape, with the
// resourceVersion that was read and the package's field manager.
func TestPatchBodies(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	c := newCluster(t, nil, nil)
	l := newLocker(t, c, nodelock.Options{Clock: testingclock.NewFakeClock(t0.Add(700 * time.Millisecond))})
	if err := l.Acquire(ctx, nodeName, gpuPod); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, nodeName, gpuPod); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`{"metadata":{"annotations":{"hami.io/mutex.lock":"2026-05-19T09:20:00Z,default,gpu-pod"},"resourceVersion":"1"}}`,
		`{"metadata":{"annotations":{"hami.io/mutex.lock":null},"resourceVersion":"2"}}`,
	}
	if got := c.patches(); !slices.Equal(got, want) {
		t.Errorf("patches:\n got %q\nwant %q", got, want)
	}
	for _, a := range c.Actions() {
		if p, ok := a.(k8stesting.PatchActionImpl); ok {
			if p.GetPatchType() != types.MergePatchType || p.PatchOptions.FieldManager != nodelock.FieldManager {
				t.Errorf("patch type %s, field manager %q", p.GetPatchType(), p.PatchOptions.FieldManager)
			}
		}
	}
}

// Many contenders at once, each with its own Locker: exactly one holds the lock, every other
// one is told who does; after the holder releases, the next round has a winner again.
func TestConcurrentAcquire(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	const contenders = 16
	pods := make([]string, contenders)
	for i := range pods {
		pods[i] = fmt.Sprintf("default/p%d", i)
	}
	c := newCluster(t, nil, nil, pods...)
	for round := range 5 {
		errs := make([]error, contenders)
		var wg sync.WaitGroup
		for i := range contenders {
			l := newLocker(t, c, nodelock.Options{Clock: testingclock.NewFakeClock(t0)})
			wg.Go(func() { errs[i] = l.Acquire(ctx, nodeName, parseName(pods[i])) })
		}
		wg.Wait()
		var holders []string
		for i, err := range errs {
			if err == nil {
				holders = append(holders, pods[i])
			}
		}
		if len(holders) != 1 {
			t.Fatalf("round %d: held by %v, want exactly one pod", round, holders)
		}
		for i, err := range errs {
			var le *nodelock.LockedError
			if pods[i] != holders[0] && (!errors.As(err, &le) || le.Holder() != "pod "+holders[0]) {
				t.Errorf("round %d: %s was told %v, want the holder %s", round, pods[i], err, holders[0])
			}
		}
		if err := newLocker(t, c, nodelock.Options{}).Release(ctx, nodeName, parseName(holders[0])); err != nil {
			t.Fatalf("round %d: release: %v", round, err)
		}
	}
}

func TestReleaseIf(t *testing.T) {
	t.Parallel()
	shown := lockAt(t0.Add(-time.Hour), "default/gone")
	newer := lockAt(t0, "default/newer")
	tests := map[string]struct {
		lock        string
		value       string
		before      func(*corev1.Node) // a write that gets in before the first patch
		wantErr     error
		wantLock    string
		wantPatches int
	}{
		"the value shown":        {lock: shown, value: shown, wantLock: "<absent>", wantPatches: 1},
		"no lock":                {value: shown, wantLock: "<absent>"},
		"another value":          {lock: newer, value: shown, wantErr: nodelock.ErrChanged, wantLock: newer},
		"an unreadable value":    {lock: "garbage", value: "garbage", wantLock: "<absent>", wantPatches: 1},
		"a legacy value":         {lock: lockAt(t0, ""), value: lockAt(t0, ""), wantLock: "<absent>", wantPatches: 1},
		"same pod, another time": {lock: lockAt(t0, "default/gone"), value: shown, wantErr: nodelock.ErrChanged, wantLock: lockAt(t0, "default/gone")},
		"unrelated write first": {
			lock: shown, value: shown, before: func(n *corev1.Node) { n.Annotations["x"] = "y" }, wantLock: "<absent>", wantPatches: 2,
		},
		"taken over in between": { // the conflict reads again: now it is newer's, left in place
			lock: shown, value: shown, before: func(n *corev1.Node) { n.Annotations[nodelock.Key] = newer },
			wantErr: nodelock.ErrChanged, wantLock: newer, wantPatches: 1,
		},
		"empty value": {lock: shown, wantErr: nodelock.ErrInvalidArgument, wantLock: shown},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			c := newCluster(t, lockAnnotation(tc.lock), nil)
			c.editBeforePatches(1, tc.before)
			err := newLocker(t, c, nodelock.Options{Clock: testingclock.NewFakeClock(t0)}).ReleaseIf(ctx, nodeName, tc.value)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("ReleaseIf: %v, want %v", err, tc.wantErr)
			}
			var ce *nodelock.ChangedError
			if errors.As(err, &ce) {
				if ce.Node != nodeName || ce.Want != tc.value || ce.Value != tc.wantLock {
					t.Errorf("ChangedError = %+v", ce)
				}
			}
			c.check(t, tc.wantLock, tc.wantPatches)
		})
	}
}

func TestChangedErrorMessage(t *testing.T) {
	t.Parallel()
	err := &nodelock.ChangedError{Node: "gpu-1", Want: "2026-05-19T09:14:52Z,default,a", Value: "2026-05-19T09:20:00Z,default,b"}
	want := `unlock node gpu-1: the lock is now "2026-05-19T09:20:00Z,default,b" (pod default/b), not "2026-05-19T09:14:52Z,default,a"; nothing was removed (read it again): node lock changed`
	if err.Error() != want {
		t.Errorf("Error:\n got %s\nwant %s", err, want)
	}
}

func TestReleaseIfForbidden(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	shown := lockAt(t0, "default/a")
	c := newCluster(t, lockAnnotation(shown), nil)
	c.fail("patch", "nodes", -1, apierrors.NewForbidden(nodesGVR.GroupResource(), nodeName, errors.New("no RBAC policy matched")))
	err := newLocker(t, c, nodelock.Options{}).ReleaseIf(ctx, nodeName, shown)
	var apiErr *nodelock.APIError
	if !errors.As(err, &apiErr) || !apierrors.IsForbidden(err) {
		t.Fatalf("ReleaseIf: %v, want a Forbidden APIError", err)
	}
	c.check(t, shown, 1)
}
