package nvmlscan_test

import (
	"encoding/json"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlscantest"
)

// hamiMaster is the subset of HAMi master's DeviceInfo that its node agent fills, with HAMi's
// field order and tags (pkg/device/devices.go): what encoding/json writes for it is what HAMi
// writes.
type hamiMaster struct {
	ID      string `json:"id,omitempty"`
	Index   uint   `json:"index,omitempty"`
	Count   int32  `json:"count,omitempty"`
	Devmem  int32  `json:"devmem,omitempty"`
	Devcore int32  `json:"devcore,omitempty"`
	Type    string `json:"type,omitempty"`
	Numa    int    `json:"numa,omitempty"`
	Mode    string `json:"mode,omitempty"`
	Health  bool   `json:"health,omitempty"`
}

// hamiV290 is the same in HAMi v2.9.0, whose struct-valued DevicePairScore is always written.
type hamiV290 struct {
	ID              string `json:"id,omitempty"`
	Index           uint   `json:"index,omitempty"`
	Count           int32  `json:"count,omitempty"`
	Devmem          int32  `json:"devmem,omitempty"`
	Devcore         int32  `json:"devcore,omitempty"`
	Type            string `json:"type,omitempty"`
	Numa            int    `json:"numa,omitempty"`
	Mode            string `json:"mode,omitempty"`
	Health          bool   `json:"health,omitempty"`
	DevicePairScore struct {
		ID     string         `json:"uuid,omitempty"`
		Scores map[string]int `json:"score,omitempty"`
	} `json:"devicepairscore,omitempty"`
}

// TestWireFormat8xH100: the annotation scanned from a simulated DGX H100 encodes to the bytes
// HAMi writes for the same devices (in index order, which HAMi produces only by chance). One GPU
// is unhealthy, so a missing "health" key is covered as well as GPU 0's missing "index" and
// NUMA node 0's missing "numa".
func TestWireFormat8xH100(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	n := nvmlscantest.NewNode(t, dgxh100.New())
	s := newScanner(t, n, nvmlscan.Options{Health: fastHealth()})
	startRun(ctx, t, s)
	n.XID(6, 79)
	waitChanged(t, s)
	res := scan(ctx, t, s)

	var master []hamiMaster
	var v290 []hamiV290
	for i := range 8 {
		numa := 0
		if i >= 4 {
			numa = 1
		}
		m := hamiMaster{
			ID: n.UUID(i), Index: uint(i), Count: 10, Devmem: 81920, Devcore: 100,
			Type: "NVIDIA H100 80GB HBM3", Numa: numa, Mode: "hami-core", Health: i != 6,
		}
		master = append(master, m)
		v290 = append(v290, hamiV290{ID: m.ID, Index: m.Index, Count: m.Count, Devmem: m.Devmem, Devcore: m.Devcore, Type: m.Type, Numa: m.Numa, Mode: m.Mode, Health: m.Health})
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
}
