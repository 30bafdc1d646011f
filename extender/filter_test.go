package extender

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
)

func TestFilter(t *testing.T) {
	t.Parallel()
	const gpu1 = "GPU-busy-0,NVIDIA,20000,50:;"
	tests := map[string]struct {
		pod        *corev1.Pod
		candidates []string
		wantNodes  *[]string
		wantFailed map[string]string // FailedNodes and FailedAndUnresolvableNodes together
		// wantUnresolvable are the nodes of wantFailed in FailedAndUnresolvableNodes.
		wantUnresolvable []string
		wantWrites       []string
	}{
		"no GPU request: every candidate passes untouched": {
			pod:        gpuPod("p", map[string]string{"cpu": "1"}),
			candidates: []string{"free", "nope", "unknown"},
			wantNodes:  &[]string{"free", "nope", "unknown"},
		},
		"the chosen node only, patched with HAMi's annotations": {
			pod:        gpuPod("p", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}),
			candidates: []string{"free", "busy", "absent", "unknown"},
			wantNodes:  &[]string{"busy"}, // binpack: the busiest node that fits
			wantWrites: []string{`patch pods p {"metadata":{"annotations":{"hami.io/vgpu-devices-allocated":"GPU-busy-0,NVIDIA,3000,30:;","hami.io/vgpu-devices-to-allocate":"GPU-busy-0,NVIDIA,3000,30:;","hami.io/vgpu-node":"busy","hami.io/vgpu-time":"1779181200"},"labels":{"hami.io/vgpu-node":"busy"}}}`},
		},
		"no node fits: every candidate explained": {
			pod:        gpuPod("p", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"}),
			candidates: []string{"busy", "absent", "malformed", "empty", "unknown", "small"},
			wantFailed: map[string]string{
				"busy":      "1/1 CardInsufficientMemory",
				"small":     "1/1 CardInsufficientMemory",
				"absent":    "node unregistered: NVIDIA absent: ",
				"malformed": "node unregistered: NVIDIA malformed: ",
				"empty":     "node unregistered: NVIDIA no-devices: ",
				"unknown":   "node unregistered: not known to the node cache (no Node object, or outside its informer)",
			},
			// "small" cannot hold 20000 MiB at all, but CardInsufficientMemory is resolvable
			// by the rule's words (it errs towards resolvable).
			wantUnresolvable: []string{"absent", "empty", "malformed", "unknown"},
		},
		"more GPUs than the node has": {
			pod:              gpuPod("p", map[string]string{"nvidia.com/gpu": "2"}),
			candidates:       []string{"busy"},
			wantFailed:       map[string]string{"busy": allocation.ReasonNodeInsufficientDevice},
			wantUnresolvable: []string{"busy"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				e := start(t, Options{},
					registered("free", 1, 23028), registered("busy", 1, 23028), registered("small", 1, 10000),
					gpuNode("absent", "", 1), gpuNode("malformed", "[{", 1), gpuNode("empty", "[]", 1),
					placedPod("running", "busy", gpu1), tc.pod)
				e.client.ClearActions()
				res := e.filter(tc.pod, tc.candidates...)
				if res.Error != "" {
					t.Fatalf("Error = %q", res.Error)
				}
				if diff := cmp.Diff(tc.wantNodes, res.NodeNames); diff != "" {
					t.Errorf("NodeNames (-want +got):\n%s", diff)
				}
				// A reason starts with HAMi's words; the rest says why (decode errors are long).
				got := map[string]string{}
				for n, r := range failedUnion(t, res) {
					got[n] = r
					if w := tc.wantFailed[n]; strings.HasSuffix(w, ": ") && strings.HasPrefix(r, w) {
						got[n] = w
					}
				}
				if diff := cmp.Diff(tc.wantFailed, got, cmpEmpty); diff != "" {
					t.Errorf("FailedNodes and FailedAndUnresolvableNodes (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(tc.wantUnresolvable, slices.Sorted(maps.Keys(res.FailedAndUnresolvableNodes)), cmpEmpty); diff != "" {
					t.Errorf("FailedAndUnresolvableNodes (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(tc.wantWrites, e.writes(), cmpEmpty); diff != "" {
					t.Errorf("writes (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// failedUnion is FailedNodes and FailedAndUnresolvableNodes together; it fails t when a node is
// in both or is in the wrong one by allocation.Unresolvable.
func failedUnion(t *testing.T, res *extenderv1.ExtenderFilterResult) map[string]string {
	t.Helper()
	out := map[string]string{}
	for n, r := range res.FailedNodes {
		if allocation.Unresolvable(r) {
			t.Errorf("%s in FailedNodes with the unresolvable reason %q", n, r)
		}
		out[n] = r
	}
	for n, r := range res.FailedAndUnresolvableNodes {
		if _, dup := out[n]; dup || !allocation.Unresolvable(r) {
			t.Errorf("%s in FailedAndUnresolvableNodes with %q (also in FailedNodes: %v)", n, r, dup)
		}
		out[n] = r
	}
	return out
}

var cmpEmpty = cmp.FilterValues(func(a, b any) bool { return isEmpty(a) && isEmpty(b) }, cmp.Ignore())

func isEmpty(v any) bool {
	switch v := v.(type) {
	case map[string]string:
		return len(v) == 0
	case []string:
		return len(v) == 0
	}
	return false
}

// TestFilterNodesNotCacheCapable: with nodeCacheCapable false kube-scheduler sends Nodes: a
// simulation, answered with the Node objects that fit, and the pod is not patched.
func TestFilterNodesNotCacheCapable(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		a, b := registered("a", 1, 23028), registered("b", 2, 23028)
		pod := gpuPod("p", map[string]string{"nvidia.com/gpu": "2"})
		e := start(t, Options{}, a, b, pod)
		res := e.ext.Filter(e.ctx, &extenderArgs{Pod: pod, Nodes: &corev1.NodeList{Items: []corev1.Node{*a, *b}}})
		if res.Error != "" || res.NodeNames != nil || res.Nodes == nil || len(res.Nodes.Items) != 1 || res.Nodes.Items[0].Name != "b" {
			t.Fatalf("result = %+v", res)
		}
		synctest.Wait()
		if got := e.pod("p").Annotations[allocation.KeyNode]; got != "" {
			t.Errorf("a simulation patched the pod: %s = %q", allocation.KeyNode, got)
		}
	})
}

// TestFilterCountsWhatItAssigned: two filters in a row, before the informer delivers the first
// patch, do not give the same capacity twice; once the pod is deleted its GPU is free again.
func TestFilterCountsWhatItAssigned(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		whole := map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100"}
		p1, p2 := gpuPod("p1", whole), gpuPod("p2", whole)
		e := setup(t, Options{}, registered("n", 1, 23028), p1, p2)
		// The API accepts the patches, but the informer never sees them.
		e.client.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, &corev1.Pod{}, nil
		})
		e.run()
		if res := e.filter(p1, "n"); res.NodeNames == nil || (*res.NodeNames)[0] != "n" {
			t.Fatalf("first filter = %+v", res)
		}
		// The same pod filtered again does not count against itself.
		if res := e.filter(p1, "n"); res.NodeNames == nil {
			t.Fatalf("re-filter = %+v", res)
		}
		if res := e.filter(p2, "n"); res.NodeNames != nil || res.FailedNodes["n"] != "1/1 CardInsufficientMemory" {
			t.Fatalf("second pod = %+v, want n full", res)
		}
		if got := e.ext.Stats().Pods; got != 1 {
			t.Errorf("pods counted = %d, want 1", got)
		}
		if err := e.client.CoreV1().Pods("default").Delete(e.ctx, "p1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if res := e.filter(p2, "n"); res.NodeNames == nil {
			t.Fatalf("after p1's deletion = %+v", res)
		}
	})
}

// TestUsageFromPods: usage comes from the pods' annotations as the informer delivers them;
// a pod that terminates frees its GPUs.
func TestUsageFromPods(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		full := "GPU-n-0,NVIDIA,23028,100:;"
		e := start(t, Options{}, registered("n", 1, 23028), placedPod("a", "n", full))
		if got := e.ext.usage.usage("n"); got["GPU-n-0"] != (allocation.Usage{Used: 1, Usedmem: 23028, Usedcores: 100}) {
			t.Fatalf("usage = %v", got)
		}
		p := gpuPod("p", map[string]string{"nvidia.com/gpu": "1"})
		e.create(p)
		if res := e.filter(p, "n"); res.NodeNames != nil {
			t.Fatalf("filter on a full node = %+v", res)
		}
		a := e.pod("a")
		a.Status.Phase = corev1.PodSucceeded
		if _, err := e.client.CoreV1().Pods("default").UpdateStatus(e.ctx, a, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := e.ext.usage.usage("n"); len(got) != 0 {
			t.Fatalf("usage after the pod succeeded = %v", got)
		}
		if res := e.filter(p, "n"); res.NodeNames == nil {
			t.Fatalf("filter after the pod succeeded = %+v", res)
		}
		// The informer now shows p with its annotations; nothing is counted twice.
		synctest.Wait()
		if got := e.ext.usage.usage("n")["GPU-n-0"]; got.Used != 1 {
			t.Errorf("usage after the informer caught up = %+v", got)
		}
	})
}

// TestFilterPatchFails: a failed patch is the result's Error, and what the filter assumed is
// given back.
func TestFilterPatchFails(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := gpuPod("p", map[string]string{"nvidia.com/gpu": "1"})
		e := setup(t, Options{}, registered("n", 1, 23028), p)
		e.client.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(corev1.Resource("pods"), "p", errors.New("no"))
		})
		e.run()
		res := e.filter(p, "n")
		if !strings.Contains(res.Error, "forbidden") || res.NodeNames != nil {
			t.Fatalf("result = %+v", res)
		}
		if got := e.ext.Stats().Pods; got != 0 {
			t.Errorf("pods counted after a failed patch = %d", got)
		}
	})
}

// TestFilterEvents: HAMi's Events.
func TestFilterEvents(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := gpuPod("p", map[string]string{"nvidia.com/gpu": "1"})
		big := gpuPod("big", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "99999"})
		e := start(t, Options{}, registered("n", 1, 23028), gpuNode("x", "", 1), p, big)
		e.filter(p, "n", "x")
		e.filter(big, "n", "x")
		want := []string{
			"Normal FilteringSucceed find fit node(n), 1 nodes not fit, 1 nodes fit(n:0.00)",
			"Warning FilteringFailed 1 nodes CardInsufficientMemory(n)",
			"Warning FilteringFailed 1 nodes node unregistered(x)",
			"Warning FilteringFailed no available node, 2 nodes do not meet",
		}
		if diff := cmp.Diff(want, e.events()); diff != "" {
			t.Errorf("events (-want +got):\n%s", diff)
		}
	})
}

// TestDecideIsSchedule: the memoised decision over many filters is allocation.Schedule's on the
// same nodes and usage.
func TestDecideIsSchedule(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var objs []runtime.Object
		var names []string
		for i := range 6 {
			n := registered(string(rune('a'+i)), 1+i%3, int32(10000+5000*i))
			objs = append(objs, n)
			names = append(names, n.Name)
		}
		shapes := []map[string]string{
			{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "20"},
			{"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "30"},
			{"nvidia.com/gpu": "1", "nvidia.com/gpucores": "60"},
		}
		e := setup(t, Options{Config: allocation.Config{GPUSchedulerPolicy: allocation.PolicyBinpack}}, objs...)
		e.client.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, &corev1.Pod{}, nil // usage is only what the extender assumed
		})
		e.run()
		cfg, _ := allocation.Config{GPUSchedulerPolicy: allocation.PolicyBinpack}.WithDefaults()
		for i := range 40 {
			pod := gpuPod("p"+string(rune('A'+i)), shapes[i%len(shapes)])
			if i%7 == 0 {
				pod.Annotations = map[string]string{allocation.KeyNodeSchedulerPolicy: string(allocation.PolicySpread)}
			}
			var nodes []allocation.Node
			snap := e.cache.Snapshot()
			for _, n := range names {
				info, _ := snap.Node(n)
				nodes = append(nodes, allocation.Node{Name: n, Devices: allocation.WithUsage(info.Devices(annotation.NVIDIA()), e.ext.usage.usage(n))})
			}
			want := allocation.Schedule(nodes, allocation.Requests(pod, cfg), pod.Annotations, cfg)
			res := e.filter(pod, names...)
			if want.Node == "" {
				if res.NodeNames != nil || !cmp.Equal(want.Failed, failedUnion(t, res)) {
					t.Fatalf("pod %d: Schedule fails with %v, filter gives %+v", i, want.Failed, res)
				}
				continue
			}
			if res.NodeNames == nil || (*res.NodeNames)[0] != want.Node {
				t.Fatalf("pod %d: Schedule chooses %s, filter %+v", i, want.Node, res)
			}
			if got, _ := e.ext.usage.Pod(podKey("default", pod.Name)); !cmp.Equal(got.GPUs, want.Devices.Usage()) {
				t.Fatalf("pod %d: assumed %v, Schedule's devices %v", i, got.GPUs, want.Devices.Usage())
			}
		}
	})
}
