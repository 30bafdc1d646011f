package controlplane_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// The register annotation, encoded by the SDK's codec and written with a JSON merge patch
// as HAMi's device plugin does, comes back from a real apiserver byte for byte and decodes
// to the same devices; HAMi's scheduler-side check accepts it.
func TestRegisterAnnotationRoundTripThroughAPIServer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	name := harness.UniqueName("register")
	createNode(t, name, nil)

	devices := annotation.Canonical([]annotation.Device{
		{ID: "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4", Index: 0, Count: 10, Devmem: 81920, Devcore: 100, Type: "NVIDIA-NVIDIA A100-SXM4-80GB", Numa: 0, Mode: "hami-core", Health: true},
		{ID: "GPU-4c7d1f2a-6b9e-4d0c-8f3a-2e5b7c9d1a0f", Index: 1, Count: 10, Devmem: 81920, Devcore: 100, Type: "NVIDIA-NVIDIA A100-SXM4-80GB", Numa: 1, Mode: "mig", Health: true,
			MIGProfiles: []annotation.MigProfile{{Name: "1g.10gb", MemoryMB: 9856, Core: 14, SliceCount: 1, Placements: []annotation.MigPlacement{{Start: 0, Size: 1}, {Start: 1, Size: 1}}}}},
		{ID: "GPU-9a8b7c6d-5e4f-4a3b-2c1d-0e9f8a7b6c5d", Index: 2, Count: 10, Devmem: 81920, Devcore: 100, Type: "NVIDIA-NVIDIA A100-SXM4-80GB", Numa: 1, Mode: "hami-core", Health: false},
	})
	value := annotation.Encode(devices)
	if err := patchAnnotations(ctx, name, annotationMergePatch(map[string]string{annotation.KeyNVIDIARegister: value})); err != nil {
		t.Fatalf("merge patch: %v", err)
	}

	n, err := cp.AdminClient().CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node: %v", err)
	}
	got := n.Annotations[annotation.KeyNVIDIARegister]
	if got != value {
		t.Fatalf("annotation changed on the way through the apiserver:\n got %s\nwant %s", got, value)
	}
	decoded, err := annotation.Decode(got)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if diff := cmp.Diff(devices, decoded, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("decoded devices differ (-written +read):\n%s", diff)
	}
	if v := annotation.Check(annotation.NVIDIA(), n.Annotations); !v.Registers {
		t.Errorf("HAMi's check rejects the node: %v", v.Err)
	}
}
