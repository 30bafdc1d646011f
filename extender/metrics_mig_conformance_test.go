package extender

import (
	"cmp"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/internal/vectors"
)

type migMetricsVector struct {
	Name  string `json:"name"`
	Input struct {
		Nodes []struct {
			Name     string `json:"name"`
			Register string `json:"register_annotation"`
		} `json:"nodes"`
		Pods []vectorPod `json:"pods"`
	} `json:"input"`
	WantText           string   `json:"want_text"`
	WantTextLegacy     string   `json:"want_text_legacy"`
	WantContentType    string   `json:"want_content_type"`
	WantMIGLines       []string `json:"want_mig_lines"`
	WantMIGLinesLegacy []string `json:"want_mig_lines_legacy"`
}

// TestConformanceMIGInstanceMetrics builds the extender's state from each
// mig-instance-metrics.json vector (the nodes' register annotations as HAMi's node agent wrote
// them, the pods with their device lists and MIG reservations), scrapes HAMi's families as
// TestConformanceMetrics does and compares the whole exposition with HAMi's byte for byte,
// with and without legacy names, and the content type: hami_node_gpu_mig_instance_info and
// nodeGPUMigInstance with v2.9.0's labels (geometry positions, 0 or 1) and v2.10.0's (realized
// instances only), and the other families around them.
func TestConformanceMIGInstanceMetrics(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		var f struct {
			Vectors []migMetricsVector `json:"vectors"`
		}
		if !folder.Read(t, "mig-instance-metrics.json", &f) {
			continue
		}
		version := vectors.Pick(folder, allocation.VersionMaster, allocation.VersionV290)
		for _, v := range f.Vectors {
			for _, legacy := range []bool{false, true} {
				want, lines := v.WantText, v.WantMIGLines
				if legacy {
					want, lines = v.WantTextLegacy, v.WantMIGLinesLegacy
				}
				t.Run(folder.Name()+"/"+v.Name+"/legacy="+strconv.FormatBool(legacy), func(t *testing.T) {
					t.Parallel()
					synctest.Test(t, func(t *testing.T) {
						got, ct := scrapeMIGVector(t, v, version, legacy)
						if ct != v.WantContentType {
							t.Errorf("Content-Type %q, HAMi %q", ct, v.WantContentType)
						}
						if diff := gocmp.Diff(lines, familyLines(got, "hami_node_gpu_mig_instance_info", "nodeGPUMigInstance")); diff != "" {
							t.Errorf("MIG instance lines (-HAMi +got):\n%s", diff)
						}
						if diff := gocmp.Diff(strings.Split(want, "\n"), strings.Split(got, "\n")); diff != "" {
							t.Errorf("exposition (-HAMi +got):\n%s", diff)
						}
					})
				})
			}
		}
		t.Logf("checked %d vectors from %s (mig-instance-metrics.json, current and legacy names)", len(f.Vectors), folder.Dir)
	}
}

func scrapeMIGVector(t *testing.T, v migMetricsVector, version allocation.Version, legacy bool) (string, string) {
	t.Helper()
	var objs []runtime.Object
	for _, n := range v.Input.Nodes {
		devs, err := annotation.Decode(n.Register)
		if err != nil {
			t.Fatalf("node %s: %v", n.Name, err)
		}
		node := gpuNode(n.Name, n.Register, 0)
		var count int64
		for _, d := range devs {
			count += int64(d.Count)
		}
		node.Status.Allocatable[annotation.ResourceNVIDIAGPU] = *resource.NewQuantity(count, resource.DecimalSI)
		objs = append(objs, node)
	}
	for _, p := range v.Input.Pods {
		p.Phase = cmp.Or(p.Phase, corev1.PodRunning) // HAMi's vectors: Running unless given
		objs = append(objs, p.pod(t))
	}
	reg := prometheus.NewRegistry()
	e := setupWithNodes(t, Options{Config: allocation.Config{Version: version}, Registerer: reg, LegacyMetrics: legacy,
		BuildInfo: normalisedBuildInfo}, objs...)
	e.run()
	return scrape(t, hamiOnly(reg))
}
