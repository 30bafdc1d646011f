package nvmlscan_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/google/go-cmp/cmp"

	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlscantest"
)

// TestMIGManagerSimulatedDGXA100 realises instances on nvmlsim's DGX A100 in MIG mode, which
// refuses overlapping placements as the hardware does; the node fails the test at cleanup if
// two live instances overlap.
func TestMIGManagerSimulatedDGXA100(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	n := nvmlscantest.NewMIGNode(t, dgxa100.New())
	s := newScanner(t, n, nvmlscan.Options{Mode: nvmlscan.ModeMIG, Health: nvmlscan.HealthOptions{Disabled: true}})
	m := s.MIG()
	gpu := n.UUID(0)

	res := scan(ctx, t, s)
	if len(res.Devices) != 8 || len(res.Failed) != 0 || res.Devices[0].Count != 7 {
		t.Fatalf("scan: %d devices, failed %v", len(res.Devices), res.Failed)
	}
	oneG, err := m.Create(ctx, gpu, "1g.5gb", mig.Placement{Start: 6, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	if oneG.ProfileID != 19 || oneG.GPUInstanceID == 0 || !strings.HasPrefix(oneG.MigUUID, "MIG-") {
		t.Errorf("1g.5gb instance %+v: want profile id 19, a GPU instance id and a MIG UUID", oneG)
	}
	_, err = m.Create(ctx, gpu, "3g.20gb", mig.Placement{Start: 4, Size: 4})
	if !errors.Is(err, nvmlscan.ErrPlacementTaken) || !strings.Contains(err.Error(), oneG.MigUUID) {
		t.Errorf("3g.20gb over the 1g.5gb: %v, want ErrPlacementTaken naming %s", err, oneG.MigUUID)
	}
	twoG, err := m.Create(ctx, gpu, "2g.10gb", mig.Placement{Start: 4, Size: 2})
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.Instances(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]mig.Instance{oneG, twoG}, got); diff != "" {
		t.Errorf("Instances (-want +got):\n%s", diff)
	}
	if live := n.MIGInstances(0); len(live) != 2 {
		t.Errorf("simulation has %d live instances, want 2", len(live))
	}
	for _, inst := range []mig.Instance{oneG, twoG, oneG} {
		if err := m.Destroy(ctx, inst); err != nil {
			t.Errorf("Destroy %s: %v", inst.MigUUID, err)
		}
	}
	if got, err := m.Instances(ctx); err != nil || len(got) != 0 {
		t.Errorf("Instances after Destroy: %v, %v", got, err)
	}
}
