package allocationtest_test

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/internal/vectors"
	"github.com/hamireg/hamireg/nodelock"
)

// allocateVectors is the part of allocate.json the stand-in of HAMi's plugin is checked
// against: the pods and lock before, and per kubelet call the error, the pod patches and what
// the pods and the lock hold after.
type allocateVectors struct {
	Vectors []struct {
		Name  string `json:"name"`
		Input struct {
			Config struct {
				OperatingMode string `json:"operating_mode"`
			} `json:"config"`
			NodeLockBefore string `json:"node_lock_before"`
			Pods           []struct {
				Name           string            `json:"name"`
				UID            string            `json:"uid"`
				Phase          string            `json:"phase"`
				SpecNodeName   string            `json:"spec_node_name"`
				Annotations    map[string]string `json:"annotations"`
				Containers     []string          `json:"containers"`
				InitContainers []string          `json:"init_containers"`
			} `json:"pods"`
		} `json:"input"`
		Calls []struct {
			RequestDeviceIDs []string `json:"request_device_ids"`
			WantError        *string  `json:"want_error"`
			Patches          []struct {
				Resource string          `json:"resource"`
				Name     string          `json:"name"`
				Body     json.RawMessage `json:"body"`
			} `json:"patches"`
			PodAnnotationsAfter map[string]map[string]string `json:"pod_annotations_after"`
			NodeLockAfter       string                       `json:"node_lock_after"`
		} `json:"calls"`
	} `json:"vectors"`
}

const absent = "<absent>"

// The stand-in does what HAMi's device plugin did in allocate.json, call by call: the same
// errors, the same pod patches byte for byte (as JSON), the same annotations and lock after.
func TestPluginConformance(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		var f allocateVectors
		if !folder.Read(t, "allocate.json", &f) {
			continue
		}
		version := vectors.Pick(folder, annotation.VersionMaster, annotation.VersionV290)
		n := 0
		for _, v := range f.Vectors {
			t.Run(folder.Name()+"/"+v.Name, func(t *testing.T) {
				in := v.Input
				node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1", Annotations: map[string]string{}}}
				if in.NodeLockBefore != absent && in.NodeLockBefore != "" {
					node.Annotations[nodelock.Key] = in.NodeLockBefore
				}
				objs := []runtime.Object{node}
				for _, p := range in.Pods {
					pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: p.Name, UID: types.UID(p.UID), Annotations: p.Annotations},
						Spec: corev1.PodSpec{NodeName: p.SpecNodeName}, Status: corev1.PodStatus{Phase: corev1.PodPhase(p.Phase)}}
					for _, c := range p.InitContainers {
						pod.Spec.InitContainers = append(pod.Spec.InitContainers, corev1.Container{Name: c})
					}
					for _, c := range p.Containers {
						pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: c})
					}
					objs = append(objs, pod)
				}
				cs := fake.NewClientset(objs...)
				var (
					mu      sync.Mutex
					patches []string
				)
				cs.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
					mu.Lock()
					defer mu.Unlock()
					patches = append(patches, a.(k8stesting.PatchAction).GetName()+" "+string(a.(k8stesting.PatchAction).GetPatch()))
					return false, nil, nil
				})
				plugin := allocationtest.NewPlugin(cs, "node1", allocationtest.Options{Version: version, Mode: in.Config.OperatingMode})
				for ci, call := range v.Calls {
					mu.Lock()
					patches = nil
					mu.Unlock()
					_, err := plugin.Allocate(t.Context(), len(call.RequestDeviceIDs))
					switch {
					case call.WantError == nil && err != nil:
						t.Fatalf("call %d: %v", ci, err)
					case call.WantError != nil && (err == nil || !strings.Contains(err.Error(), *call.WantError)):
						t.Fatalf("call %d: error %v, want %q", ci, err, *call.WantError)
					}
					var want []string
					for _, p := range call.Patches {
						if p.Resource == "pods" {
							want = append(want, p.Name+" "+compact(t, p.Body))
						}
					}
					mu.Lock()
					got := make([]string, len(patches))
					for i, p := range patches {
						got[i] = compactString(t, p)
					}
					mu.Unlock()
					if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
						t.Errorf("call %d: pod patches (-want +got):\n%s", ci, d)
					}
					for name, wantAnn := range call.PodAnnotationsAfter {
						p, err := cs.CoreV1().Pods("default").Get(t.Context(), name, metav1.GetOptions{})
						if err != nil {
							t.Fatal(err)
						}
						for _, k := range []string{allocation.KeyBindPhase, annotation.KeyNVIDIAToAllocate} {
							w, wok := wantAnn[k]
							g, gok := p.Annotations[k]
							if w != g || wok != gok {
								t.Errorf("call %d: pod %s %s = %q (%v), want %q (%v)", ci, name, k, g, gok, w, wok)
							}
						}
					}
					n, err := cs.CoreV1().Nodes().Get(t.Context(), "node1", metav1.GetOptions{})
					if err != nil {
						t.Fatal(err)
					}
					lock, locked := n.Annotations[nodelock.Key]
					switch want := call.NodeLockAfter; {
					case want == absent:
						if locked {
							t.Errorf("call %d: lock %q left, want none", ci, lock)
						}
					case strings.HasPrefix(want, "{rfc3339_now}"):
						if !locked || !strings.HasSuffix(lock, strings.TrimPrefix(want, "{rfc3339_now}")) {
							t.Errorf("call %d: lock %q (%v), want %q", ci, lock, locked, want)
						}
					case lock != want:
						t.Errorf("call %d: lock %q, want %q", ci, lock, want)
					}
				}
			})
			n++
		}
		t.Logf("checked %d vectors from %s", n, folder.Dir)
	}
}

func compact(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(v) // sorted keys
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// compactString is compact for "name body".
func compactString(t *testing.T, s string) string {
	t.Helper()
	name, body, _ := strings.Cut(s, " ")
	return name + " " + compact(t, json.RawMessage(body))
}

// A scheduler's test drives the stand-in to the end of the protocol: one call per container,
// bind-phase success and the lock released after the last; a count mismatch fails the pod.
func TestPluginServesEveryContainer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "train"},
		Spec: corev1.PodSpec{InitContainers: []corev1.Container{{Name: "init"}}, Containers: []corev1.Container{{Name: "a"}, {Name: "b"}}}}
	cs := fake.NewClientset(pod, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}})
	dev := func(u string) allocation.ContainerDevice {
		return allocation.ContainerDevice{UUID: u, Type: "NVIDIA", Usedmem: 1000, Usedcores: 10}
	}
	if _, err := allocationtest.NewScheduler(cs, allocationtest.Options{}).Schedule(ctx, pod, "gpu-1", allocation.PodDevices{{dev("GPU-a")}, {}, {dev("GPU-b"), dev("GPU-c")}}); err != nil {
		t.Fatal(err)
	}
	plugin := allocationtest.NewPlugin(cs, "gpu-1", allocationtest.Options{})
	var got []allocationtest.Allocation
	for _, count := range []int{1, 2} {
		a, err := plugin.Allocate(ctx, count)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, a)
	}
	owner := types.NamespacedName{Namespace: "default", Name: "train"}
	want := []allocationtest.Allocation{
		{Pod: owner, Container: "init", Devices: allocation.ContainerDevices{dev("GPU-a")}},
		{Pod: owner, Container: "b", Devices: allocation.ContainerDevices{dev("GPU-b"), dev("GPU-c")}, Last: true},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("allocations (-want +got):\n%s", d)
	}
	p, _ := cs.CoreV1().Pods("default").Get(ctx, "train", metav1.GetOptions{})
	if p.Annotations[allocation.KeyBindPhase] != "success" || p.Annotations[annotation.KeyNVIDIAToAllocate] != ";;;;;" {
		t.Errorf("annotations %v", p.Annotations)
	}
	n, _ := cs.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
	if _, locked := n.Annotations[nodelock.Key]; locked {
		t.Error("lock left after the last entry")
	}
	// The next pod: the kubelet asks for 2, the entry holds 1.
	pod2 := pod.DeepCopy()
	pod2.Name, pod2.ResourceVersion = "next", ""
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := allocationtest.NewScheduler(cs, allocationtest.Options{}).Schedule(ctx, pod2, "gpu-1", allocation.PodDevices{{dev("GPU-a")}, {}, {}}); err != nil {
		t.Fatal(err)
	}
	a, err := plugin.Allocate(ctx, 2)
	if !errors.Is(err, allocationtest.ErrDeviceCountMismatch) || !a.Failed {
		t.Fatalf("Allocate = %+v, %v; want a failed pod and ErrDeviceCountMismatch", a, err)
	}
	p, _ = cs.CoreV1().Pods("default").Get(ctx, "next", metav1.GetOptions{})
	n, _ = cs.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
	if _, locked := n.Annotations[nodelock.Key]; p.Annotations[allocation.KeyBindPhase] != "failed" || locked {
		t.Errorf("after the mismatch: bind-phase %q, locked %v", p.Annotations[allocation.KeyBindPhase], locked)
	}
}
