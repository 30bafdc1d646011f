package extender

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/internal/vectors"
	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/schedcache"
)

type vectorContainer struct {
	Name     string            `json:"name"`
	Limits   map[string]string `json:"limits"`
	Requests map[string]string `json:"requests"`
	// RestartPolicy is an init container's restartPolicy ("Always": a native sidecar).
	RestartPolicy string `json:"restart_policy"`
}

// vectorStatus is an entry of pod.status.initContainerStatuses.
type vectorStatus struct {
	Name     string `json:"name"`
	State    string `json:"state"` // running, terminated, waiting
	ExitCode int32  `json:"exit_code"`
}

type vectorPod struct {
	Name           string            `json:"name"`
	Namespace      string            `json:"namespace"`
	Annotations    map[string]string `json:"annotations"`
	Phase          corev1.PodPhase   `json:"phase"`
	Containers     []vectorContainer `json:"containers"`
	InitContainers []vectorContainer `json:"init_containers"`
	InitStatuses   []vectorStatus    `json:"init_container_statuses"`
}

func (p vectorPod) pod(t *testing.T) *corev1.Pod {
	t.Helper()
	list := func(m map[string]string) corev1.ResourceList {
		if m == nil {
			return nil
		}
		out := corev1.ResourceList{}
		for k, v := range m {
			out[corev1.ResourceName(k)] = resource.MustParse(v)
		}
		return out
	}
	ctr := func(c vectorContainer) corev1.Container {
		out := corev1.Container{Name: c.Name, Resources: corev1.ResourceRequirements{Limits: list(c.Limits), Requests: list(c.Requests)}}
		if c.RestartPolicy != "" {
			policy := corev1.ContainerRestartPolicy(c.RestartPolicy)
			out.RestartPolicy = &policy
		}
		return out
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: cmpOr(p.Namespace, "default"), UID: types.UID("uid-" + p.Name),
		Annotations: p.Annotations}, Status: corev1.PodStatus{Phase: cmpOr(p.Phase, corev1.PodPending)}}
	for _, c := range p.InitContainers {
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, ctr(c))
	}
	for _, c := range p.Containers {
		pod.Spec.Containers = append(pod.Spec.Containers, ctr(c))
	}
	for _, st := range p.InitStatuses {
		cs := corev1.ContainerStatus{Name: st.Name}
		switch st.State {
		case "running":
			cs.State.Running = &corev1.ContainerStateRunning{}
		case "terminated":
			cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: st.ExitCode}
		default:
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: st.State}
		}
		pod.Status.InitContainerStatuses = append(pod.Status.InitContainerStatuses, cs)
	}
	return pod
}

func cmpOr[T comparable](v, d T) T {
	var zero T
	if v == zero {
		return d
	}
	return v
}

type vectorNode struct {
	Name        string              `json:"name"`
	Annotations map[string]string   `json:"annotations"`
	Devices     []annotation.Device `json:"devices"`
}

type fitFile struct {
	Vectors []struct {
		Name  string `json:"name"`
		Input struct {
			Config       vectorConfig `json:"config"`
			Nodes        []vectorNode `json:"nodes"`
			ExistingPods []vectorPod  `json:"existing_pods"`
			Pod          vectorPod    `json:"pod"`
			NodeNames    []string     `json:"node_names"`
		} `json:"input"`
		WantFitReason   map[string]string `json:"want_fit_reason"`
		WantNodeNames   []string          `json:"want_node_names"`
		WantFailedNodes map[string]string `json:"want_failed_nodes"`
		WantPatches     []vectorPatch     `json:"want_patches"`
	} `json:"vectors"`
}

// TestConformanceFilter replays fit.json through Filter: the chosen node, the merge patch of
// the pod byte for byte (as JSON), and for a pod that fits nowhere every candidate's reason:
// HAMi's "node unregistered" as the prefix of ours, the fit reason (HAMi master's, sorted)
// for registered nodes. HAMi v2.9.0 says "NodeUnfitPod" for those; the extender gives the
// reason. HAMi's FailedNodes is compared with FailedNodes and FailedAndUnresolvableNodes
// together; a node in the latter must fail without any pod's usage, and an unregistered one
// must be there.
func TestConformanceFilter(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		var f fitFile
		if !folder.Read(t, "fit.json", &f) {
			continue
		}
		version := vectors.Pick(folder, allocation.VersionMaster, allocation.VersionV290)
		for _, v := range f.Vectors {
			t.Run(folder.Name()+"/"+v.Name, func(t *testing.T) {
				t.Parallel()
				synctest.Test(t, func(t *testing.T) {
					in := v.Input
					objs := nodeObjects(in.Nodes)
					for _, p := range in.ExistingPods {
						objs = append(objs, p.pod(t))
					}
					pod := in.Pod.pod(t)
					objs = append(objs, pod)
					cfg := in.Config.config(version)
					e := setupWithNodes(t, Options{Config: cfg}, objs...)
					e.run()
					e.client.ClearActions()
					res := e.filter(pod, in.NodeNames...)
					if res.Error != "" {
						t.Fatalf("Error = %s", res.Error)
					}
					var got []string
					if res.NodeNames != nil {
						got = *res.NodeNames
					}
					if !slices.Equal(got, v.WantNodeNames) && (len(got) != 0 || len(v.WantNodeNames) != 0) {
						t.Fatalf("NodeNames = %v, HAMi %v (failed %v)", got, v.WantNodeNames, res.FailedNodes)
					}
					if len(v.WantNodeNames) == 0 {
						// Deliberate difference, by rule: HAMi puts every candidate in
						// FailedNodes; the extender puts those that removing pods cannot make
						// fit in FailedAndUnresolvableNodes. The two together are compared
						// with HAMi's, and the rule is asserted on each of them.
						failed := failedUnion(t, res)
						if !slices.Equal(slices.Sorted(maps.Keys(failed)), slices.Sorted(maps.Keys(v.WantFailedNodes))) {
							t.Fatalf("FailedNodes %v and FailedAndUnresolvableNodes %v, HAMi %v", res.FailedNodes, res.FailedAndUnresolvableNodes, v.WantFailedNodes)
						}
						for node := range res.FailedAndUnresolvableNodes {
							if stillFails(in.Nodes, node, pod, cfg) {
								continue
							}
							t.Errorf("%s is in FailedAndUnresolvableNodes (%q), but the pod fits there without the other pods", node, res.FailedAndUnresolvableNodes[node])
						}
						for node, hami := range v.WantFailedNodes {
							ours := failed[node]
							if hami == ReasonNodeUnregistered && res.FailedAndUnresolvableNodes[node] == "" {
								t.Errorf("%s: unregistered, but not in FailedAndUnresolvableNodes", node)
							}
							switch {
							case hami == ReasonNodeUnregistered:
								if !strings.HasPrefix(ours, ReasonNodeUnregistered+": ") {
									t.Errorf("%s: %q, HAMi %q", node, ours, hami)
								}
							case ours != v.WantFitReason[node]:
								t.Errorf("%s: %q, HAMi's fit reason %q", node, ours, v.WantFitReason[node])
							}
						}
					}
					var patches []string
					for _, a := range e.client.Actions() {
						if p, ok := a.(k8stesting.PatchAction); ok {
							patches = append(patches, string(p.GetPatch()))
						}
					}
					if len(patches) != len(v.WantPatches) {
						t.Fatalf("patches %q, HAMi %d", patches, len(v.WantPatches))
					}
					for i, want := range v.WantPatches {
						a := want.ruled(t, pod, cfg)
						var b patchBody
						_ = json.Unmarshal([]byte(patches[i]), &b)
						if diff := cmp.Diff(a, b); diff != "" {
							t.Errorf("patch (-HAMi +got):\n%s", diff)
						}
					}
				})
			})
		}
		t.Logf("checked %d vectors from %s (fit.json)", len(f.Vectors), folder.Dir)
	}
}

// stillFails reports whether pod fails on the vector node name with no pod holding anything
// there (every candidate of the vector failing as unregistered fails).
func stillFails(nodes []vectorNode, name string, pod *corev1.Pod, cfg allocation.Config) bool {
	for _, n := range nodes {
		if n.Name == name {
			_, _, fits := allocation.Fit(allocation.WithUsage(n.Devices, nil), allocation.Requests(pod, cfg), pod.Annotations, n.Annotations, cfg)
			return !fits
		}
	}
	return true
}

// setupWithNodes is setup with Options.Nodes from the same factory (node annotations reach
// the fit: hami.io/device-cordon).
func setupWithNodes(t *testing.T, opts Options, objs ...runtime.Object) *env {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	e := &env{t: t, ctx: ctx, client: fake.NewClientset(objs...), clock: clocktesting.NewFakeClock(t0)}
	e.factory = informers.NewSharedInformerFactory(e.client, 0)
	c, err := schedcache.New(e.factory.Core().V1().Nodes(), schedcache.Options{Clock: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	e.cache = c
	opts.Clock, opts.Pods, opts.Nodes = e.clock, e.factory.Core().V1().Pods(), e.factory.Core().V1().Nodes().Lister()
	if e.ext, err = New(e.client, c, opts); err != nil {
		t.Fatal(err)
	}
	return e
}

type bindFile struct {
	Sequences []struct {
		Name  string `json:"name"`
		Input struct {
			BindingCallFails   bool   `json:"binding_call_fails"`
			LockOwnerPodExists bool   `json:"lock_owner_pod_exists"`
			NodeLockBefore     string `json:"node_lock_before"`
			PodRequestsGPU     bool   `json:"pod_requests_gpu"`
		} `json:"input"`
		NodeLockAfter       string            `json:"node_lock_after"`
		PodAnnotationsAfter map[string]string `json:"pod_annotations_after"`
		WantResultError     string            `json:"want_result_error"`
	} `json:"scheduler_bind_sequence"`
}

// TestConformanceBind replays allocate.json's scheduler_bind_sequence through Bind: the lock
// after, the pod's annotations after and whether the bind fails, with HAMi's message. One
// deliberate difference: when the Binding fails, HAMi leaves bind-phase "allocating" and
// the extender sets "failed".
func TestConformanceBind(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		var f bindFile
		if !folder.Read(t, "allocate.json", &f) {
			continue
		}
		for _, s := range f.Sequences {
			t.Run(folder.Name()+"/"+s.Name, func(t *testing.T) {
				t.Parallel()
				synctest.Test(t, func(t *testing.T) {
					in := s.Input
					node := registered("node1", 2, 23028)
					now := t0
					if in.NodeLockBefore != "" {
						node.Annotations[nodelock.Key] = in.NodeLockBefore
					}
					limits := map[string]string{"cpu": "1"}
					if in.PodRequestsGPU {
						limits = map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}
					}
					pod := gpuPod("gpu-pod", limits)
					dev := "GPU-0a1b2c3d-0000-1111-2222-333344445555,NVIDIA,3000,30:;"
					pod.Annotations = map[string]string{allocation.KeyNode: "node1", "hami.io/vgpu-devices-allocated": dev, "hami.io/vgpu-devices-to-allocate": dev}
					objs := []runtime.Object{node, pod}
					if in.LockOwnerPodExists {
						if l, err := nodelock.Parse(in.NodeLockBefore); err == nil && l.Name != "" {
							objs = append(objs, gpuPod(l.Name, nil))
						}
					}
					e := setup(t, Options{NodeLockWait: -1}, objs...) // HAMi fails a bind on a held lock at once
					if in.BindingCallFails {
						e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
							if a.GetSubresource() == "binding" {
								return true, nil, errBindingFails
							}
							return false, nil, nil
						})
					}
					e.run()
					err := e.ext.Bind(e.ctx, &bindingArgs{PodName: "gpu-pod", PodNamespace: "default", PodUID: pod.UID, Node: "node1"})
					gotErr := ""
					if err != nil {
						gotErr = err.Error()
					}
					if (gotErr == "") != (s.WantResultError == "") ||
						(strings.Contains(s.WantResultError, "has been locked within") && !strings.Contains(gotErr, "node node1 has been locked within 5m0s")) {
						t.Errorf("error %q, HAMi %q", gotErr, s.WantResultError)
					}
					repl := strings.NewReplacer("{rfc3339_now}", now.UTC().Format(time.RFC3339), "{unix_now}", strconv.FormatInt(now.Unix(), 10))
					n, _ := e.client.CoreV1().Nodes().Get(e.ctx, "node1", metaGet)
					if got, want := n.Annotations[nodelock.Key], strings.TrimPrefix(repl.Replace(s.NodeLockAfter), "<absent>"); got != want {
						t.Errorf("lock after %q, HAMi %q", got, want)
					}
					want := map[string]string{}
					for k, v := range s.PodAnnotationsAfter {
						want[k] = repl.Replace(v)
					}
					if in.BindingCallFails {
						want[allocation.KeyBindPhase] = string(allocation.PhaseFailed) // deliberate difference
					}
					if diff := cmp.Diff(want, e.pod("gpu-pod").Annotations, cmpEmpty); diff != "" {
						t.Errorf("pod annotations after (-HAMi +got):\n%s", diff)
					}
				})
			})
		}
		t.Logf("checked %d vectors from %s (allocate.json scheduler_bind_sequence)", len(f.Sequences), folder.Dir)
	}
}

// gpuContainers says, container by container (init containers first), whether pod asks for GPUs.
func gpuContainers(pod *corev1.Pod, cfg allocation.Config) []bool {
	req := allocation.Requests(pod, cfg)
	out := make([]bool, len(req.Containers))
	for i, c := range req.Containers {
		out[i] = c.Count > 0
	}
	return out
}
