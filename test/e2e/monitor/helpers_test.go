package monitor_test

import (
	"context"
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

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/hamicore/region"
	"github.com/hamireg/hamireg/monitor/monitortest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// The families of HAMi v2.10.0's monitor per container device (spec/hami-monitor.md §5.1),
// whose value the test computes; last kernel elapsed is checked for presence only.
const (
	famUsed       = "hami_vgpu_memory_used_bytes"
	famLimit      = "hami_vgpu_memory_limit_bytes"
	famDevMem     = "hami_container_device_memory_bytes"
	famUtil       = "hami_container_device_utilization_ratio"
	famContext    = "hami_vgpu_memory_context_bytes"
	famModule     = "hami_vgpu_memory_module_bytes"
	famBuffer     = "hami_vgpu_memory_buffer_bytes"
	famLastKernel = "hami_container_last_kernel_elapsed_seconds"
	famRegions    = "hamireg_monitor_regions"
)

// containerFamilies are the families with an exact expected value per container device.
var containerFamilies = []string{famUsed, famLimit, famDevMem, famUtil, famContext, famModule, famBuffer}

// hostFamilies are the host families of v2.10.0 (one series per GPU).
var hostFamilies = []string{"hami_host_gpu_memory_used_bytes", "hami_host_gpu_utilization_ratio", "hami_host_gpu_memory_controller_utilization_ratio"}

// node is a GPU node whose plugin runs the monitor on hook/vgpu and serves /metrics at url.
type node struct {
	*harness.GPUNode
	hook, root, url string
}

// startNode starts a GPU node with the monitor on: --prepare-state-dir, a temporary
// --hook-path, a 200 ms round and /metrics on a port picked free.
func startNode(t *testing.T) *node {
	t.Helper()
	if errPluginBuild != nil {
		t.Fatal(errPluginBuild)
	}
	hook := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	g := cp.StartGPUNode(t, harness.GPUNodeOptions{Bin: pluginBin, Args: []string{
		"--prepare-state-dir=true", "--hook-path=" + hook, "--monitor-period=200ms", "--metrics-bind-address=" + addr,
	}})
	return &node{GPUNode: g, hook: hook, root: filepath.Join(hook, "vgpu"), url: "http://" + addr + "/metrics"}
}

// ctrRegion is what a test wrote for one container: its pod and the region's GPUs.
type ctrRegion struct {
	pod  *corev1.Pod
	name string
	gpus []monitortest.GPU
}

// folder is the container's folder under the monitor's root.
func (c *ctrRegion) folder(root string) string {
	return filepath.Join(root, "containers", string(c.pod.UID)+"_"+c.name)
}

// write writes the container's region as HAMi-core does, with a kernel 3 s ago.
func (c *ctrRegion) write(t *testing.T, root string) string {
	t.Helper()
	r := monitortest.Region(4242, c.gpus...)
	r.LastKernelTime = uint64(time.Now().Add(-3 * time.Second).Unix())
	path, err := monitortest.WriteContainer(root, c.pod.UID, c.name, "0f7e6d5c", r)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// schedule creates, schedules (devices: one entry per container, init containers first) and
// admits a pod through the kubelet's device manager, checks that Allocate made each GPU
// container's folder, and returns a ctrRegion per GPU container whose region uses the
// container's shares: limit the share's MiB, used (limit * usedPct / 100) and SM smUtil.
func (n *node) schedule(t *testing.T, name string, ctrs []harness.Ctr, devices allocation.PodDevices, usedPct uint64, smUtil uint64) []*ctrRegion {
	t.Helper()
	pod := n.CreatePod(t, name, ctrs...)
	pod = n.Schedule(t, pod, devices)
	if _, err := n.Admit(harness.Context(t), pod); err != nil {
		t.Fatalf("admit pod %s: %v", name, err)
	}
	// The allocation annotation holds one entry per container, init containers first.
	var order []string
	for _, c := range pod.Spec.InitContainers {
		order = append(order, c.Name)
	}
	for _, c := range pod.Spec.Containers {
		order = append(order, c.Name)
	}
	var out []*ctrRegion
	for i, ctr := range order {
		if i >= len(devices) || len(devices[i]) == 0 {
			continue
		}
		c := &ctrRegion{pod: pod, name: ctr}
		for _, d := range devices[i] {
			limit := uint64(d.Usedmem) << 20
			c.gpus = append(c.gpus, monitortest.GPU{UUID: d.UUID, Limit: limit, Used: limit * usedPct / 100, SMUtil: smUtil})
		}
		if st, err := os.Stat(c.folder(n.root)); err != nil || !st.IsDir() {
			t.Fatalf("Allocate made no folder for container %s of pod %s: %v", ctr, name, err)
		}
		out = append(out, c)
	}
	return out
}

// uuidLabel is HAMi's device_uuid: the first 40 bytes of the 96-byte UUID field.
func uuidLabel(uuid string) string {
	b := make([]byte, region.UUIDSize)
	copy(b, uuid)
	return string(b[:40])
}

// series is a family's series by their labels (name=value, sorted, comma-joined).
type series map[string]float64

// key returns the series key of labels.
func key(labels map[string]string) string {
	out := make([]string, 0, len(labels))
	for k, v := range labels {
		out = append(out, k+"="+strconv.Quote(v))
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

// ctrLabels are the 5 labels of HAMi's container families, and zone.
func ctrLabels(c *ctrRegion, i int) map[string]string {
	return map[string]string{"namespace": c.pod.Namespace, "pod": c.pod.Name, "container": c.name,
		"vdevice_index": strconv.Itoa(i), "device_uuid": uuidLabel(c.gpus[i].UUID), "zone": "vGPU"}
}

// expected computes the container families HAMi's rule gives for the regions of cs
// (monitortest.Region: one slot, context min(used, 300 MiB), the rest data, no module).
func expected(cs []*ctrRegion) map[string]series {
	want := map[string]series{}
	for _, f := range containerFamilies {
		want[f] = series{}
	}
	for _, c := range cs {
		for i, g := range c.gpus {
			k := key(ctrLabels(c, i))
			ctx := min(g.Used, 300<<20)
			want[famUsed][k] = float64(g.Used)
			want[famLimit][k] = float64(g.Limit)
			want[famDevMem][k] = float64(g.Used)
			want[famUtil][k] = float64(g.SMUtil)
			want[famContext][k] = float64(ctx)
			want[famModule][k] = 0
			want[famBuffer][k] = float64(g.Used - ctx)
		}
	}
	return want
}

// scrape GETs url; families is nil unless the answer is 200 and parses.
func scrape(ctx context.Context, url string) (int, map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil, fmt.Errorf("GET %s: %d: %s", url, resp.StatusCode, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("parse /metrics: %w", err)
	}
	return resp.StatusCode, fams, nil
}

// got returns the series of family name.
func got(fams map[string]*dto.MetricFamily, name string) series {
	out := series{}
	for _, m := range fams[name].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		out[key(labels)] = m.GetGauge().GetValue()
	}
	return out
}

// regionStates returns hamireg_monitor_regions by state.
func regionStates(fams map[string]*dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	for _, m := range fams[famRegions].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "state" {
				out[l.GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// pollTimeout bounds a wait for /metrics to show a change: the next monitor round (200 ms)
// and a scrape, with room for a loaded CI machine.
const pollTimeout = 60 * time.Second

// poll calls check every 100 ms until it returns "" or pollTimeout passes, then fails t
// with check's last answer.
func poll(t *testing.T, what string, check func() string) {
	t.Helper()
	deadline := time.Now().Add(pollTimeout)
	for {
		msg := check()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s after %v: %s", what, pollTimeout, msg)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("%s: %v", what, t.Context().Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
