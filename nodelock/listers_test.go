package nodelock_test

import (
	"cmp"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/nodelock"
)

// listers returns the lister copies of the Node and the pods ("namespace/name") that an
// informer would hold: the Node as it is now, then changed by stale (nil: not at all) without
// a new resourceVersion, and without managedFields (schedcache.TrimNode drops them).
func listers(t *testing.T, c *cluster, stale func(*corev1.Node), pods ...string) (corev1listers.NodeLister, corev1listers.PodLister) {
	t.Helper()
	n := c.node().DeepCopy()
	n.ManagedFields = nil
	if stale != nil {
		stale(n)
	}
	nodes := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := nodes.Add(n); err != nil {
		t.Fatal(err)
	}
	podIndex := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, p := range pods {
		nn := parseName(p)
		if err := podIndex.Add(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: nn.Namespace, Name: nn.Name}}); err != nil {
			t.Fatal(err)
		}
	}
	return corev1listers.NewNodeLister(nodes), corev1listers.NewPodLister(podIndex)
}

// With Options.Nodes and Options.Pods, a free node costs one patch and a node held by a live
// pod no request; what a stale copy could get wrong is read from the API server.
func TestAcquireWithListers(t *testing.T) {
	t.Parallel()
	mine := lockAt(t0, "default/gpu-pod")
	other := lockAt(t0.Add(-time.Minute), "default/other")
	tests := map[string]struct {
		lock    string // on the API server's Node
		managed []metav1.ManagedFieldsEntry
		stale   func(*corev1.Node) // how the lister's copy differs
		pods    []string           // in the pod lister; the API server has default/other too
		wantErr error
		// wantLock is the lock afterwards; "" means unchanged.
		wantLock                       string
		wantPatches, wantGets, wantPod int
	}{
		"free node: one patch, no read":  {wantLock: mine, wantPatches: 1},
		"held by a live pod: no request": {lock: other, pods: []string{"default/other"}, wantErr: nodelock.ErrLocked},
		"owner not in the pod lister: a GET of the pod": {
			lock: other, wantErr: nodelock.ErrLocked, wantPod: 1,
		},
		"copy without the lock: the patch conflicts, the API's Node decides": {
			lock: other, stale: func(n *corev1.Node) { delete(n.Annotations, nodelock.Key); n.ResourceVersion = "0" },
			pods: []string{"default/other"}, wantErr: nodelock.ErrLocked, wantPatches: 1, wantGets: 1,
		},
		"copy with the pod's own lock, released since: read, then taken": {
			stale:    func(n *corev1.Node) { n.Annotations[nodelock.Key] = lockAt(t0.Add(-time.Second), "default/gpu-pod") },
			wantLock: mine, wantPatches: 1, wantGets: 1,
		},
		"unreadable value: read with its managedFields": {
			lock: "not-a-time,default", managed: managedAt(t0.Add(-time.Minute)), wantErr: nodelock.ErrMalformed, wantGets: 1,
		},
		"expired lock: taken over from the copy": {
			lock: lockAt(t0.Add(-6*time.Minute), "default/other"), pods: []string{"default/other"}, wantLock: mine, wantPatches: 1,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			c := newCluster(t, lockAnnotation(tc.lock), tc.managed, "default/gpu-pod", "default/other")
			nodes, pods := listers(t, c, tc.stale, tc.pods...)
			l := newLocker(t, c, nodelock.Options{Clock: testingclock.NewFakeClock(t0), Nodes: nodes, Pods: pods})
			if err := l.Acquire(ctx, nodeName, gpuPod); !errors.Is(err, tc.wantErr) {
				t.Fatalf("Acquire: %v, want %v", err, tc.wantErr)
			}
			c.check(t, cmp.Or(tc.wantLock, tc.lock, "<absent>"), tc.wantPatches)
			if got := c.count("get", "nodes"); got != tc.wantGets {
				t.Errorf("%d node GETs, want %d", got, tc.wantGets)
			}
			if got := c.count("get", "pods"); got != tc.wantPod {
				t.Errorf("%d pod GETs, want %d", got, tc.wantPod)
			}
		})
	}
}

func TestReleaseWithListers(t *testing.T) {
	t.Parallel()
	mine := lockAt(t0.Add(-time.Minute), "default/gpu-pod")
	other := lockAt(t0, "default/other")
	tests := map[string]struct {
		lock                  string
		stale                 func(*corev1.Node)
		wantErr               error
		wantLock              string
		wantPatches, wantGets int
	}{
		"own lock: one patch, no read": {lock: mine, wantLock: "<absent>", wantPatches: 1},
		"copy without the lock: read, then released": {
			lock: mine, stale: func(n *corev1.Node) { delete(n.Annotations, nodelock.Key); n.ResourceVersion = "0" },
			wantLock: "<absent>", wantPatches: 1, wantGets: 1,
		},
		"copy with another pod's lock, now the pod's: read, then released": {
			lock: mine, stale: func(n *corev1.Node) { n.Annotations[nodelock.Key] = other; n.ResourceVersion = "0" },
			wantLock: "<absent>", wantPatches: 1, wantGets: 1,
		},
		"another pod's lock: read, left in place": {lock: other, wantErr: nodelock.ErrNotOwner, wantLock: other, wantGets: 1},
		"stale copy of the own lock: the patch conflicts, the API's Node decides": {
			lock: other, stale: func(n *corev1.Node) { n.Annotations[nodelock.Key] = mine; n.ResourceVersion = "0" },
			wantErr: nodelock.ErrNotOwner, wantLock: other, wantPatches: 1, wantGets: 1,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			c := newCluster(t, lockAnnotation(tc.lock), nil)
			nodes, _ := listers(t, c, tc.stale)
			l := newLocker(t, c, nodelock.Options{Clock: testingclock.NewFakeClock(t0), Nodes: nodes})
			if err := l.Release(ctx, nodeName, gpuPod); !errors.Is(err, tc.wantErr) {
				t.Fatalf("Release: %v, want %v", err, tc.wantErr)
			}
			c.check(t, tc.wantLock, tc.wantPatches)
			if got := c.count("get", "nodes"); got != tc.wantGets {
				t.Errorf("%d node GETs, want %d", got, tc.wantGets)
			}
		})
	}
}
