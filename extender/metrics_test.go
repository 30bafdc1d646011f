package extender

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/schedcache"
	"github.com/hamireg/hamireg/usage"
)

// familyLines returns the exposition lines of the named families (HELP, TYPE and series).
func familyLines(text string, names ...string) []string {
	var out []string
	keep := map[string]bool{}
	for _, n := range names {
		keep[n] = true
	}
	for l := range strings.SplitSeq(text, "\n") {
		name := l
		if rest, ok := strings.CutPrefix(l, "# HELP "); ok {
			name = rest
		} else if rest, ok := strings.CutPrefix(l, "# TYPE "); ok {
			name = rest
		}
		name, _, _ = strings.Cut(name, " ")
		name, _, _ = strings.Cut(name, "{")
		if keep[name] {
			out = append(out, l)
		}
	}
	return out
}

// TestMetricsMemoryRatioOfGPUWithoutMemory: v2.9.0 divides by a GPU's memory as is (NaN for
// a GPU registered with 0 MiB); master leaves the series out.
func TestMetricsMemoryRatioOfGPUWithoutMemory(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		version allocation.Version
		want    []string
	}{
		"v2.9.0": {version: allocation.VersionV290, want: []string{
			"# HELP hami_node_gpu_memory_allocated_ratio GPU Memory Allocated Percentage on a certain GPU",
			"# TYPE hami_node_gpu_memory_allocated_ratio gauge",
			`hami_node_gpu_memory_allocated_ratio{device_index="0",device_uuid="GPU-node1-0",node="node1",zone="vGPU"} NaN`,
		}},
		"master": {version: allocation.VersionMaster},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				reg := prometheus.NewRegistry()
				start(t, Options{Config: allocation.Config{Version: tc.version}, Registerer: reg}, registered("node1", 1, 0))
				text, _ := scrape(t, hamiOnly(reg))
				if diff := gocmp.Diff(tc.want, familyLines(text, "hami_node_gpu_memory_allocated_ratio")); diff != "" {
					t.Errorf("(-want +got):\n%s", diff)
				}
				if !strings.Contains(text, `hami_gpu_memory_limit_bytes{device_index="0",device_type="NVIDIA-A10",device_uuid="GPU-node1-0",node="node1",zone="vGPU"} 0`) {
					t.Errorf("no memory limit series of the GPU:\n%s", text)
				}
			})
		})
	}
}

// TestMetricsOperational: the extender's own families count filters by result, binds, lock
// waits and device annotations that do not decode, and are kept out of HAMi's exposition.
func TestMetricsOperational(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		bad := placedPod("bad", "node1", "GPU-node1-0,NVIDIA,lots,30:;")
		e := start(t, Options{Registerer: reg}, registered("node1", 1, 23028), bad)
		m := e.ext.metrics
		if got := testutil.ToFloat64(m.decodeFailures); got != 1 {
			t.Errorf("decode failures %v, want 1", got)
		}
		pod := gpuPod("train", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"})
		e.create(pod)
		if res := e.filter(pod, "node1"); res.Error != "" || res.NodeNames == nil {
			t.Fatalf("filter: %+v", res)
		}
		big := gpuPod("big", map[string]string{"nvidia.com/gpu": "2"})
		e.create(big)
		e.filter(big, "node1")
		cpu := gpuPod("cpu", map[string]string{"cpu": "1"})
		e.filter(cpu, "node1")
		// A simulation that finds a fitting template, and one that finds none.
		tmpl := *registered("tmpl", 1, 23028)
		if res := e.ext.Filter(e.ctx, &extenderArgs{Pod: big, Nodes: &corev1.NodeList{Items: []corev1.Node{tmpl}}}); res.Nodes != nil {
			t.Fatalf("2 GPUs fit a 1-GPU template: %+v", res)
		}
		if res := e.ext.Filter(e.ctx, &extenderArgs{Pod: pod, Nodes: &corev1.NodeList{Items: []corev1.Node{tmpl}}}); res.Nodes == nil {
			t.Fatalf("simulation: %+v", res)
		}
		synctest.Wait()
		if err := e.ext.Bind(e.ctx, &bindingArgs{PodName: "train", PodNamespace: "default", PodUID: pod.UID, Node: "node1"}); err != nil {
			t.Fatal(err)
		}
		if err := e.ext.Bind(e.ctx, &bindingArgs{PodName: "gone", PodNamespace: "default", Node: "node1"}); err == nil {
			t.Fatal("bind of a pod that does not exist succeeded")
		}
		counts := map[string]uint64{}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, mt := range mf.GetMetric() {
				if h := mt.GetHistogram(); h != nil {
					counts[mf.GetName()+labelString(mt)] = h.GetSampleCount()
				}
			}
		}
		want := map[string]uint64{
			"hamireg_extender_filter_duration_seconds{result=placed}":        1,
			"hamireg_extender_filter_duration_seconds{result=unschedulable}": 2,
			"hamireg_extender_filter_duration_seconds{result=simulated}":     1,
			"hamireg_extender_filter_duration_seconds{result=no_gpu}":        1,
			"hamireg_extender_filter_duration_seconds{result=error}":         0,
			"hamireg_extender_bind_duration_seconds{result=ok}":              1,
			"hamireg_extender_bind_duration_seconds{result=error}":           1,
			"hamireg_extender_filter_lock_wait_seconds{}":                    2,
			"hamireg_extender_node_lock_wait_seconds{}":                      1,
		}
		if diff := gocmp.Diff(want, counts); diff != "" {
			t.Errorf("histogram sample counts (-want +got):\n%s", diff)
		}
		text, _ := scrape(t, hamiOnly(reg))
		if strings.Contains(text, MetricsPrefix) {
			t.Errorf("HAMi's exposition holds the SDK's own families:\n%s", text)
		}
	})
}

func labelString(m *dto.Metric) string {
	parts := make([]string, 0, len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		parts = append(parts, l.GetName()+"="+l.GetValue())
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// TestMetricsRegistererConflict: a second extender on one Registerer is refused with
// ErrInvalidOptions, and the first extender's collectors stay.
func TestMetricsRegistererConflict(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	newWebhookExtender(t, Options{Registerer: reg})
	client := fake.NewClientset()
	c, err := schedcache.New(newNodeInformer(client), schedcache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(client, c, Options{Registerer: reg}); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("second extender on one Registerer: %v, want ErrInvalidOptions", err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
}

// TestDefaultBuildInfo: hami_build_info carries the toolchain of the running binary.
func TestDefaultBuildInfo(t *testing.T) {
	t.Parallel()
	b := DefaultBuildInfo()
	if b.GoVersion != runtime.Version() || b.Compiler != runtime.Compiler || b.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("DefaultBuildInfo() = %+v", b)
	}
	reg := prometheus.NewRegistry()
	newWebhookExtender(t, Options{Registerer: reg})
	text, _ := scrape(t, reg)
	if !strings.Contains(text, `go_version="`+runtime.Version()+`"`) {
		t.Errorf("hami_build_info without the Go version:\n%s", familyLines(text, "hami_build_info"))
	}
}

// usage.NewHAMiCollector over the extender's node cache and tracker reports what the extender
// registers (a scheduler plugin shares it with its own tracker).
func TestNewHAMiCollectorSharesTheFamilies(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		e := start(t, Options{Registerer: reg, LegacyMetrics: true}, registered("node1", 2, 1000),
			placedPod("held", "node1", "GPU-node1-0,NVIDIA,300,20:;"))
		shared := prometheus.NewRegistry()
		shared.MustRegister(usage.NewHAMiCollector(e.ext.usage.Tracker, registeredNodes(e.cache, annotation.VendorNVIDIA), usage.MetricsOptions{Legacy: true}),
			usage.NewBuildInfoCollector(DefaultBuildInfo()))
		want, _ := scrape(t, hamiOnly(reg))
		got, _ := scrape(t, shared)
		if !strings.Contains(got, `hami_vgpu_memory_allocated_bytes{container_index="0",device_uuid="GPU-node1-0",namespace="default",node="node1",pod="held",zone="vGPU"} 3.145728e+08`) {
			t.Errorf("the shared collector misses the held pod:\n%s", got)
		}
		if diff := gocmp.Diff(want, got); diff != "" {
			t.Errorf("shared collector differs from the extender's (-extender +shared):\n%s", diff)
		}
	})
}
