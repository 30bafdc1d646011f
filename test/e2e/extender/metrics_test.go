package extender_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// masterMetricsVectors reads HAMi master's metrics.json ($HAMIREG_VECTORS, else the
// repository's testdata): examples/extender follows master's rules by default.
func masterMetricsVectors(tb testing.TB) (contentType string, headers map[string][]string) {
	tb.Helper()
	root := os.Getenv("HAMIREG_VECTORS")
	if root == "" {
		root = "../../../testdata"
	}
	data, err := os.ReadFile(filepath.Join(root, "hami-master-4707fb0", "metrics.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var f struct {
		Vectors []struct {
			WantTextLegacy  string `json:"want_text_legacy"`
			WantContentType string `json:"want_content_type"`
		} `json:"vectors"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		tb.Fatal(err)
	}
	headers = map[string][]string{}
	for _, v := range f.Vectors {
		contentType = v.WantContentType
		for l := range strings.SplitSeq(v.WantTextLegacy, "\n") {
			if rest, ok := strings.CutPrefix(l, "# HELP "); ok {
				name, _, _ := strings.Cut(rest, " ")
				headers[name] = []string{l}
			} else if rest, ok := strings.CutPrefix(l, "# TYPE "); ok {
				name, _, _ := strings.Cut(rest, " ")
				headers[name] = append(headers[name], l)
			}
		}
	}
	tb.Logf("checked %d vectors from %s (metrics.json: content type, HELP and TYPE of every family)", len(f.Vectors), root)
	return contentType, headers
}

// TestExtenderMetrics scrapes a real examples/extender's /metrics (--metrics-bind-address,
// --legacy-metrics) after kube-scheduler placed a pod through it: HAMi's content type, HELP
// and TYPE of every family as HAMi's master serves them, the node's GPUs (only the test's node
// registers: --node-label-selector), the pod's GPU and container gauges with HAMi's labels and
// values under both names, and the SDK's own filter and bind histograms beside them.
func TestExtenderMetrics(t *testing.T) {
	t.Parallel()
	wantType, headers := masterMetricsVectors(t)
	addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	test := harness.UniqueName("metrics")
	s := newStack(t, stackOptions{args: []string{"--metrics-bind-address=" + addr, "--legacy-metrics",
		"--node-label-selector=" + harness.TestLabel + "=" + test}})
	node := test + "-a"
	devs := gpus(node, true)
	createGPUNode(t, test, node, nodeOptions{devices: devs, allocatable: -1})
	waitStamped(t, node)

	pod := s.gpuPod("train", test, map[string]int64{resGPU: 1, resMem: 3000, resCores: 30})
	createPods(t, []*corev1.Pod{pod})
	harness.Eventually(t, "pod train bound", 60*time.Second, func() bool {
		p, err := s.pods.Pods(s.ns).Get("train")
		return err == nil && p.Spec.NodeName != ""
	})
	p, _ := s.pods.Pods(s.ns).Get("train")
	pd, err := allocation.DecodePodDevices(p.Annotations[annotation.KeyNVIDIAAllocated], allocation.VersionMaster)
	if err != nil || len(pd) != 1 || len(pd[0]) != 1 {
		t.Fatalf("devices of train: %v %v", pd, err)
	}
	gpu := pd[0][0].UUID
	idx := slices.IndexFunc(devs, func(d annotation.Device) bool { return d.ID == gpu })
	if idx < 0 {
		t.Fatalf("train on GPU %s, not one of %s's", gpu, node)
	}
	d := devs[idx]
	dev := fmt.Sprintf(`device_index="%d",device_type="%s",device_uuid="%s",node="%s",zone="vGPU"`, d.Index, d.Type, gpu, node)
	legacyDev := fmt.Sprintf(`deviceidx="%d",devicetype="%s",deviceuuid="%s",nodeid="%s",zone="vGPU"`, d.Index, d.Type, gpu, node)
	ctr := fmt.Sprintf(`container_index="0",device_uuid="%s",namespace="%s",node="%s",pod="train",zone="vGPU"`, gpu, s.ns, node)
	legacyCtr := fmt.Sprintf(`containeridx="0",deviceuuid="%s",nodename="%s",podname="train",podnamespace="%s",zone="vGPU"`, gpu, node, s.ns)
	mem := strconv.FormatFloat(3000*(1<<20), 'g', -1, 64)
	wantLines := []string{
		`hami_gpu_memory_allocated_bytes{device_cores="100",` + dev + `} ` + mem,
		`GPUDeviceMemoryAllocated{devicecores="100",` + legacyDev + `} ` + mem,
		`hami_gpu_shared_count{` + dev + `} 1`,
		`hami_gpu_core_allocated_ratio{` + dev + `} 30`,
		`hami_gpu_memory_limit_bytes{` + dev + `} ` + strconv.FormatFloat(float64(d.Devmem)*(1<<20), 'g', -1, 64),
		`hami_node_gpu_overview{device_cores="100",` + strings.Replace(dev, `device_type=`, fmt.Sprintf(`device_memory_limit="%d",device_type=`, d.Devmem), 1) + `} ` + mem,
		`hami_node_gpu_memory_allocated_ratio{` + dev + `} ` + strconv.FormatFloat(3000.0/float64(d.Devmem), 'g', -1, 64),
		`hami_vgpu_memory_allocated_bytes{` + ctr + `} ` + mem,
		`hami_vgpu_core_allocated_ratio{` + ctr + `} 30`,
		`vGPUMemoryAllocated{` + legacyCtr + `} ` + mem,
		`vGPUCoreAllocated{` + legacyCtr + `} 30`,
		`hamireg_extender_bind_duration_seconds_count{result="ok"} 1`,
	}
	var body, contentType string
	harness.Eventually(t, "/metrics shows the pod", 30*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		body, contentType = string(b), resp.Header.Get("Content-Type")
		return strings.Contains(body, wantLines[len(wantLines)-1])
	})
	if contentType != wantType {
		t.Errorf("Content-Type %q, HAMi %q", contentType, wantType)
	}
	lines := strings.Split(body, "\n")
	for _, w := range wantLines {
		if !slices.Contains(lines, w) {
			t.Errorf("/metrics has no line %s", w)
		}
	}
	limits := 0
	seen := map[string][]string{}
	for _, l := range lines {
		if strings.HasPrefix(l, "hami_gpu_memory_limit_bytes{") {
			limits++
		}
		for _, prefix := range []string{"# HELP ", "# TYPE "} {
			if rest, ok := strings.CutPrefix(l, prefix); ok {
				name, _, _ := strings.Cut(rest, " ")
				seen[name] = append(seen[name], l)
			}
		}
	}
	if limits != len(devs) {
		t.Errorf("%d GPUs in hami_gpu_memory_limit_bytes, want the test node's %d", limits, len(devs))
	}
	for name, want := range headers {
		if strings.HasPrefix(name, "hami_resource_quota") || name == "QuotaUsed" {
			continue // the quota families come with the ResourceQuota state (extender.QuotaUsage)
		}
		if !slices.Equal(seen[name], want) {
			t.Errorf("family %s: %q, HAMi %q", name, seen[name], want)
		}
	}
	if !strings.Contains(body, `hamireg_extender_filter_duration_seconds_count{result="placed"}`) {
		t.Errorf("no filter histogram in /metrics")
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}
