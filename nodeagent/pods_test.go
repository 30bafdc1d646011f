package nodeagent

import (
	"context"
	"errors"
	"testing"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/clienttest"
	"github.com/hamireg/hamireg/kubeletplugin"
)

// TestRunJoinsThePodInformer: the pod informer of MIG and DRA syncs before the kubelet is
// contacted, and no goroutine of it (or of any other part) outlives Run, here ended by the
// missing kubelet. Not parallel: goleak looks at the whole process.
func TestRunJoinsThePodInformer(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	_, ctx := ktesting.NewTestContext(t)
	cs := clienttest.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}})
	a, err := New(cs, testNode, staticSource(migDevices()), Options{
		MIG: newFakeMIG(migGPU0, migGPU1), DRA: &fakeDRA{},
		EventRecorder: &record.FakeRecorder{}, Kubelet: kubeletplugin.Options{PluginDir: t.TempDir()},
	})
	if err != nil {
		t.Fatal(err)
	}
	err = a.Run(ctx)
	if err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want the missing kubelet's error", err)
	}
	if !a.pods.synced.Load() {
		t.Error("Run contacted the kubelet before the pod informer synced")
	}
	goleak.VerifyNone(t, ignore)
}
