package nodeagent

import (
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/kubeletplugin"
)

func TestMappingModeOf(t *testing.T) {
	t.Parallel()
	gpu := func(id string, count int32, healthy bool) annotation.Device {
		return annotation.Device{ID: id, Count: count, Devmem: 40960, Devcore: 100, Health: healthy}
	}
	tests := map[string]struct {
		kubelet  []annotation.Device
		draOwned int
		want     MappingMode
	}{
		"every GPU DRA's":                {nil, 4, MappingDRA},
		"one GPU left to device plugin":  {[]annotation.Device{gpu("a", 10, true)}, 3, MappingDevicePlugin},
		"device-plugin GPU unhealthy":    {[]annotation.Device{gpu("a", 10, false)}, 3, MappingDRA},
		"device-plugin GPU with count 0": {[]annotation.Device{gpu("a", 0, true)}, 3, MappingDRA},
		"no DRA GPU":                     {[]annotation.Device{gpu("a", 10, true)}, 0, MappingNone},
		"nothing at all":                 {nil, 0, MappingNone},
	}
	for name, tc := range tests {
		if got := MappingModeOf(tc.kubelet, tc.draOwned); got != tc.want {
			t.Errorf("%s: %q, want %q", name, got, tc.want)
		}
	}
}

// TestScanMappingMode: a scan in which the DRA world owns every GPU leaves the kubelet no
// healthy device (its count, and the Node's allocatable, 0: a DRA node for the mapping); one
// GPU left to the device plugin makes the node a device-plugin node, a GPU in MIG mode as much
// as any other; a MIG GPU the world owns is DRA's too.
func TestScanMappingMode(t *testing.T) {
	t.Parallel()
	mig := annotation.Device{ID: "GPU-9", Index: 9, Count: 7, Devmem: 40960, Devcore: 100, Mode: "mig", Health: true}
	tests := map[string]struct {
		devs      []annotation.Device
		world     DRA
		want      MappingMode
		wantCount int // healthy devices the kubelet is told of
	}{
		"all DRA's":       {testGPUs(), &fakeDRA{}, MappingDRA, 0},
		"one left":        {testGPUs(), &fakeDRA{gpus: []string{"GPU-0", "GPU-1", "GPU-2"}}, MappingDevicePlugin, 10},
		"MIG left":        {append(testGPUs(), mig), &fakeDRA{gpus: []string{"GPU-0", "GPU-1", "GPU-2", "GPU-3"}}, MappingDevicePlugin, 7},
		"MIG DRA's too":   {append(testGPUs(), mig), &fakeDRA{}, MappingDRA, 0},
		"without a world": {testGPUs(), nil, MappingNone, 40},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a, _ := newDRAAgent(t, staticSource(tc.devs), Options{DRA: tc.world})
			if got := a.MappingMode(); got != MappingNone {
				t.Errorf("before the first scan: %q", got)
			}
			scanned(t, a)
			if got := a.MappingMode(); got != tc.want {
				t.Errorf("mode %q, want %q", got, tc.want)
			}
			healthy := 0
			for _, d := range kubeletplugin.VirtualDevices(a.plugin.Devices(), false) {
				if d.Health == pluginapi.Healthy {
					healthy++
				}
			}
			if healthy != tc.wantCount {
				t.Errorf("the kubelet is told of %d healthy devices, want %d", healthy, tc.wantCount)
			}
		})
	}
}
