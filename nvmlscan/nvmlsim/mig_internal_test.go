package nvmlsim

import (
	"errors"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestMIGOverlapsReports checks MIGOverlaps names two overlapping GPU instances, which the
// simulation's NVML never creates: they are put into its state directly.
func TestMIGOverlapsReports(t *testing.T) {
	t.Parallel()
	n, err := New("dgxa100")
	if err != nil {
		t.Fatal(err)
	}
	n.EnableMIG()
	g := n.mig[2]
	two, three := &g.profiles[1], &g.profiles[2] // by enum: 1, 2, 3, 4, 7, 9 slice profiles
	if two.name != "2g.10gb" || three.name != "3g.20gb" {
		t.Fatalf("profiles %q, %q", two.name, three.name)
	}
	g.gis = append(g.gis,
		&gpuInstance{gpu: g, profile: two, live: true, info: nvml.GpuInstanceInfo{Id: 1, ProfileId: 14, Placement: nvml.GpuInstancePlacement{Start: 2, Size: 2}}},
		&gpuInstance{gpu: g, profile: three, live: true, info: nvml.GpuInstanceInfo{Id: 2, ProfileId: 9, Placement: nvml.GpuInstancePlacement{Start: 0, Size: 4}}})
	err = n.MIGOverlaps()
	if !errors.Is(err, ErrMIGOverlap) {
		t.Fatalf("MIGOverlaps = %v, want ErrMIGOverlap", err)
	}
	if want := "simulated MIG instances overlap: GPU 2: GPU instance 1 (2g.10gb at 2+2) and 2 (3g.20gb at 0+4)"; err.Error() != want {
		t.Errorf("MIGOverlaps = %q, want %q", err, want)
	}
}
