package nodelock_test

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hamireg/hamireg/clienttest"
	"github.com/hamireg/hamireg/nodelock"
)

// nodeName is the Node of every unit test (named as in HAMi's vectors); gpuPod the pod that
// asks for the lock.
const nodeName = "node1"

var (
	gpuPod   = types.NamespacedName{Namespace: "default", Name: "gpu-pod"}
	nodesGVR = corev1.SchemeGroupVersion.WithResource("nodes")
)

// t0 is the fake clock's time in unit tests.
var t0 = time.Date(2026, 5, 19, 9, 20, 0, 0, time.UTC)

// cluster is a fake clientset whose node patches behave like the API server's: a merge
// patch that carries a non-empty metadata.resourceVersion is refused with 409 Conflict unless
// the Node still has that version, and every write gives the Node a new one (the fake's
// own tracker does neither).
type cluster struct {
	*fake.Clientset
	t  testing.TB
	mu sync.Mutex // serialises node writes, as etcd does
	rv int
}

// newCluster returns a cluster with the Node nodeName (annotations as given, plus the
// register annotation that must survive every test) and the named pods of namespace/name.
func newCluster(tb testing.TB, annotations map[string]string, managed []metav1.ManagedFieldsEntry, pods ...string) *cluster {
	tb.Helper()
	ann := map[string]string{"hami.io/node-nvidia-register": "[]"}
	for k, v := range annotations {
		ann[k] = v
	}
	objs := []runtime.Object{&corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: nodeName, Annotations: ann, ResourceVersion: "1", ManagedFields: managed,
	}}}
	for _, p := range pods {
		nn := parseName(p)
		objs = append(objs, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: nn.Namespace, Name: nn.Name}})
	}
	c := &cluster{Clientset: fake.NewClientset(objs...), t: tb, rv: 1}
	apply := k8stesting.ObjectReaction(c.Tracker())
	c.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		var body struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(a.(k8stesting.PatchAction).GetPatch(), &body); err != nil {
			return true, nil, apierrors.NewBadRequest(err.Error())
		}
		if rv := body.Metadata.ResourceVersion; rv != "" && rv != c.nodeLocked().ResourceVersion {
			return true, nil, apierrors.NewConflict(nodesGVR.GroupResource(), nodeName,
				errors.New("the object has been modified; please apply your changes to the latest version and try again"))
		}
		_, obj, err := apply(a)
		if err != nil {
			return true, nil, err
		}
		n := obj.(*corev1.Node)
		c.storeLocked(n)
		return true, n, nil
	})
	return c
}

// parseName parses "namespace/name".
func parseName(s string) types.NamespacedName {
	ns, name, _ := strings.Cut(s, "/")
	return types.NamespacedName{Namespace: ns, Name: name}
}

// nodeLocked returns the stored Node (an empty one if it is missing, which fails the test).
func (c *cluster) nodeLocked() *corev1.Node {
	obj, err := c.Tracker().Get(nodesGVR, "", nodeName)
	if err != nil {
		c.t.Errorf("get node from the tracker: %v", err)
		return &corev1.Node{}
	}
	return obj.(*corev1.Node)
}

// storeLocked stores n with the next resourceVersion.
func (c *cluster) storeLocked(n *corev1.Node) {
	c.rv++
	n.ResourceVersion = strconv.Itoa(c.rv)
	if err := c.Tracker().Update(nodesGVR, n, ""); err != nil {
		c.t.Errorf("update node in the tracker: %v", err)
	}
}

// edit changes the Node as another writer would (kubectl, another scheduler), with a new
// resourceVersion; a Locker that read the Node before gets a conflict on its next patch.
func (c *cluster) edit(f func(*corev1.Node)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodeLocked().DeepCopy()
	f(n)
	c.storeLocked(n)
}

// node returns the stored Node.
func (c *cluster) node() *corev1.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodeLocked()
}

// lock returns the lock annotation, or "<absent>".
func (c *cluster) lock() string {
	v, ok := c.node().Annotations[nodelock.Key]
	if !ok {
		return "<absent>"
	}
	return v
}

// editBeforePatches edits the Node with f (nil: nothing) before each of the next n node
// patches (n < 0: all), ahead of their resourceVersion check, playing a writer that got
// there first.
func (c *cluster) editBeforePatches(n int, f func(*corev1.Node)) {
	if f == nil {
		return
	}
	var mu sync.Mutex
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if n != 0 {
			n--
			c.edit(f)
		}
		return false, nil, nil
	})
}

// fail makes the next n requests verb resource fail with err (n < 0: all).
func (c *cluster) fail(verb, resource string, n int, err error) {
	clienttest.Fail(&c.Fake, verb, resource, n, err)
}

// count returns how many requests verb resource the clientset got.
func (c *cluster) count(verb, resource string) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetVerb() == verb && a.GetResource().Resource == resource {
			n++
		}
	}
	return n
}

// patches returns the bodies of the node patches sent, in order.
func (c *cluster) patches() []string {
	var out []string
	for _, a := range c.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && a.GetResource().Resource == "nodes" {
			out = append(out, string(p.GetPatch()))
		}
	}
	return out
}

// managedAt is a managedFields entry that owns the lock key, stamped at t.
func managedAt(t time.Time) []metav1.ManagedFieldsEntry {
	return []metav1.ManagedFieldsEntry{{
		Manager: "kubectl-annotate", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
		Time: &metav1.Time{Time: t}, FieldsType: "FieldsV1",
		FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:annotations":{"f:` + nodelock.Key + `":{}}}}`),
	}}
}

// lockAt formats a lock of pod ("namespace/name", or "" for a legacy lock) at t.
func lockAt(t time.Time, pod string) string {
	if pod == "" {
		return nodelock.Lock{Time: t}.String()
	}
	return nodelock.NewLock(t, parseName(pod)).String()
}

// newLocker returns a Locker of c's clientset.
func newLocker(t *testing.T, c *cluster, opts nodelock.Options) *nodelock.Locker {
	t.Helper()
	l, err := nodelock.New(c.CoreV1(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// lockAnnotation returns the annotations of a Node with the lock value v ("" for none).
func lockAnnotation(v string) map[string]string {
	if v == "" {
		return nil
	}
	return map[string]string{nodelock.Key: v}
}

// check checks the lock value afterwards ("<absent>" for none), that the register annotation
// is still there, and the number of node patches sent.
func (c *cluster) check(t *testing.T, wantLock string, wantPatches int) {
	t.Helper()
	if got := c.lock(); got != wantLock {
		t.Errorf("lock = %q, want %q", got, wantLock)
	}
	if got := c.node().Annotations["hami.io/node-nvidia-register"]; got != "[]" {
		t.Errorf("other annotation = %q, want it kept", got)
	}
	if got := c.count("patch", "nodes"); got != wantPatches {
		t.Errorf("%d node patches, want %d", got, wantPatches)
	}
}
