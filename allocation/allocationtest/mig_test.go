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
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/internal/vectors"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nodelock"
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

// In operating mode mig, HAMi v2.10.0's plugin refuses an entry whose device carries no MIG
// reservation (it has no MIG instance to resolve it to): bind-phase failed, the node lock
// released, HAMi's words. v2.9.0 in mig mode serves it, and a reserved device is served.
func TestPluginMIGModeRefusesPlainEntry(t *testing.T) {
	t.Parallel()
	plain := allocation.ContainerDevice{UUID: "GPU-m", Type: "NVIDIA", Usedmem: 4864, Usedcores: 15}
	reserved := plain
	reserved.MIG = allocation.MIGSlot{Profile: "1g.5gb", Placement: mig.Placement{Start: 6, Size: 1}}
	tests := map[string]struct {
		version annotation.Version
		mode    string
		devs    allocation.ContainerDevices
		refused bool
	}{
		"v2.10.0 mig mode, plain entry":          {version: annotation.VersionMaster, mode: allocation.ModeMIG, devs: allocation.ContainerDevices{plain}, refused: true},
		"v2.10.0 mig mode, one of two plain":     {version: annotation.VersionMaster, mode: allocation.ModeMIG, devs: allocation.ContainerDevices{reserved, plain}, refused: true},
		"v2.10.0 mig mode, reserved entry":       {version: annotation.VersionMaster, mode: allocation.ModeMIG, devs: allocation.ContainerDevices{reserved}},
		"v2.10.0 hami-core mode, plain entry":    {version: annotation.VersionMaster, devs: allocation.ContainerDevices{plain}},
		"v2.9.0 mig mode, plain entry is served": {version: annotation.VersionV290, mode: allocation.ModeMIG, devs: allocation.ContainerDevices{plain}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pod, node := objects()
			cs := fake.NewClientset(pod, node)
			if _, err := allocationtest.NewScheduler(cs, allocationtest.Options{}).Schedule(ctx, pod, "node1", allocation.PodDevices{tc.devs}); err != nil {
				t.Fatal(err)
			}
			a, err := allocationtest.NewPlugin(cs, "node1", allocationtest.Options{Version: tc.version, Mode: tc.mode}).Allocate(ctx, len(tc.devs))
			got, gerr := cs.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
			if gerr != nil {
				t.Fatal(gerr)
			}
			n, nerr := cs.CoreV1().Nodes().Get(ctx, "node1", metav1.GetOptions{})
			if nerr != nil {
				t.Fatal(nerr)
			}
			if _, locked := n.Annotations[nodelock.Key]; locked {
				t.Errorf("node lock %q left", n.Annotations[nodelock.Key])
			}
			phase := got.Annotations[allocation.KeyBindPhase]
			if !tc.refused {
				if err != nil || !a.Last || phase != string(allocation.PhaseSuccess) {
					t.Errorf("Allocate = %+v, %v, bind-phase %q; want served", a, err, phase)
				}
				return
			}
			const hami = "resolve allocated NVIDIA devices: MIG allocation requires an initialized manager and Pod"
			if !errors.Is(err, allocationtest.ErrMIGUnresolved) || err.Error() != hami || !a.Failed || phase != string(allocation.PhaseFailed) {
				t.Errorf("Allocate = %+v, %v, bind-phase %q; want %q, failed", a, err, phase, hami)
			}
			if v := got.Annotations[annotation.KeyNVIDIAToAllocate]; v != allocation.EncodePodDevices(allocation.PodDevices{tc.devs}) {
				t.Errorf("to-allocate %q consumed by a refused call", v)
			}
		})
	}
}
