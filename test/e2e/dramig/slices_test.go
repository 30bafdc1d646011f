package dramig_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// TestSlicesValidOnAPIServer: what dra.Slices lays out for a large MIG node (ten MIG GPUs,
// 170 placements, two unhealthy, five shared GPUs, one not owned) is accepted by
// kube-apiserver v1.37's own validation, in both profiles; the same devices in one slice are
// refused (the server does check the limits).
func TestSlicesValidOnAPIServer(t *testing.T) {
	t.Parallel()
	node := harness.UniqueName("dramig-slices")
	cp.CreateNode(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	var gpus []annotation.Device
	for i := range uint(10) {
		g := a100MIG(i, fmt.Sprintf("GPU-mig-%d", i))
		g.MIGProfiles = append(g.MIGProfiles,
			annotation.MigProfile{Name: "2g.10gb", MemoryMB: 9856, Core: 29, SliceCount: 2, Placements: []annotation.MigPlacement{{Start: 0, Size: 2}, {Start: 2, Size: 2}, {Start: 4, Size: 2}}},
			annotation.MigProfile{Name: "3g.20gb", MemoryMB: 19968, Core: 43, SliceCount: 3, Placements: []annotation.MigPlacement{{Start: 0, Size: 4}, {Start: 4, Size: 4}}})
		g.Health = i%5 != 3
		gpus = append(gpus, g)
	}
	for i := range uint(5) {
		gpus = append(gpus, a100(10+i, fmt.Sprintf("GPU-shared-%d", i)))
	}
	client := cp.AdminClient().ResourceV1().ResourceSlices()
	for _, p := range []dra.Profile{dra.SDKProfile(), dra.HAMiProfile()} {
		ss, err := dra.Slices(gpus, dra.Options{Profile: p, Owned: func(d annotation.Device) bool { return d.ID != "GPU-shared-4" }})
		if err != nil {
			t.Fatal(err)
		}
		migDevs := 0
		for i, s := range ss {
			for _, d := range s.Devices {
				if len(d.ConsumesCounters) > 0 {
					migDevs++
				}
			}
			obj := &resourcev1.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{GenerateName: node + "-"},
				Spec: resourcev1.ResourceSliceSpec{
					Driver: p.Driver, NodeName: &node,
					Pool:           resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: int64(len(ss))},
					Devices:        s.Devices,
					SharedCounters: s.SharedCounters,
				},
			}
			if _, err := client.Create(t.Context(), obj, metav1.CreateOptions{}); err != nil {
				t.Errorf("%s: slice %d of %d refused: %v", p.Name, i, len(ss), err)
			}
		}
		if migDevs != 10*17 || len(ss) != 2+3 {
			t.Errorf("%s: %d MIG devices in %d slices, want 170 in 5", p.Name, migDevs, len(ss))
		}

		// Negative control: every device in one slice is over the limit of 64.
		var all []resourcev1.Device
		for _, s := range ss {
			all = append(all, s.Devices...)
		}
		obj := &resourcev1.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{GenerateName: node + "-"},
			Spec: resourcev1.ResourceSliceSpec{Driver: p.Driver, NodeName: &node,
				Pool: resourcev1.ResourcePool{Name: node + "-one", Generation: 1, ResourceSliceCount: 1}, Devices: all},
		}
		if _, err := client.Create(t.Context(), obj, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "64") {
			t.Errorf("%s: one slice of %d devices: %v, want a refusal naming the limit 64", p.Name, len(all), err)
		}
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(t.Context())
		list, err := client.List(ctx, metav1.ListOptions{})
		if err != nil {
			return
		}
		for _, s := range list.Items {
			if s.Spec.NodeName != nil && *s.Spec.NodeName == node {
				_ = client.Delete(ctx, s.Name, metav1.DeleteOptions{})
			}
		}
	})
}
