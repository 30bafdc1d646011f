package extender

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/nodelock"
)

// mappingClass is the SDK profile's DeviceClass mapping nvidia.com/gpu.
func mappingClass(t *testing.T) *resourcev1.DeviceClass {
	t.Helper()
	c, err := dra.DeviceClassWith(dra.SDKProfile(), dra.DeviceClassOptions{ExtendedResourceName: "nvidia.com/gpu"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// draNodeObj is a node whose GPUs are all DRA's: the node agent registers them (cordoned) and
// the kubelet counts none.
func draNodeObj(name string) *corev1.Node {
	n := registered(name, 2, 23028)
	n.Status.Allocatable[corev1.ResourceName("nvidia.com/gpu")] = resource.MustParse("0")
	return n
}

func TestFilterDRANodes(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		pod        *corev1.Pod
		candidates []string
		noClass    bool
		wantNodes  []string          // NodeNames
		wantFailed map[string]string // node → reason prefix, FailedNodes and FailedAndUnresolvableNodes together
		patched    bool              // the pod carries HAMi's filter annotations
	}{
		"device-plugin node fits: as today": {
			pod: gpuPod("p", map[string]string{"nvidia.com/gpu": "1"}), candidates: []string{"dp", "dra"},
			wantNodes: []string{"dp"}, patched: true,
		},
		"only the DRA node: left to DRA": {
			pod: gpuPod("p", map[string]string{"nvidia.com/gpu": "1"}), candidates: []string{"dra"},
			wantNodes: []string{"dra"},
		},
		"webhook's cores 100: left to DRA": {
			pod: gpuPod("p", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"}), candidates: []string{"dra"},
			wantNodes: []string{"dra"},
		},
		"device-plugin node full: DRA nodes": {
			pod: gpuPod("p", map[string]string{"nvidia.com/gpu": "2"}), candidates: []string{"dp", "dra", "dra2"},
			wantNodes: []string{"dra", "dra2"}, wantFailed: map[string]string{"dp": ""},
		},
		"share: DRA node fails with the fix": {
			pod: gpuPod("p", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}), candidates: []string{"dra"},
			wantFailed: map[string]string{"dra": ReasonDRANode + ": DeviceClass gpu.hamireg.io maps nvidia.com/gpu"},
		},
		"share fits the device-plugin node: as today": {
			pod: gpuPod("p", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}), candidates: []string{"dra", "dp"},
			wantNodes: []string{"dp"}, patched: true,
		},
		"no class: the DRA node is fitted HAMi's way": {
			pod: gpuPod("p", map[string]string{"nvidia.com/gpu": "1"}), candidates: []string{"dra"}, noClass: true,
			wantFailed: map[string]string{"dra": ""},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				// The DRA nodes' GPUs are cordoned, as the node agent writes them.
				draA, draB := draNodeObj("dra"), draNodeObj("dra2")
				for _, n := range []*corev1.Node{draA, draB} {
					n.Annotations[allocation.KeyDeviceCordon] = "GPU-" + n.Name + "-0,GPU-" + n.Name + "-1"
				}
				objs := []runtime.Object{registered("dp", 1, 23028), draA, draB, tc.pod}
				if !tc.noClass {
					objs = append(objs, mappingClass(t))
				}
				e := setupWith(t, Options{}, true, objs...)
				e.run()
				res := e.filter(tc.pod, tc.candidates...)
				if res.Error != "" {
					t.Fatalf("filter error %s", res.Error)
				}
				var got []string
				if res.NodeNames != nil {
					got = *res.NodeNames
				}
				if diff := cmp.Diff(tc.wantNodes, got, cmpEmpty); diff != "" {
					t.Errorf("NodeNames (-want +got):\n%s", diff)
				}
				failed := map[string]string{}
				for n, r := range res.FailedNodes {
					failed[n] = r
				}
				for n, r := range res.FailedAndUnresolvableNodes {
					failed[n] = r
				}
				if len(failed) != len(tc.wantFailed) {
					t.Errorf("failed %v, want nodes %v", failed, tc.wantFailed)
				}
				for n, prefix := range tc.wantFailed {
					if r, ok := failed[n]; !ok || !strings.HasPrefix(r, prefix) {
						t.Errorf("node %s: reason %q, want it to start with %q", n, r, prefix)
					}
					if strings.HasPrefix(prefix, ReasonDRANode) {
						if _, ok := res.FailedAndUnresolvableNodes[n]; !ok {
							t.Errorf("node %s not unresolvable: preemption cannot help", n)
						}
						if r := failed[n]; !strings.Contains(r, "nvidia.com/gpumem") || !strings.Contains(r, "write a ResourceClaim") {
							t.Errorf("reason %q names neither the share nor the fix", r)
						}
					}
				}
				_, has := e.pod("p").Annotations[allocation.KeyNode]
				if has != tc.patched {
					t.Errorf("pod patched with %s: %t, want %t", allocation.KeyNode, has, tc.patched)
				}
			})
		})
	}
}

// TestBindDRANode: a plain binding on a DRA node, HAMi's lock and annotations on the others.
func TestBindDRANode(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		pod, other := gpuPod("p", map[string]string{"nvidia.com/gpu": "1"}), gpuPod("q", map[string]string{"nvidia.com/gpu": "1"})
		e := setupWith(t, Options{}, true, registered("dp", 1, 23028), draNodeObj("dra"), mappingClass(t), pod, other)
		e.run()
		e.client.ClearActions()
		if err := e.ext.Bind(e.ctx, &bindingArgs{PodName: "p", PodNamespace: "default", PodUID: pod.UID, Node: "dra"}); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"create pods/binding p->dra"}, e.writes()); diff != "" {
			t.Errorf("writes on the DRA node (-want +got):\n%s", diff)
		}
		if n, _ := e.client.CoreV1().Nodes().Get(e.ctx, "dra", metaGet); n.Annotations[nodelock.Key] != "" {
			t.Errorf("DRA node locked: %q", n.Annotations[nodelock.Key])
		}
		e.client.ClearActions()
		if err := e.ext.Bind(e.ctx, &bindingArgs{PodName: "q", PodNamespace: "default", PodUID: other.UID, Node: "dp"}); err != nil {
			t.Fatal(err)
		}
		w := e.writes()
		if len(w) != 2 || !strings.HasPrefix(w[0], "patch nodes dp") || !strings.Contains(w[1], allocation.KeyBindPhase) {
			t.Errorf("writes on the device-plugin node %q, want the lock and a binding with bind-phase", w)
		}
	})
}

// TestAdmitWithMapping: with a class mapping nvidia.com/gpu the webhook leaves a whole-GPU ask
// count-only and never writes claims; a pod with spec.resourceClaims is not touched.
func TestAdmitWithMapping(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		pod, want string // want "": no patch
		noClass   bool
	}{
		"whole GPU: count only": {
			pod:  `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}`,
			want: `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"}}}],"schedulerName":"hami-scheduler"}}`,
		},
		"whole GPU without a class: cores 100": {
			noClass: true,
			pod:     `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}`,
			want:    `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpucores":"100"}}}],"schedulerName":"hami-scheduler"}}`,
		},
		"share: as today": {
			pod:  `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpumem":"3000"}}}]}}`,
			want: `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpumem":"3000"}}}],"schedulerName":"hami-scheduler"}}`,
		},
		"claims only: untouched": {
			pod: `{"metadata":{"name":"p"},"spec":{"resourceClaims":[{"name":"gpu","resourceClaimName":"c"}],"containers":[{"name":"c","resources":{"claims":[{"name":"gpu"}]}}]}}`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				var objs []runtime.Object
				if !tc.noClass {
					objs = append(objs, mappingClass(t))
				}
				e := setupWith(t, Options{}, true, objs...)
				e.run()
				resp := e.ext.Admit(e.ctx, &admissionv1.AdmissionRequest{UID: "u1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
					Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: []byte(tc.pod)}})
				if !resp.Allowed {
					t.Fatalf("denied: %+v", resp.Result)
				}
				if tc.want == "" {
					if resp.Patch != nil {
						t.Errorf("patched %s", resp.Patch)
					}
					return
				}
				patch, err := jsonpatch.DecodePatch(resp.Patch)
				if err != nil {
					t.Fatal(err)
				}
				got, err := patch.Apply([]byte(tc.pod))
				if err != nil {
					t.Fatal(err)
				}
				var a, b any
				if err := json.Unmarshal(got, &a); err != nil {
					t.Fatal(err)
				}
				if err := json.Unmarshal([]byte(tc.want), &b); err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(b, a); diff != "" {
					t.Errorf("pod after the patch (-want +got):\n%s", diff)
				}
				if slices.ContainsFunc(strings.Split(string(resp.Patch), ","), func(s string) bool { return strings.Contains(s, "resourceClaims") }) {
					t.Errorf("patch writes claims: %s", resp.Patch)
				}
			})
		})
	}
}

// TestClusterRoleRulesDeviceClasses: the mapping is read with get, list and watch on
// deviceclasses.
func TestClusterRoleRulesDeviceClasses(t *testing.T) {
	t.Parallel()
	for _, r := range ClusterRoleRules() {
		if slices.Contains(r.Resources, "deviceclasses") && slices.Contains(r.APIGroups, "resource.k8s.io") {
			if diff := cmp.Diff([]string{"get", "list", "watch"}, r.Verbs); diff != "" {
				t.Errorf("deviceclasses verbs (-want +got):\n%s", diff)
			}
			return
		}
	}
	t.Error("no rule on resource.k8s.io deviceclasses")
}
