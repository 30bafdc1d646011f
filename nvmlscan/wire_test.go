package nvmlscan_test

import (
	"encoding/json"
	"testing"
	"testing/synctest"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/internal/hamiwire"
	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlscantest"
)

// TestWireFormat8xH100: the annotation scanned from a simulated DGX H100 encodes to the bytes
// HAMi writes for the same devices (in index order, which HAMi produces only by chance). One GPU
// is unhealthy, so a missing "health" key is covered as well as GPU 0's missing "index" and
// NUMA node 0's missing "numa".
func TestWireFormat8xH100(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := testContext(t)
		n := nvmlscantest.NewNode(t, dgxh100.New())
		s := newScanner(t, n, nvmlscan.Options{Health: fastHealth()})
		startRun(ctx, t, s)
		n.XID(6, 79)
		waitChanged(t, s)
		res := scan(ctx, t, s)

		var master []hamiwire.DeviceMaster
		var v290 []hamiwire.DeviceV290
		for i := range 8 {
			numa := 0
			if i >= 4 {
				numa = 1
			}
			m := hamiwire.DeviceMaster{
				ID: n.UUID(i), Index: uint(i), Count: 10, Devmem: 81920, Devcore: 100,
				Type: "NVIDIA H100 80GB HBM3", Numa: numa, Mode: "hami-core", Health: i != 6,
			}
			master = append(master, m)
			v290 = append(v290, hamiwire.DeviceV290{ID: m.ID, Index: m.Index, Count: m.Count, Devmem: m.Devmem, Devcore: m.Devcore, Type: m.Type, Numa: m.Numa, Mode: m.Mode, Health: m.Health})
		}
		wantMaster, err := json.Marshal(master)
		if err != nil {
			t.Fatal(err)
		}
		wantV290, err := json.Marshal(v290)
		if err != nil {
			t.Fatal(err)
		}
		if got := annotation.Encode(res.Devices); got != string(wantMaster) {
			t.Errorf("master shape:\n got %s\nwant %s", got, wantMaster)
		}
		if got := annotation.EncodeShape(res.Devices, annotation.ShapeV290); got != string(wantV290) {
			t.Errorf("v2.9.0 shape:\n got %s\nwant %s", got, wantV290)
		}
		t.Logf("%s", wantMaster)
	})
}
