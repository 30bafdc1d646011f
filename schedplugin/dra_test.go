package schedplugin

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/dra"
)

// fakeDRAManager is the part of fwk.SharedDRAManager the plugin reads: the extended-resource
// mapping's class of nvidia.com/gpu, when set.
type fakeDRAManager struct {
	fwk.SharedDRAManager
	class *resourcev1.DeviceClass
}

func (m *fakeDRAManager) DeviceClassResolver() fwk.DeviceClassResolver { return m }

func (m *fakeDRAManager) GetDeviceClass(name corev1.ResourceName) *resourcev1.DeviceClass {
	if m.class != nil && m.class.Spec.ExtendedResourceName != nil && *m.class.Spec.ExtendedResourceName == string(name) {
		return m.class
	}
	return nil
}

// TestDRANode: on a node that serves nvidia.com/gpu through DRA (a class maps it, the node
// counts none), a whole-GPU pod passes Filter and gets no reservation, lock or annotation; a
// share is unresolvable with the fix; device-plugin nodes are fitted as before.
func TestDRANode(t *testing.T) {
	t.Parallel()
	class, err := dra.DeviceClassWith(dra.SDKProfile(), dra.DeviceClassOptions{ExtendedResourceName: "nvidia.com/gpu"})
	if err != nil {
		t.Fatal(err)
	}
	draN := gpuNode("dra", gpus("dra", 2, 1000), nil)
	draN.Status.Allocatable["nvidia.com/gpu"] = resource.MustParse("0")
	dp := gpuNode("dp", gpus("dp", 1, 1000), nil)
	whole := gpuPod("whole", map[string]string{"nvidia.com/gpu": "1"})
	share := gpuPod("share", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "500"})
	e := newEnv(t, nil, draN, dp, whole, share)

	// Without a mapping the node is fitted HAMi's way: it counts no GPU.
	if st := e.p.Filter(e.ctx, e.preFilter(whole), whole, nodeInfo(draN)); st.IsSuccess() {
		t.Fatalf("no mapping: Filter passed a node with allocatable 0")
	}
	e.h.dra = &fakeDRAManager{class: class}

	cs := e.preFilter(whole)
	if st := e.p.Filter(e.ctx, cs, whole, nodeInfo(draN)); !st.IsSuccess() {
		t.Fatalf("whole GPU on the DRA node: %v", st)
	}
	if st := e.p.Reserve(e.ctx, cs, whole, "dra"); !st.IsSuccess() {
		t.Fatalf("Reserve on the DRA node: %v", st)
	}
	e.client.ClearActions()
	if st := e.p.PreBind(e.ctx, cs, whole, "dra"); !st.IsSuccess() {
		t.Fatalf("PreBind on the DRA node: %v", st)
	}
	if a := e.client.Actions(); len(a) != 0 {
		t.Errorf("PreBind on the DRA node wrote %v, want nothing", a)
	}
	if _, held := e.p.sh.trackers[0].Pod(podKeyOf(whole)); held {
		t.Error("the DRA node's pod holds HAMi devices")
	}
	e.p.Unreserve(e.ctx, cs, whole, "dra")

	st := e.p.Filter(e.ctx, e.preFilter(share), share, nodeInfo(draN))
	if st.Code() != fwk.UnschedulableAndUnresolvable || !strings.HasPrefix(st.Message(), ReasonDRANode) ||
		!strings.Contains(st.Message(), "nvidia.com/gpumem") || !strings.Contains(st.Message(), "write a ResourceClaim") {
		t.Errorf("share on the DRA node: %v %q", st.Code(), st.Message())
	}
	// The device-plugin node: as before, with HAMi's reservation.
	cs = e.preFilter(share)
	if st := e.p.Filter(e.ctx, cs, share, nodeInfo(dp)); !st.IsSuccess() {
		t.Fatalf("share on the device-plugin node: %v", st)
	}
	if st := e.p.Reserve(e.ctx, cs, share, "dp"); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := e.p.PreBind(e.ctx, cs, share, "dp"); !st.IsSuccess() {
		t.Fatal(st)
	}
	got, err := e.client.CoreV1().Pods("default").Get(e.ctx, "share", metav1.GetOptions{})
	if err != nil || got.Annotations[allocation.KeyNode] != "dp" {
		t.Errorf("share on the device-plugin node: %s %q (%v)", allocation.KeyNode, got.Annotations[allocation.KeyNode], err)
	}
}
