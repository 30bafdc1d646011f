package allocationtest_test

import (
	"errors"
	"maps"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/internal/vectors"
	"github.com/hamireg/hamireg/mig"
)

// Given HAMi's devices and reservation of each mig-fit.json patch, Filter writes HAMi
// master's annotations byte for byte, hami.io/vgpu-mig-allocations included.
func TestFilterWritesHAMiMIGReservation(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		var f struct {
			Vectors []struct {
				Name    string `json:"name"`
				Patches []struct {
					Body struct {
						Metadata struct {
							Annotations map[string]string `json:"annotations"`
						} `json:"metadata"`
					} `json:"body"`
				} `json:"want_patches"`
			} `json:"vectors"`
		}
		if folder.V290 || !folder.Read(t, "mig-fit.json", &f) {
			continue
		}
		n := 0
		for _, v := range f.Vectors {
			if len(v.Patches) != 1 {
				continue
			}
			n++
			want := v.Patches[0].Body.Metadata.Annotations
			pd, err := allocation.DecodePodDevices(want["hami.io/vgpu-devices-to-allocate"], allocation.VersionMaster)
			if err != nil {
				t.Fatal(err)
			}
			allocs, err := mig.DecodeAllocations(want[mig.KeyAllocations])
			if err != nil {
				t.Fatal(err)
			}
			if pd, err = allocation.WithMIG(pd, allocs); err != nil {
				t.Fatalf("%s: %v", v.Name, err)
			}
			pod, node := objects()
			cs := fake.NewClientset(pod, node)
			got, err := allocationtest.NewScheduler(cs, allocationtest.Options{Clock: testingclock.NewFakeClock(now)}).Filter(t.Context(), pod, "node1", pd)
			if err != nil {
				t.Fatal(err)
			}
			want = maps.Clone(want)
			want[allocation.KeyTime] = got.Annotations[allocation.KeyTime]
			if diff := cmp.Diff(want, got.Annotations); diff != "" {
				t.Errorf("%s: annotations (-HAMi +got):\n%s", v.Name, diff)
			}
		}
		t.Logf("checked %d vectors from %s (mig-fit.json patches)", n, folder.Dir)
	}
}

// The Plugin reads the MIG reservation onto the devices it serves, and fails a pod whose
// reservation does not match its device list.
func TestPluginMIG(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	slot := allocation.MIGSlot{Profile: "1g.5gb", Placement: mig.Placement{Start: 6, Size: 1}}
	dev := allocation.ContainerDevice{UUID: "GPU-m", Type: "NVIDIA", Usedmem: 4864, Usedcores: 15, MIG: slot}
	pod, node := objects()
	cs := fake.NewClientset(pod, node)
	if _, err := allocationtest.NewScheduler(cs, allocationtest.Options{}).Schedule(ctx, pod, "node1", allocation.PodDevices{{dev}}); err != nil {
		t.Fatal(err)
	}
	a, err := allocationtest.NewPlugin(cs, "node1", allocationtest.Options{}).Allocate(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(allocation.ContainerDevices{dev}, a.Devices); diff != "" || !a.Last {
		t.Errorf("served (-want +got):\n%s (last %v)", diff, a.Last)
	}

	bad := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "bad", UID: "uid-2"}, Spec: pod.Spec}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other := dev
	other.MIG = allocation.MIGSlot{}
	if _, err := allocationtest.NewScheduler(cs, allocationtest.Options{}).Schedule(ctx, bad, "node1", allocation.PodDevices{{other}}); err != nil {
		t.Fatal(err)
	}
	patch := `{"metadata":{"annotations":{"hami.io/vgpu-mig-allocations":"[{\"containerIndex\":0,\"deviceIndex\":1,\"gpuUUID\":\"GPU-m\",\"profile\":\"1g.5gb\",\"placement\":{\"start\":6,\"size\":1}}]"}}}`
	if _, err := cs.CoreV1().Pods("default").Patch(ctx, "bad", "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	a, err = allocationtest.NewPlugin(cs, "node1", allocationtest.Options{}).Allocate(ctx, 1)
	if !errors.Is(err, mig.ErrMalformed) || !a.Failed {
		t.Errorf("Allocate = %+v, %v; want a failed pod and ErrMalformed", a, err)
	}
}
