package extender

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/schedcache"
)

// fuzzHandler is a ready extender's handler over a small fake cluster, for one fuzz target.
func fuzzHandler(f *testing.F) (context.Context, http.Handler) {
	f.Helper()
	client := fake.NewClientset(registered("n", 2, 23028), gpuNode("x", "[null]", 1), gpuPod("p", map[string]string{"nvidia.com/gpu": "1"}))
	ctx, e := fuzzExtender(f, client, Options{MaxBodyBytes: 1 << 16})
	return ctx, e.Handler()
}

// fuzzExtender is a ready extender over client (its node cache and pod informer from client),
// stopped and joined at the end of the fuzz target.
func fuzzExtender(f *testing.F, client *fake.Clientset, opts Options) (context.Context, *Extender) {
	f.Helper()
	factory := informers.NewSharedInformerFactory(client, 0)
	c, err := schedcache.New(factory.Core().V1().Nodes(), schedcache.Options{})
	if err != nil {
		f.Fatal(err)
	}
	opts.Pods = factory.Core().V1().Pods()
	e, err := New(client, c, opts)
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(klog.NewContext(f.Context(), klog.Background().V(10))) // quiet
	done := make(chan struct{}, 2)
	factory.Start(ctx.Done())
	go func() { _ = c.Run(ctx); done <- struct{}{} }()
	go func() { _ = e.Run(ctx); done <- struct{}{} }()
	f.Cleanup(func() {
		cancel()
		<-done
		<-done
		factory.Shutdown()
	})
	select {
	case <-e.Ready():
	case <-time.After(30 * time.Second):
		f.Fatal("extender not ready")
	}
	return ctx, e
}

const fuzzPod = `{"metadata":{"namespace":"default","name":"p","uid":"uid-p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpumem":"3000"}}}]}}`

// FuzzFilterRequest: any body gets a JSON ExtenderFilterResult with a proper status, never a
// crash; a refused request says why in Error.
func FuzzFilterRequest(f *testing.F) {
	for _, s := range []string{
		`{"Pod":` + fuzzPod + `,"NodeNames":["n","x","y"]}`,
		`{"Pod":` + fuzzPod + `,"Nodes":{"items":[{"metadata":{"name":"n"}}]}}`,
		`{"Pod":{"spec":{"initContainers":[{"resources":{"limits":{"nvidia.com/gpu":"-1"}}}]}},"NodeNames":null}`,
		`{"Pod":null}`, `{}`, `[]`, `{"Pod":` + fuzzPod + `}{}`, ``, `{"Pod":{"metadata":{"annotations":{"hami.io/node-scheduler-policy":"spread,binpack"}}}}`,
	} {
		f.Add([]byte(s))
	}
	ctx, h := fuzzHandler(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		status, out := serve(ctx, h, "POST", PathFilter, string(body))
		var res extenderv1.ExtenderFilterResult
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("status %d, body not a filter result: %q", status, out)
		}
		switch status {
		case http.StatusOK:
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			if !strings.Contains(res.Error, ErrBadRequest.Error()) {
				t.Fatalf("status %d without a reason: %q", status, out)
			}
		default:
			t.Fatalf("status %d: %q", status, out)
		}
		if res.NodeNames != nil && len(*res.NodeNames) > 0 && (res.FailedNodes != nil || res.FailedAndUnresolvableNodes != nil) {
			t.Fatalf("chosen nodes and failed nodes together: %q", out)
		}
	})
}

// FuzzBindRequest: any body gets a JSON ExtenderBindingResult with a proper status.
func FuzzBindRequest(f *testing.F) {
	for _, s := range []string{
		`{"PodName":"p","PodNamespace":"default","PodUID":"uid-p","Node":"n"}`,
		`{"PodName":"p","PodNamespace":"default","Node":"x"}`, `{"PodName":"q"}`, `{}`, `null`, `{"PodName":1}`,
	} {
		f.Add([]byte(s))
	}
	ctx, h := fuzzHandler(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		status, out := serve(ctx, h, "POST", PathBind, string(body))
		var res extenderv1.ExtenderBindingResult
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("status %d, body not a binding result: %q", status, out)
		}
		if status != http.StatusOK && (status != http.StatusBadRequest && status != http.StatusRequestEntityTooLarge || res.Error == "") {
			t.Fatalf("status %d: %q", status, out)
		}
	})
}

// FuzzWebhookRequest: any body gets an AdmissionReview with a proper status; a patch applies
// to the pod it was computed for and leaves a Pod.
func FuzzWebhookRequest(f *testing.F) {
	review := func(pod string) string {
		return `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE","object":` + pod + `}}`
	}
	for _, s := range []string{
		review(fuzzPod), review(`{"spec":{"containers":[{"name":"a"},{"name":"b","env":[],"resources":{"limits":{"nvidia.com/gpucores":"1","nvidia.com/priority":"2"}}}]}}`),
		review(`{"spec":{"containers":[{"name":"a","resources":{}}]}}`), review(`{"spec":{"nodeName":"n","containers":[{"resources":{"limits":{"nvidia.com/gpumem-percentage":"100"}}}]}}`),
		review(`{"spec":{"containers":[]}}`), review(`"pod"`), `{"request":null}`, `{}`,
		review(`{"metadata":{"annotations":{"hami.io/vgpu-node":"n","hami.io/bind-phase":"allocating"}},"spec":{"schedulerName":"x","containers":[{"name":"a"}]}}`),
		`{"request":{"uid":"u","kind":{"kind":"Pod"},"operation":"UPDATE","userInfo":{"username":"alice"},"object":{"metadata":{"annotations":{"hami.io/vgpu-node":"n"}}},"oldObject":{"metadata":{}}}}`,
		`{"request":{"uid":"u","kind":{"kind":"Pod"},"operation":"UPDATE","userInfo":{"groups":["system:masters"]},"object":{"metadata":{}},"oldObject":{"metadata":{"annotations":{"hami.io/bind-time":"1"}}}}}`,
	} {
		f.Add([]byte(s))
	}
	ctx, h := fuzzHandler(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		status, out := serve(ctx, h, "POST", PathWebhook, string(body))
		var res admissionv1.AdmissionReview
		if err := json.Unmarshal([]byte(out), &res); err != nil || res.Response == nil {
			t.Fatalf("status %d, body not an admission review: %q", status, out)
		}
		if status != http.StatusOK {
			if status != http.StatusBadRequest && status != http.StatusRequestEntityTooLarge || res.Response.Allowed {
				t.Fatalf("status %d: %q", status, out)
			}
			return
		}
		var in admissionv1.AdmissionReview
		// Nobody creates a pod that carries an allocation annotation.
		if json.Unmarshal(body, &in) == nil && in.Request != nil && in.Request.Kind.Kind == "Pod" &&
			(in.Request.Operation == "" || in.Request.Operation == admissionv1.Create) && res.Response.Allowed {
			if ann, err := podAnnotations(in.Request.Object.Raw); err == nil {
				for _, k := range AllocationAnnotationKeys(annotation.NVIDIA()) {
					if _, ok := ann[k]; ok {
						t.Fatalf("pod created with %s allowed: %q", k, body)
					}
				}
			}
		}
		if res.Response.Patch == nil {
			return
		}
		if err := json.Unmarshal(body, &in); err != nil {
			t.Fatalf("a patch for a body that does not decode: %q", body)
		}
		patch, err := jsonpatch.DecodePatch(res.Response.Patch)
		if err != nil {
			t.Fatalf("patch %s: %v", res.Response.Patch, err)
		}
		patched, err := patch.Apply(in.Request.Object.Raw)
		if err != nil {
			t.Fatalf("patch %s does not apply to %s: %v", res.Response.Patch, in.Request.Object.Raw, err)
		}
		var pod corev1.Pod
		if err := json.Unmarshal(patched, &pod); err != nil || pod.Spec.SchedulerName != DefaultSchedulerName {
			t.Fatalf("patched pod %s: %v", patched, err)
		}
	})
}
