package nvmlscantest_test

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"

	"github.com/hamireg/hamireg/nvmlscan/nvmlscantest"
)

func TestNewMIGNode(t *testing.T) {
	t.Parallel()
	node := nvmlscantest.NewMIGNode(t, dgxh100.New())
	for i := range node.Server.Devices {
		if cur, pend, ret := node.Device(i).GetMigMode(); cur != 1 || pend != 1 || ret != nvml.SUCCESS {
			t.Errorf("GPU %d: GetMigMode = %d, %d, %v", i, cur, pend, ret)
		}
	}
	d := node.Device(3)
	info, _ := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_7_SLICE)
	if _, ret := d.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 0, Size: 8}); ret != nvml.SUCCESS {
		t.Fatalf("7g.80gb = %v", ret)
	}
	if got := node.MIGInstances(3); len(got) != 1 || got[0].Profile != "7g.80gb" || got[0].ProfileID != 0 {
		t.Errorf("MIGInstances = %+v", got)
	}
}
