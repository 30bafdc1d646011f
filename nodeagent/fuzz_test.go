package nodeagent

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/clienttest"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
	"github.com/hamireg/hamireg/nodelock"
)

// FuzzAllocate: whatever a node lock, a pod's to-allocate list and bind-phase hold, and
// whatever ids the kubelet sends, Allocate and GetPreferredAllocation, called over gRPC as the
// kubelet calls them, never fail the agent, every Allocate error is one of the classes (its
// text starts with the class), and a served pod never keeps the lock after its last entry.
// Each input runs a fresh agent and fake kubelet.
func FuzzAllocate(f *testing.F) {
	f.Add("2026-12-01T10:00:00Z,default,p", "GPU-0,NVIDIA,1000,30:GPU-1,NVIDIA,1000,30:;", "allocating", "GPU-0-1,GPU-1-0", "p")
	f.Add("2026-12-01T10:00:00Z,default,p", ";GPU-2,NVIDIA,1,1:;", "allocating", "GPU-2-9", "p")
	f.Add("2026-12-01T10:00:00Z,default,p", "GPU-0,NVIDIA,x,30:;", "allocating", "GPU-0-1", "p")
	f.Add("2026-12-01T10:00:00Z,default,q", "GPU-0,NVIDIA,1,1:;", "allocating", "GPU-0-1", "p")
	f.Add("2026-12-01T10:00:00Z", "GPU-0,NVIDIA,1,1:;", "success", "", "p")
	f.Add("nonsense", "", "", "MIG-1", "p")
	classes := []error{ErrNoBindingPod, ErrPodGone, ErrNoPendingEntry, ErrDeviceCountMismatch, ErrMalformed, ErrAPI, ErrHost, ErrAllocator}
	f.Fuzz(func(t *testing.T, lock, toAllocate, phase, ids, podName string) {
		ctx := klog.NewContext(t.Context(), logr.Discard())
		if !utf8.ValidString(ids) { // proto strings are UTF-8: the kubelet's ids are
			ids = strings.ToValidUTF8(ids, "?")
		}
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, Annotations: map[string]string{nodelock.Key: lock}}}
		if podName == "" || len(podName) > 63 || strings.ContainsAny(podName, "/,") {
			podName = "p"
		}
		pod := gpuPod(podName, "init-a", "main", "side-nogpu")
		pod.Spec.NodeName = testNode
		pod.Annotations = map[string]string{annotation.KeyNVIDIAToAllocate: toAllocate, allocation.KeyBindPhase: phase}
		cs := clienttest.NewClientset(node, pod)
		k := kubelettest.Start(t)
		a, err := New(cs, testNode, staticSource(testGPUs()), Options{Period: time.Hour, EventRecorder: &record.FakeRecorder{}, Kubelet: kubeletplugin.Options{PluginDir: k.Dir()}})
		if err != nil {
			t.Fatal(err)
		}
		a.backoff = wait.Backoff{Duration: time.Millisecond, Steps: 1}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- a.Run(runCtx) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run = %v", err)
			}
		}()
		waitCtx, stop := context.WithTimeout(ctx, 10*time.Second)
		defer stop()
		if _, err := k.WaitFor(waitCtx, func(s kubelettest.State) bool { _, ok := s.Resource("nvidia.com/gpu"); return ok }); err != nil {
			t.Fatalf("the agent did not register: %v", err)
		}

		var kubeletIDs []string
		if ids != "" {
			kubeletIDs = strings.Split(ids, ",")
		}
		if _, err := k.GetPreferredAllocation(ctx, "nvidia.com/gpu", kubeletIDs, nil, int32(len(kubeletIDs))); err != nil { //nolint:gosec // a short list
			t.Fatalf("GetPreferredAllocation: %v", err)
		}
		for range 3 {
			_, err := k.Allocate(ctx, "nvidia.com/gpu", kubeletIDs)
			if err == nil {
				continue
			}
			msg := status.Convert(errors.Unwrap(err)).Message()
			known := slices.ContainsFunc(classes, func(c error) bool { return strings.HasPrefix(msg, c.Error()) })
			if !known {
				t.Fatalf("Allocate error %q has no class", msg)
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
