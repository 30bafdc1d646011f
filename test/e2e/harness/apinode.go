package harness

import (
	"context"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/register"
)

// APINodeOptions describe a Node of [ControlPlane.CreateAPINode].
type APINodeOptions struct {
	// Labels and Annotations are set at creation (e.g. TestLabel, hami.io/device-cordon, a
	// malformed register annotation).
	Labels, Annotations map[string]string
	// GPUAllocatable is status.allocatable nvidia.com/gpu (channel 1), as a kubelet reports it
	// after the device plugin registered (0: the kubelet's count of a plugin without healthy
	// devices); nil leaves the resource out.
	GPUAllocatable *int64
	// Devices, when not nil, are registered by a register.Writer (channel 2 and the handshake's
	// answer) that runs until the test ends; CreateAPINode returns once they are written.
	Devices []annotation.Device
	// QuietWriter discards the register writer's log (benchmarks, whose output it would drown).
	QuietWriter bool
}

// CreateAPINode creates a Node that exists only as an API object (deleted when tb ends):
// without the not-ready taint, Ready, with room for many pods (64 CPUs, 512Gi, 500 pods,
// 100Gi of storage) and opts' GPUs. No kubelet runs: pods bound to it never start.
func (cp *ControlPlane) CreateAPINode(tb testing.TB, name string, opts APINodeOptions) {
	tb.Helper()
	ctx := tb.Context()
	nodes := cp.AdminClient().CoreV1().Nodes()
	n := cp.CreateNode(tb, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: opts.Labels, Annotations: opts.Annotations}})
	n.Spec.Taints = nil
	n, err := nodes.Update(ctx, n, metav1.UpdateOptions{})
	if err != nil {
		tb.Fatalf("remove taints of %s: %v", name, err)
	}
	rl := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("64"),
		corev1.ResourceMemory:           resource.MustParse("512Gi"),
		corev1.ResourcePods:             resource.MustParse("500"),
		corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	if opts.GPUAllocatable != nil {
		rl[annotation.ResourceNVIDIAGPU] = *resource.NewQuantity(*opts.GPUAllocatable, resource.DecimalSI)
	}
	n.Status.Capacity, n.Status.Allocatable = rl, rl
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now()}}
	if _, err := nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		tb.Fatalf("update status of %s: %v", name, err)
	}
	if opts.Devices == nil {
		return
	}
	w, err := register.New(cp.AdminClient(), name, register.Options{EventRecorder: &record.FakeRecorder{}})
	if err != nil {
		tb.Fatal(err)
	}
	w.SetDevices(opts.Devices)
	base := Context(tb)
	if opts.QuietWriter {
		base = klog.NewContext(tb.Context(), logr.Discard())
	}
	wctx, cancel := context.WithCancel(base)
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := w.Run(wctx); err != nil {
			tb.Errorf("register writer of %s: %v", name, err)
		}
	})
	tb.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	if err := w.WaitForSync(ctx); err != nil {
		tb.Fatalf("register %s: %v", name, err)
	}
}
