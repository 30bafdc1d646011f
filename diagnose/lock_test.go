package diagnose_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/nodelock"
)

// lockCluster is a fake clientset with node gpu-1 locked with value lock ("" for none) and
// the pods.
func lockCluster(lock string, pods ...*corev1.Pod) *fake.Clientset {
	n := readyNode("gpu-1", time.Hour, lock)
	objs := []runtime.Object{&n}
	for _, p := range pods {
		objs = append(objs, p)
	}
	return fake.NewClientset(objs...)
}

// lockValue returns gpu-1's lock, "<absent>" for none.
func lockValue(t *testing.T, c *fake.Clientset) string {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(t.Context(), "gpu-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v, ok := n.Annotations[nodelock.Key]
	if !ok {
		return "<absent>"
	}
	if n.Annotations["hami.io/node-nvidia-register"] == "" {
		t.Error("the register annotation was lost")
	}
	return v
}

func TestLockOf(t *testing.T) {
	t.Parallel()
	live := bound("holder", 10*time.Second)
	tests := map[string]struct {
		node    string
		lock    string
		pods    []*corev1.Pod
		fail    string // a resource whose get fails with Forbidden
		wantErr error
		want    func(*testing.T, *diagnose.LockState)
	}{
		"holder gone":      {lock: lockAgo(time.Minute, "default/gone"), want: lockIs("default/gone", false, "no longer exists")},
		"live":             {lock: lockAgo(10*time.Second, "default/holder"), pods: []*corev1.Pod{live}, want: lockIs("default/holder", true, "")},
		"expired":          {lock: lockAgo(6*time.Minute, "default/holder"), pods: []*corev1.Pod{live}, want: lockIs("default/holder", true, "older than the lock timeout")},
		"malformed":        {lock: "garbage,x", want: checkMalformed},
		"no lock":          {wantErr: diagnose.ErrNoLock},
		"no node":          {node: "gpu-9", wantErr: diagnose.ErrNodeNotFound},
		"node forbidden":   {fail: "nodes", wantErr: diagnose.ErrAPI},
		"holder forbidden": {lock: lockAgo(time.Minute, "default/holder"), fail: "pods", wantErr: diagnose.ErrAPI},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := lockCluster(tc.lock, tc.pods...)
			if tc.fail != "" {
				c.PrependReactor("get", tc.fail, func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: tc.fail}, "x", errors.New("no RBAC"))
				})
			}
			l, err := diagnose.LockOf(t.Context(), c, cmp.Or(tc.node, "gpu-1"), opts())
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("LockOf: %v, want %v", err, tc.wantErr)
			}
			if tc.want != nil {
				tc.want(t, l)
			}
		})
	}
}

func checkMalformed(t *testing.T, l *diagnose.LockState) {
	t.Helper()
	if l.Value != "garbage,x" || !strings.Contains(l.Error, "expected 3 parts, got 2") || l.Stale == "" || l.Holder != "" {
		t.Errorf("Lock = %+v, want the parse error and a stale reason", l)
	}
}

func TestRemoveStaleLock(t *testing.T) {
	t.Parallel()
	gone := lockAgo(time.Minute, "default/gone")
	liveLock := lockAgo(10*time.Second, "default/holder")
	live := bound("holder", 10*time.Second)
	tests := map[string]struct {
		lock      string
		pods      []*corev1.Pod
		shown     diagnose.LockState
		patchErr  error
		wantErr   error
		wantLock  string
		wantPatch bool
	}{
		"stale: removed": {lock: gone, shown: diagnose.LockState{Node: "gpu-1", Value: gone}, wantLock: "<absent>", wantPatch: true},
		"malformed: removed": {
			lock: "garbage", shown: diagnose.LockState{Node: "gpu-1", Value: "garbage"}, wantLock: "<absent>", wantPatch: true,
		},
		"live: refused": {
			lock: liveLock, pods: []*corev1.Pod{live}, shown: diagnose.LockState{Node: "gpu-1", Value: liveLock},
			wantErr: diagnose.ErrNotStale, wantLock: liveLock,
		},
		"changed since shown: refused": {
			lock: liveLock, pods: []*corev1.Pod{live}, shown: diagnose.LockState{Node: "gpu-1", Value: gone},
			wantErr: diagnose.ErrNotStale, wantLock: liveLock,
		},
		"another stale value than shown: refused": {
			lock: lockAgo(time.Minute, "default/other"), shown: diagnose.LockState{Node: "gpu-1", Value: gone},
			wantErr: diagnose.ErrNotStale, wantLock: lockAgo(time.Minute, "default/other"),
		},
		"gone already":  {shown: diagnose.LockState{Node: "gpu-1", Value: gone}, wantErr: diagnose.ErrNoLock, wantLock: "<absent>"},
		"nothing shown": {lock: gone, wantErr: diagnose.ErrInvalidOptions, wantLock: gone},
		"patch forbidden": {
			lock: gone, shown: diagnose.LockState{Node: "gpu-1", Value: gone}, wantPatch: true,
			patchErr: apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "gpu-1", errors.New("no RBAC")),
			wantErr:  diagnose.ErrAPI, wantLock: gone,
		},
		"changed between the read and the patch": {
			lock: gone, shown: diagnose.LockState{Node: "gpu-1", Value: gone}, wantPatch: true,
			patchErr: apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, "gpu-1", errors.New("modified")),
			wantErr:  diagnose.ErrNotStale, wantLock: liveLock,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := lockCluster(tc.lock, tc.pods...)
			if tc.patchErr != nil {
				c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
					if apierrors.IsConflict(tc.patchErr) { // another writer took the lock first
						n, _ := c.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", "gpu-1")
						nn := n.(*corev1.Node).DeepCopy()
						nn.Annotations[nodelock.Key] = liveLock
						_ = c.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"), nn, "")
					}
					return true, nil, tc.patchErr
				})
			}
			err := diagnose.RemoveStaleLock(t.Context(), c, tc.shown, opts())
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("RemoveStaleLock: %v, want %v", err, tc.wantErr)
			}
			if got := lockValue(t, c); got != tc.wantLock {
				t.Errorf("lock = %q, want %q", got, tc.wantLock)
			}
			patched := slices.ContainsFunc(c.Actions(), func(a k8stesting.Action) bool { return a.GetVerb() == "patch" })
			if patched != tc.wantPatch {
				t.Errorf("patched %v, want %v", patched, tc.wantPatch)
			}
		})
	}
}

// The repair works on the report's lock: diagnose, show, remove.
func TestRemoveStaleLockFromReport(t *testing.T) {
	t.Parallel()
	gone := lockAgo(time.Minute, "default/gone")
	ev := bindEvidence(filtered("train-1", 30*time.Second), []corev1.Node{readyNode("gpu-1", time.Hour, gone)}, nil, lockedEvent())
	r, err := diagnose.AnalyzePod(ev, opts())
	if err != nil || r.Lock == nil {
		t.Fatalf("AnalyzePod: %v, lock %v", err, r.Lock)
	}
	c := lockCluster(gone)
	if err := diagnose.RemoveStaleLock(t.Context(), c, *r.Lock, opts()); err != nil {
		t.Fatal(err)
	}
	if got := lockValue(t, c); got != "<absent>" {
		t.Errorf("lock = %q, want it removed", got)
	}
}

func TestLockRepairRules(t *testing.T) {
	t.Parallel()
	var got []string
	for _, r := range diagnose.LockRepairRules() {
		got = append(got, fmt.Sprintf("%s %v", strings.Join(r.Resources, ","), r.Verbs))
	}
	want := []string{"nodes [get patch]", "pods [get]"}
	if !slices.Equal(got, want) {
		t.Errorf("rules = %v, want %v", got, want)
	}
}

// A stale lock, shown and then removed, as the doctor's unlock verb does.
func ExampleRemoveStaleLock() {
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1",
		Annotations: map[string]string{nodelock.Key: "2026-11-30T11:59:00Z,default,gone"}}}
	client := fake.NewClientset(node) // the holder pod default/gone does not exist
	lock, err := diagnose.LockOf(ctx, client, "gpu-1", opts())
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s: %s, stale: %s\n", lock.Node, lock.Value, lock.Stale)
	if err := diagnose.RemoveStaleLock(ctx, client, *lock, opts()); err != nil {
		fmt.Println(err)
		return
	}
	_, err = diagnose.LockOf(ctx, client, "gpu-1", opts())
	fmt.Println(errors.Is(err, diagnose.ErrNoLock))
	// Output:
	// gpu-1: 2026-11-30T11:59:00Z,default,gone, stale: its holder pod default/gone no longer exists
	// true
}
