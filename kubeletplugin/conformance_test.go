package kubeletplugin_test

import (
	"cmp"
	"slices"
	"strconv"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/internal/vectors"
	"github.com/hamireg/hamireg/kubeletplugin"
)

// numaFile is numa-topology.json: HAMi's GetPluginDevices, the list ListAndWatch sends.
type numaFile struct {
	Vectors []numaVector `json:"vectors"`
}

type numaVector struct {
	Name  string `json:"name"`
	Input struct {
		Devices []struct {
			UUID    string `json:"uuid"`
			Index   string `json:"index"`
			HasNUMA bool   `json:"has_numa"`
			NUMA    int    `json:"numa"`
			Health  string `json:"health"`
		} `json:"devices"`
		SplitCount int32 `json:"device_split_count"`
	} `json:"input"`
	WantFalse      []numaDevice `json:"want_devices_flag_false"`
	WantTrue       []numaDevice `json:"want_devices_flag_true"`
	WantPanicFalse any          `json:"want_panic_flag_false"`
	WantPanicTrue  any          `json:"want_panic_flag_true"`
}

type numaDevice struct {
	ID       string `json:"id"`
	Health   string `json:"health"`
	Topology *struct {
		Nodes []struct {
			ID int64 `json:"id"`
		} `json:"nodes"`
	} `json:"topology"`
}

// TestNUMATopologyConformance: VirtualDevices against HAMi's GetPluginDevices, flag off and
// on, both versions. v2.9.0 has no flag: both columns are its only answer, and the SDK's
// flag-off list must equal it (the SDK's default is HAMi v2.10.0's, which equals v2.9.0's);
// the flag-on column of v2.9.0 is compared with flag off, the only thing v2.9.0 can do. Where
// HAMi panics (v2.9.0, an empty device set) the SDK's rule holds instead: an empty list.
func TestNUMATopologyConformance(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		var f numaFile
		if !folder.Read(t, "numa-topology.json", &f) {
			continue
		}
		n := 0
		for _, v := range f.Vectors {
			devices := make([]annotation.Device, 0, len(v.Input.Devices))
			for _, d := range v.Input.Devices {
				idx, _ := strconv.ParseUint(d.Index, 10, 64) // a MIG device's "0:1": order does not matter, the lists are sorted by id
				numa := d.NUMA
				if !d.HasNUMA {
					numa = -1 // the SDK's "NUMA node unknown"
				}
				devices = append(devices, annotation.Device{
					ID: d.UUID, Index: uint(idx), Count: v.Input.SplitCount, Numa: numa, Health: d.Health != pluginapi.Unhealthy,
				})
			}
			for _, c := range []struct {
				flag  bool
				want  []numaDevice
				panic any
			}{{false, v.WantFalse, v.WantPanicFalse}, {true, v.WantTrue, v.WantPanicTrue}} {
				n++
				got := kubeletplugin.VirtualDevices(devices, c.flag && !folder.V290)
				if c.panic != nil {
					// HAMi panicked; the SDK's rule: an empty device set is an empty list.
					if len(devices) != 0 || got == nil || len(got) != 0 {
						t.Errorf("%s/%s flag %v: HAMi panics (%v); want the SDK's empty list for an empty set, got %v", folder.Name(), v.Name, c.flag, c.panic, got)
					}
					continue
				}
				if diff := gocmp.Diff(c.want, fromAPI(got), cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("%s/%s flag %v (-HAMi +SDK):\n%s", folder.Name(), v.Name, c.flag, diff)
				}
			}
		}
		t.Logf("checked %d vectors from %s (numa-topology.json, flag off and on)", n, folder.Dir)
	}
}

// fromAPI is the kubelet's list in the vectors' shape, sorted by id.
func fromAPI(devs []*pluginapi.Device) []numaDevice {
	out := make([]numaDevice, 0, len(devs))
	for _, d := range devs {
		nd := numaDevice{ID: d.ID, Health: d.Health}
		if d.Topology != nil {
			nd.Topology = &struct {
				Nodes []struct {
					ID int64 `json:"id"`
				} `json:"nodes"`
			}{}
			for _, node := range d.Topology.Nodes {
				nd.Topology.Nodes = append(nd.Topology.Nodes, struct {
					ID int64 `json:"id"`
				}{node.ID})
			}
		}
		out = append(out, nd)
	}
	slices.SortFunc(out, func(a, b numaDevice) int { return cmp.Compare(a.ID, b.ID) })
	return out
}
