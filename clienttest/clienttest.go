package clienttest

import (
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// resourceVersion numbers objects the way the API server does and the fake tracker does not.
var resourceVersion atomic.Int64

// NextResourceVersion returns a new resourceVersion, larger than every one before it in this
// process (decimal, as the API server's are), for objects a test creates or updates itself.
func NextResourceVersion() string { return strconv.FormatInt(resourceVersion.Add(1)+1000, 10) }

// NewClientset returns client-go's fake clientset holding objects, in which JSON merge
// patches of Nodes and Pods behave as the API server's do (see [ResourceVersions]). An object
// without a resourceVersion is given one; objects are copied, not kept.
func NewClientset(objects ...runtime.Object) *fake.Clientset {
	objs := make([]runtime.Object, 0, len(objects))
	for _, o := range objects {
		o = o.DeepCopyObject()
		if m, err := meta.Accessor(o); err == nil && m.GetResourceVersion() == "" {
			m.SetResourceVersion(NextResourceVersion())
		}
		objs = append(objs, o)
	}
	cs := fake.NewClientset(objs...)
	ResourceVersions(cs)
	return cs
}

// ResourceVersions makes JSON merge patches of Nodes and Pods on cs behave as the API
// server's: the object gets a new, larger resourceVersion (the fake's own patches leave it
// unchanged), so that code comparing resourceVersions sees the order of writes, and a patch
// that carries metadata.resourceVersion fails with 409 Conflict unless it is the object's (the
// API server's optimistic concurrency; the fake's own patches ignore it). Other patch types
// and subresources go on to the fake's reactors.
func ResourceVersions(cs *fake.Clientset) {
	var mu sync.Mutex
	for _, resource := range []string{"nodes", "pods"} {
		gvr := corev1.SchemeGroupVersion.WithResource(resource)
		cs.PrependReactor("patch", resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
			p, ok := a.(k8stesting.PatchAction)
			if !ok || p.GetPatchType() != types.MergePatchType || p.GetSubresource() != "" {
				return false, nil, nil
			}
			mu.Lock()
			defer mu.Unlock()
			obj, err := cs.Tracker().Get(gvr, p.GetNamespace(), p.GetName())
			if err != nil {
				return true, nil, err
			}
			current, err := meta.Accessor(obj)
			if err != nil {
				return true, nil, err
			}
			var pre struct {
				Metadata struct {
					ResourceVersion string `json:"resourceVersion"`
				} `json:"metadata"`
			}
			if err := json.Unmarshal(p.GetPatch(), &pre); err != nil {
				return true, nil, apierrors.NewBadRequest(fmt.Sprintf("decode patch: %v", err))
			}
			if rv := pre.Metadata.ResourceVersion; rv != "" && rv != current.GetResourceVersion() {
				return true, nil, apierrors.NewConflict(gvr.GroupResource(), p.GetName(),
					fmt.Errorf("the object has been modified; please apply your changes to the latest version and try again"))
			}
			orig, err := json.Marshal(obj)
			if err != nil {
				return true, nil, err
			}
			patched, err := jsonpatch.MergePatch(orig, p.GetPatch())
			if err != nil {
				return true, nil, apierrors.NewBadRequest(fmt.Sprintf("apply patch: %v", err))
			}
			var out runtime.Object = &corev1.Node{}
			if resource == "pods" {
				out = &corev1.Pod{}
			}
			if err := json.Unmarshal(patched, out); err != nil {
				return true, nil, apierrors.NewBadRequest(fmt.Sprintf("decode patched object: %v", err))
			}
			m, err := meta.Accessor(out)
			if err != nil {
				return true, nil, err
			}
			m.SetResourceVersion(NextResourceVersion())
			return true, out, cs.Tracker().Update(gvr, out, p.GetNamespace())
		})
	}
}

// Fail makes the next n requests verb resource (e.g. "patch", "nodes"; "*" matches any) on f
// fail with err; n below 0 makes all of them fail. Requests after the n-th go on to the other
// reactors. f is the clientset's embedded Fake: Fail(&cs.Fake, ...).
func Fail(f *k8stesting.Fake, verb, resource string, n int, err error) {
	var mu sync.Mutex
	f.PrependReactor(verb, resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if n == 0 {
			return false, nil, nil
		}
		n--
		return true, nil, err
	})
}
