package reactors

import (
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// resourceVersion numbers objects the way the API server does and the fake tracker does not.
var resourceVersion atomic.Int64

// NextResourceVersion returns a new resourceVersion, larger than every one before it.
func NextResourceVersion() string { return strconv.FormatInt(resourceVersion.Add(1)+1000, 10) }

// NodeResourceVersions makes merge patches of Nodes on cs give the Node a new, larger
// resourceVersion, as the API server does (the fake's own patches leave it unchanged), so
// that code comparing resourceVersions sees the order of writes.
func NodeResourceVersions(cs *fake.Clientset) {
	gvr := corev1.SchemeGroupVersion.WithResource("nodes")
	var mu sync.Mutex
	cs.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p, ok := a.(k8stesting.PatchAction)
		if !ok || p.GetPatchType() != types.MergePatchType || p.GetSubresource() != "" {
			return false, nil, nil
		}
		mu.Lock()
		defer mu.Unlock()
		obj, err := cs.Tracker().Get(gvr, "", p.GetName())
		if err != nil {
			return true, nil, err
		}
		orig, err := json.Marshal(obj)
		if err != nil {
			return true, nil, err
		}
		patched, err := jsonpatch.MergePatch(orig, p.GetPatch())
		if err != nil {
			return true, nil, err
		}
		n := &corev1.Node{}
		if err := json.Unmarshal(patched, n); err != nil {
			return true, nil, err
		}
		n.ResourceVersion = NextResourceVersion()
		return true, n, cs.Tracker().Update(gvr, n, "")
	})
}
