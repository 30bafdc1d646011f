package kubeletplugin_test

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// gpuPod asks n nvidia.com/gpu in one container.
func gpuPod(name string, n int64) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:      "main",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{resource: *resourceQty(n)}},
		}}},
	}
}

func resourceQty(n int64) *apiresource.Quantity {
	return apiresource.NewQuantity(n, apiresource.DecimalSI)
}

// The NUMA flag through the kubelet's own Topology Manager and device manager: two GPUs, one
// per NUMA node, each published once (split count 1, so a pod asking 2 needs both). Under
// the single-numa-node policy, with Options.NUMATopology the kubelet refuses a pod whose
// devices cannot share a NUMA node (TopologyAffinityError) and aligns a one-device pod to one
// node; without it (the default, HAMi v2.10.0's) the devices carry no NUMA preference and the
// two-device pod is admitted, as under HAMi's plugin. (restricted admits the two-device pod
// either way: the device manager prefers the fewest NUMA nodes the request can fit, here two.)
func TestNUMATopologyUnderTopologyManager(t *testing.T) {
	t.Parallel()
	devs := []annotation.Device{
		{ID: "GPU-00000000-303d-558d-435e-99a160631fe4", Index: 0, Count: 1, Numa: 0, Health: true},
		{ID: "GPU-00000001-303d-558d-435e-99a160631fe4", Index: 1, Count: 1, Numa: 1, Health: true},
	}
	for _, policy := range []string{"single-numa-node"} {
		for _, on := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/numa=%v", policy, on), func(t *testing.T) {
				t.Parallel()
				dm := harness.StartDeviceManagerForTest(t, kubeletpeer.DeviceManagerOptions{TopologyManagerPolicy: policy, NUMANodes: 2})
				startPlugin(t, kubeletplugin.Options{PluginDir: dm.Dir(), NUMATopology: on}, devs)
				waitForResources(t, dm, 2, 2)

				both, err := dm.Admit(t.Context(), gpuPod("both", 2))
				if err != nil {
					t.Fatal(err)
				}
				if on {
					if both.Admit || both.Reason != "TopologyAffinityError" {
						t.Errorf("a pod asking both GPUs (NUMA 0 and 1) with NUMA topology: %+v, want refused with TopologyAffinityError", both)
					}
				} else if got := both.DeviceIDs["main"][resource]; !both.Admit || len(got) != 2 {
					t.Errorf("a pod asking both GPUs without NUMA topology: %+v, want admitted with 2 devices", both)
				}

				one, err := dm.Admit(t.Context(), gpuPod("one", 1))
				if err != nil {
					t.Fatal(err)
				}
				if on {
					// Nothing holds a device (the refused pod got none): one of the two, aligned.
					if got := one.DeviceIDs["main"][resource]; !one.Admit || len(got) != 1 || !strings.HasSuffix(got[0], "-0") {
						t.Errorf("a one-GPU pod with NUMA topology: %+v, want admitted with one device", one)
					}
				} else if one.Admit {
					// Both devices went to the first pod: nothing is left, with or without NUMA.
					t.Errorf("a one-GPU pod after both GPUs went to the first: %+v, want refused", one)
				}
			})
		}
	}
}
