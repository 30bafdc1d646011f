package nodeagent

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/nodelock"
)

// FuzzAllocate: whatever a node lock, a pod's to-allocate list and bind-phase hold, and
// whatever ids the kubelet sends, Allocate and GetPreferredAllocation never panic, every error
// is an *AllocateError of one of the classes, and a served pod never keeps the lock after
// its last entry.
func FuzzAllocate(f *testing.F) {
	f.Add("2026-12-01T10:00:00Z,default,p", "GPU-0,NVIDIA,1000,30:GPU-1,NVIDIA,1000,30:;", "allocating", "GPU-0-1,GPU-1-0", "p")
	f.Add("2026-12-01T10:00:00Z,default,p", ";GPU-2,NVIDIA,1,1:;", "allocating", "GPU-2-9", "p")
	f.Add("2026-12-01T10:00:00Z,default,p", "GPU-0,NVIDIA,x,30:;", "allocating", "GPU-0-1", "p")
	f.Add("2026-12-01T10:00:00Z,default,q", "GPU-0,NVIDIA,1,1:;", "allocating", "GPU-0-1", "p")
	f.Add("2026-12-01T10:00:00Z", "GPU-0,NVIDIA,1,1:;", "success", "", "p")
	f.Add("nonsense", "", "", "MIG-1", "p")
	f.Fuzz(func(t *testing.T, lock, toAllocate, phase, ids, podName string) {
		ctx := klog.NewContext(t.Context(), logr.Discard())
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, Annotations: map[string]string{nodelock.Key: lock}}}
		if podName == "" || len(podName) > 63 || strings.ContainsAny(podName, "/,") {
			podName = "p"
		}
		pod := gpuPod(podName, "init-a", "main", "side-nogpu")
		pod.Spec.NodeName = testNode
		pod.Annotations = map[string]string{annotation.KeyNVIDIAToAllocate: toAllocate, allocation.KeyBindPhase: phase}
		cs := fake.NewClientset(node, pod)
		a, err := New(cs, testNode, staticSource(testGPUs()), Options{EventRecorder: &record.FakeRecorder{}, Kubelet: kubeletplugin.Options{PluginDir: "/nonexistent"}})
		if err != nil {
			t.Fatal(err)
		}
		a.backoff = wait.Backoff{Duration: time.Millisecond, Steps: 1}
		var kubeletIDs []string
		if ids != "" {
			kubeletIDs = strings.Split(ids, ",")
		}
		if _, err := a.preferredAllocation(ctx, testGPUs(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
			{AvailableDeviceIDs: kubeletIDs, AllocationSize: int32(len(kubeletIDs))},
		}}); err != nil {
			t.Fatalf("GetPreferredAllocation: %v", err)
		}
		for range 3 {
			_, err := a.allocate(ctx, testGPUs(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: kubeletIDs}}})
			if err == nil {
				continue
			}
			ae, ok := errors.AsType[*AllocateError](err)
			if !ok {
				t.Fatalf("Allocate error %T %v is not an *AllocateError", err, err)
			}
			known := false
			for _, k := range []error{ErrNoBindingPod, ErrPodGone, ErrNoPendingEntry, ErrDeviceCountMismatch, ErrMalformed, ErrAPI, ErrHost} {
				known = known || errors.Is(err, k)
			}
			if !known || ae.Error() == "" {
				t.Fatalf("Allocate error %v has no class", err)
			}
		}
		p, err := cs.CoreV1().Pods("default").Get(ctx, podName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n, err := cs.CoreV1().Nodes().Get(ctx, testNode, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v, locked := n.Annotations[nodelock.Key]; locked && p.Annotations[allocation.KeyBindPhase] == string(allocation.PhaseSuccess) && phase != string(allocation.PhaseSuccess) {
			if l, err := nodelock.Parse(v); err == nil && l.Name == podName {
				t.Fatalf("pod %s served to the end, but its lock %q is still on the node", podName, v)
			}
		}
	})
}
