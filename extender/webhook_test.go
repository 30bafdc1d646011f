package extender

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hamireg/hamireg/schedcache"
)

// newWebhookExtender is an extender on an empty fake clientset whose informers do not run: for
// Admit, and for the metrics it registers.
func newWebhookExtender(t *testing.T, opts Options) *Extender {
	t.Helper()
	client := fake.NewClientset()
	c, err := schedcache.New(newNodeInformer(client), schedcache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(client, c, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestAdmit(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		pod          string // JSON
		opts         Options
		wantAllowed  bool
		wantMessage  string
		wantPatched  string // JSON of the pod after the patch; "" = no patch
		wantNoChange bool
	}{
		"gpumem only: count 1, scheduler name": {
			pod:         `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpumem":"3000"}}}]}}`,
			wantAllowed: true,
			wantPatched: `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpumem":"3000"}}}],"schedulerName":"hami-scheduler"}}`,
		},
		"whole GPU without cores: cores 100": {
			pod:         `{"metadata":{"name":"p"},"spec":{"schedulerName":"default-scheduler","containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}`,
			wantAllowed: true,
			wantPatched: `{"metadata":{"name":"p"},"spec":{"schedulerName":"hami-scheduler","containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpucores":"100"}}}]}}`,
		},
		"no resources key, priority env, sidecar untouched": {
			pod:         `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"side"},{"name":"c","resources":{"limits":{"nvidia.com/gpucores":"30","nvidia.com/priority":"1"}}}]}}`,
			wantAllowed: true,
			wantPatched: `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"side"},{"name":"c","env":[{"name":"CUDA_TASK_PRIORITY","value":"1"}],"resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpucores":"30","nvidia.com/priority":"1"}}}],"schedulerName":"hami-scheduler"}}`,
		},
		"memory percentage 100 decides over gpumem: cores 100": {
			pod:         `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpumem":"3000","nvidia.com/gpumem-percentage":"100"}}}]}}`,
			wantAllowed: true,
			wantPatched: `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpucores":"100","nvidia.com/gpumem":"3000","nvidia.com/gpumem-percentage":"100"}}}],"schedulerName":"hami-scheduler"}}`,
		},
		"memory percentage 50: no cores added": {
			pod:         `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpumem-percentage":"50"}}}]}}`,
			wantAllowed: true,
			wantPatched: `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpumem-percentage":"50"}}}],"schedulerName":"hami-scheduler"}}`,
		},
		"limits and env null, existing env kept, unknown fields and numbers untouched": {
			pod:         `{"metadata":{"name":"p"},"spec":{"futureField":{"x":[1,2]},"activeDeadlineSeconds":9007199254740993,"containers":[{"name":"a","env":null,"resources":{"limits":null,"requests":{"nvidia.com/gpu":"1"}}},{"name":"b","env":[{"name":"X","value":"1"}],"resources":{"limits":{"nvidia.com/gpu":"2","nvidia.com/priority":"0"}}}]}}`,
			wantAllowed: true,
			wantPatched: `{"metadata":{"name":"p"},"spec":{"futureField":{"x":[1,2]},"activeDeadlineSeconds":9007199254740993,"schedulerName":"hami-scheduler","containers":[{"name":"a","env":null,"resources":{"limits":null,"requests":{"nvidia.com/gpu":"1"}}},{"name":"b","env":[{"name":"X","value":"1"},{"name":"CUDA_TASK_PRIORITY","value":"0"}],"resources":{"limits":{"nvidia.com/gpu":"2","nvidia.com/gpucores":"100","nvidia.com/priority":"0"}}}]}}`,
		},
		"already mutated: allowed without a patch": {
			pod:         `{"metadata":{"name":"p"},"spec":{"schedulerName":"hami-scheduler","containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpucores":"100"}}}]}}`,
			wantAllowed: true, wantNoChange: true,
		},
		"no GPU: unchanged":          {pod: `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"cpu":"1"}}}]}}`, wantAllowed: true, wantNoChange: true},
		"other scheduler: unchanged": {pod: `{"metadata":{"name":"p"},"spec":{"schedulerName":"volcano","containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}`, wantAllowed: true, wantNoChange: true},
		"default scheduler kept": {
			pod:  `{"metadata":{"name":"p"},"spec":{"schedulerName":"default-scheduler","containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}`,
			opts: Options{KeepDefaultScheduler: true}, wantAllowed: true, wantNoChange: true,
		},
		"privileged container skipped": {
			pod:         `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","securityContext":{"privileged":true},"resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}`,
			wantAllowed: true, wantNoChange: true,
		},
		"no containers: denied":   {pod: `{"metadata":{"name":"p"},"spec":{"containers":[]}}`, wantMessage: "pod has no containers"},
		"node assigned: denied":   {pod: `{"metadata":{"name":"p"},"spec":{"nodeName":"n","containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}`, wantMessage: "pod has node assigned"},
		"not a pod object: error": {pod: `{"spec":{"containers":"x"}}`, wantMessage: "decode pod: …"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newWebhookExtender(t, tc.opts)
			req := &admissionv1.AdmissionRequest{UID: "u1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
				Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: []byte(tc.pod)}}
			resp := e.Admit(t.Context(), req)
			if resp.UID != "u1" || resp.Allowed != tc.wantAllowed {
				t.Fatalf("response = %+v", resp)
			}
			if tc.wantMessage != "" {
				msg := ""
				if resp.Result != nil {
					msg = resp.Result.Message
				}
				if p, ok := cutEllipsis(tc.wantMessage); ok && len(msg) >= len(p) && msg[:len(p)] == p {
					return
				}
				if msg != tc.wantMessage {
					t.Errorf("message = %q, want %q", msg, tc.wantMessage)
				}
				return
			}
			if tc.wantNoChange {
				if resp.Patch != nil {
					t.Errorf("patched %s", resp.Patch)
				}
				return
			}
			if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
				t.Fatalf("patch type %v", resp.PatchType)
			}
			patch, err := jsonpatch.DecodePatch(resp.Patch)
			if err != nil {
				t.Fatalf("patch %s: %v", resp.Patch, err)
			}
			got, err := patch.Apply([]byte(tc.pod))
			if err != nil {
				t.Fatalf("apply %s: %v", resp.Patch, err)
			}
			var a, b any
			decodeNumbers(t, got, &a)
			decodeNumbers(t, []byte(tc.wantPatched), &b)
			if diff := cmp.Diff(b, a); diff != "" {
				t.Errorf("pod after the patch %s (-want +got):\n%s", resp.Patch, diff)
			}
		})
	}
}

// decodeNumbers decodes JSON with numbers kept as written.
func decodeNumbers(t *testing.T, data []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decode %s: %v", data, err)
	}
}

func cutEllipsis(s string) (string, bool) {
	const e = "…"
	if len(s) >= len(e) && s[len(s)-len(e):] == e {
		return s[:len(s)-len(e)], true
	}
	return s, false
}

// TestAdmitOtherObjects: only pod creations are mutated; an update that leaves the allocation
// annotations alone is allowed unchanged.
func TestAdmitOtherObjects(t *testing.T) {
	t.Parallel()
	e := newWebhookExtender(t, Options{})
	for _, req := range []*admissionv1.AdmissionRequest{
		{UID: "a", Kind: metav1.GroupVersionKind{Kind: "Deployment"}, Operation: admissionv1.Create},
		{UID: "b", Kind: metav1.GroupVersionKind{Kind: "Pod"}, Operation: admissionv1.Update, Object: runtime.RawExtension{Raw: []byte(`{"spec":{}}`)},
			OldObject: runtime.RawExtension{Raw: []byte(`{}`)}},
	} {
		if resp := e.Admit(t.Context(), req); !resp.Allowed || resp.Patch != nil || resp.UID != req.UID {
			t.Errorf("%s: %+v", req.Kind.Kind, resp)
		}
	}
}
