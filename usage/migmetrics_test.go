package usage

import (
	"iter"
	"strconv"
	"strings"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
)

// TestMetricsMIGInstances: hami_node_gpu_mig_instance_info's rules beyond the vectors. Master:
// only realized reservations on a registered MIG GPU of the pod's node, one series per label
// set. v2.9.0: the first pod by key names the geometry, a device of an unknown geometry or
// position is left out (HAMi panics), a GPU of no known model has no series, and a position
// held by a pod of another geometry counts by its number (as HAMi marks it). No series: no
// family.
func TestMetricsMIGInstances(t *testing.T) {
	t.Parallel()
	const a100 = "NVIDIA A100-SXM4-40GB"
	gpus := []annotation.Device{
		{ID: "g0", Index: 0, Count: 7, Devmem: 40960, Devcore: 100, Type: a100, Mode: allocation.ModeMIG, Health: true},
		{ID: "g1", Index: 1, Count: 10, Devmem: 23028, Devcore: 100, Type: "NVIDIA A10", Mode: "hami-core", Health: true},
		{ID: "g2", Index: 2, Count: 7, Devmem: 40960, Devcore: 100, Type: "NVIDIA L40S", Mode: allocation.ModeMIG, Health: true},
	}
	nodes := func() iter.Seq2[string, []annotation.Device] {
		return func(yield func(string, []annotation.Device) bool) { yield("n1", gpus) }
	}
	realized := func(gpu string, start, gi int) string {
		return `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"` + gpu + `","profile":"1g.5gb","placement":{"start":` + strconv.Itoa(start) +
			`,"size":1},"migUUID":"MIG-` + gpu + strconv.Itoa(start) + `","gpuInstanceID":` + strconv.Itoa(gi) + `,"computeInstanceID":0}]`
	}
	pending := `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"g0","profile":"1g.5gb","placement":{"start":3,"size":1}}]`
	v290 := func(names ...string) []string {
		out := []string{"# HELP hami_node_gpu_mig_instance_info GPU Sharing mode. 0 for hami-core, 1 for mig, 2 for mps",
			"# TYPE hami_node_gpu_mig_instance_info gauge"}
		for _, n := range names {
			name, v, _ := strings.Cut(n, "=")
			out = append(out, `hami_node_gpu_mig_instance_info{device_index="0",device_uuid="g0",mig_name="`+name+`",node="n1",zone="vGPU"} `+v)
		}
		return out
	}
	tests := map[string]struct {
		version allocation.Version
		pods    []*corev1.Pod
		want    []string
	}{
		"master: pending, hami-core GPU, other node's GPU: no family": {version: allocation.VersionMaster, pods: []*corev1.Pod{
			migPod("pending", "g0,NVIDIA,4864,15:;", pending),
			migPod("core", "g1,NVIDIA,4864,15:;", realized("g1", 0, 1)),
			migPod("elsewhere", "gX,NVIDIA,4864,15:;", realized("gX", 0, 1)),
		}},
		"master: two pods claim one instance: one series": {version: allocation.VersionMaster, pods: []*corev1.Pod{
			migPod("a", "g0,NVIDIA,4864,15:;", realized("g0", 2, 7)),
			migPod("b", "g0,NVIDIA,4864,15:;", realized("g0", 2, 7)),
		}, want: []string{
			"# HELP hami_node_gpu_mig_instance_info Realized MIG instance identity and scheduler placement",
			"# TYPE hami_node_gpu_mig_instance_info gauge",
			`hami_node_gpu_mig_instance_info{compute_instance_id="0",device_index="0",device_uuid="g0",gpu_instance_id="7",mig_uuid="MIG-g02",node="n1",placement_size="1",placement_start="2",profile="1g.5gb",zone="vGPU"} 1`,
		}},
		"v2.9.0: first pod by key names the geometry": {version: allocation.VersionV290, pods: []*corev1.Pod{
			placed("b", "g0[0-5],NVIDIA,5120,14:;"),
			placed("a", "g0[1-1],NVIDIA,10240,28:;"),
		}, want: v290("1g.5gb-0=0", "2g.10gb-1=1", "2g.10gb-2=0", "2g.10gb-3=0")},
		"v2.9.0: unknown geometry, position, model: left out": {version: allocation.VersionV290, pods: []*corev1.Pod{
			placed("a", "g0[9-0],NVIDIA,5120,14:;"),
			placed("b", "g0[3-5],NVIDIA,5120,14:;"),
			placed("c", "g2[0-0],NVIDIA,5120,14:;"),
			placed("d", "g1,NVIDIA,5120,14:;"),
		}, want: v290("7g.40gb-0=0")},
		"v2.9.0: no suffixed device: no family": {version: allocation.VersionV290, pods: []*corev1.Pod{
			placed("a", "g0,NVIDIA,5120,14:;"),
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := allocation.Config{Version: tc.version}
			tr := New(Options{Config: cfg})
			for _, p := range tc.pods {
				tr.Observe(p)
			}
			c := NewHAMiCollector(tr, nodes, MetricsOptions{Config: cfg})
			text, err := testutil.CollectAndFormat(c, expfmt.TypeTextPlain, "hami_node_gpu_mig_instance_info")
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Split(strings.TrimSpace(string(text)), "\n")
			if len(got) == 1 && got[0] == "" {
				got = nil
			}
			if diff := gocmp.Diff(tc.want, got); diff != "" {
				t.Errorf("MIG instance family (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMetricsMIGGeometriesOption: v2.9.0's instance names come from MetricsOptions.MIGGeometries
// when set (a cluster's own knownMigGeometries), matched by model substring.
func TestMetricsMIGGeometriesOption(t *testing.T) {
	t.Parallel()
	gpus := []annotation.Device{{ID: "g0", Count: 4, Devmem: 24576, Devcore: 100, Type: "NVIDIA A30", Mode: allocation.ModeMIG, Health: true}}
	nodes := func() iter.Seq2[string, []annotation.Device] {
		return func(yield func(string, []annotation.Device) bool) { yield("n1", gpus) }
	}
	cfg := allocation.Config{Version: allocation.VersionV290}
	tr := New(Options{Config: cfg})
	tr.Observe(placed("a", "g0[0-1],NVIDIA,12288,50:;"))
	custom := []MIGGeometries{{Models: []string{"A30"}, Geometries: [][]MIGTemplate{{{Name: "2g.12gb", Memory: 12288, Core: 50, Count: 2}}}}}
	c := NewHAMiCollector(tr, nodes, MetricsOptions{Config: cfg, Legacy: true, MIGGeometries: custom})
	text, err := testutil.CollectAndFormat(c, expfmt.TypeTextPlain, "hami_node_gpu_mig_instance_info", "nodeGPUMigInstance")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"# HELP hami_node_gpu_mig_instance_info GPU Sharing mode. 0 for hami-core, 1 for mig, 2 for mps",
		"# TYPE hami_node_gpu_mig_instance_info gauge",
		`hami_node_gpu_mig_instance_info{device_index="0",device_uuid="g0",mig_name="2g.12gb-0",node="n1",zone="vGPU"} 0`,
		`hami_node_gpu_mig_instance_info{device_index="0",device_uuid="g0",mig_name="2g.12gb-1",node="n1",zone="vGPU"} 1`,
		"# HELP nodeGPUMigInstance GPU Sharing mode. 0 for hami-core, 1 for mig, 2 for mps",
		"# TYPE nodeGPUMigInstance gauge",
		`nodeGPUMigInstance{deviceidx="0",deviceuuid="g0",migname="2g.12gb-0",nodeid="n1",zone="vGPU"} 0`,
		`nodeGPUMigInstance{deviceidx="0",deviceuuid="g0",migname="2g.12gb-1",nodeid="n1",zone="vGPU"} 1`,
	}
	if diff := gocmp.Diff(want, strings.Split(strings.TrimSpace(string(text)), "\n")); diff != "" {
		t.Errorf("MIG instance families (-want +got):\n%s", diff)
	}
}
