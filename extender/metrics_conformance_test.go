package extender

import (
	"cmp"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/internal/vectors"
)

type metricsFile struct {
	Vectors []metricsVector `json:"vectors"`
}

type metricsVector struct {
	Name  string `json:"name"`
	Input struct {
		Nodes []struct {
			Name    string              `json:"name"`
			Devices []annotation.Device `json:"devices"`
		} `json:"nodes"`
		Pods    []vectorPod `json:"pods"`
		Quotas  []quotaSpec `json:"quotas"`
		Filters []struct {
			Pod       vectorPod `json:"pod"`
			NodeNames []string  `json:"node_names"`
		} `json:"filters"`
	} `json:"input"`
	WantFilterResults []struct {
		Pod       string   `json:"pod"`
		NodeNames []string `json:"node_names"`
	} `json:"want_filter_results"`
	WantText        string `json:"want_text"`
	WantTextLegacy  string `json:"want_text_legacy"`
	WantContentType string `json:"want_content_type"`
}

// normalisedBuildInfo gives hami_build_info the placeholders the vectors normalised it to.
var normalisedBuildInfo = BuildInfo{Version: "{version}", Revision: "{revision}", BuildDate: "{build_date}",
	GoVersion: "{go_version}", Compiler: "{compiler}", Platform: "{platform}"}

// hamiOnly gathers g without the SDK's own families (hamireg_*): HAMi's exposition alone.
func hamiOnly(g prometheus.Gatherer) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		mfs, err := g.Gather()
		return slices.DeleteFunc(mfs, func(mf *dto.MetricFamily) bool { return strings.HasPrefix(mf.GetName(), MetricsPrefix) }), err
	})
}

// scrape serves g as HAMi does (promhttp.HandlerFor with zero HandlerOpts) and returns the
// body and the content type.
func scrape(t *testing.T, g prometheus.Gatherer) (body, contentType string) {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(g, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String(), rec.Header().Get("Content-Type")
}

// TestConformanceMetrics builds the extender's state from each metrics.json vector (nodes,
// pods, the filters through Filter), scrapes HAMi's families through promhttp with HAMi's
// handler options and compares with HAMi's exposition byte for byte, with and without legacy
// names, and the content type. Two rules apply before comparing:
//
//   - The node gauges show the true state: each registered GPU's gauges are what the counted
//     pods hold of it, a filtered pod on its chosen node at once and nowhere else (HAMi v2.9.0
//     shows a filter's trial allocation on every candidate; master shows the node gauges up
//     to 15 s late). HAMi's node gauges are rewritten to the pods' usage (the vector's pods,
//     and each filtered pod on the node HAMi chose, with the devices the extender patched);
//     for a vector without filters the rule must change nothing (HAMi is right there).
//   - The quota families come from the ResourceQuota state (QuotaUsage); until it is wired
//     they are left out of the comparison.
func TestConformanceMetrics(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		var f metricsFile
		if !folder.Read(t, "metrics.json", &f) {
			continue
		}
		version := vectors.Pick(folder, allocation.VersionMaster, allocation.VersionV290)
		for _, v := range f.Vectors {
			for _, legacy := range []bool{false, true} {
				want := v.WantText
				if legacy {
					want = v.WantTextLegacy
				}
				t.Run(folder.Name()+"/"+v.Name+"/legacy="+strconv.FormatBool(legacy), func(t *testing.T) {
					t.Parallel()
					synctest.Test(t, func(t *testing.T) {
						checkMetricsVector(t, v, version, legacy, want)
					})
				})
			}
		}
		t.Logf("checked %d vectors from %s (metrics.json, current and legacy names)", len(f.Vectors), folder.Dir)
	}
}

func checkMetricsVector(t *testing.T, v metricsVector, version allocation.Version, legacy bool, want string) {
	t.Helper()
	in := v.Input
	var objs []runtime.Object
	devmem := map[string]int32{} // GPU → Devmem
	for _, n := range in.Nodes {
		register := ""
		if len(n.Devices) > 0 {
			register = annotation.Encode(n.Devices)
		}
		node := gpuNode(n.Name, register, 0)
		var count int64
		for _, d := range n.Devices {
			count += int64(d.Count)
			devmem[d.ID] = d.Devmem
		}
		node.Status.Allocatable[annotation.ResourceNVIDIAGPU] = *resource.NewQuantity(count, resource.DecimalSI)
		objs = append(objs, node)
	}
	var pods []*corev1.Pod
	for _, p := range in.Pods {
		p.Phase = cmp.Or(p.Phase, corev1.PodRunning) // HAMi's vectors: Running unless given
		pods = append(pods, p.pod(t))
		objs = append(objs, pods[len(pods)-1])
	}
	for _, q := range in.Quotas {
		objs = append(objs, q.object())
	}
	var filtered []*corev1.Pod
	for _, fl := range in.Filters {
		p := fl.Pod.pod(t)
		filtered = append(filtered, p)
		objs = append(objs, p)
	}
	reg := prometheus.NewRegistry()
	e := setupWithNodes(t, Options{Config: allocation.Config{Version: version}, Registerer: reg, LegacyMetrics: legacy,
		BuildInfo: normalisedBuildInfo}, objs...)
	e.run()
	for i, fl := range in.Filters {
		res := e.filter(filtered[i], fl.NodeNames...)
		var got []string
		if res.NodeNames != nil {
			got = *res.NodeNames
		}
		if w := v.WantFilterResults[i]; w.Pod != podKey(filtered[i].Namespace, filtered[i].Name) || !slices.Equal(got, w.NodeNames) {
			t.Fatalf("filter %s: %v (%s), HAMi %s: %v", podKey(filtered[i].Namespace, filtered[i].Name), got, res.Error, w.Pod, w.NodeNames)
		}
	}
	synctest.Wait() // the informer delivers the patched pods
	// The pods and what they hold, as the extender wrote them.
	var placed []*corev1.Pod
	for _, p := range pods {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			placed = append(placed, p)
		}
	}
	for _, p := range filtered {
		placed = append(placed, e.pod2(p.Namespace, p.Name))
	}
	usage := podsUsage(t, placed, version)

	ruled, changed := trueNodeGauges(t, want, version, usage, devmem)
	if len(in.Filters) == 0 && changed != 0 {
		t.Errorf("HAMi's node gauges differ from its pods' usage in %d series without a filter: the rule does not explain it", changed)
	}
	if changed != 0 {
		t.Logf("rule: %d node gauge series rewritten to the pods' usage (filtered pods on the chosen node only, at once)", changed)
	}
	got, ct := scrape(t, hamiOnly(reg))
	if ct != v.WantContentType {
		t.Errorf("Content-Type %q, HAMi %q", ct, v.WantContentType)
	}
	if diff := gocmp.Diff(strings.Split(ruled, "\n"), strings.Split(got, "\n")); diff != "" {
		t.Errorf("exposition (-HAMi after the rules +got):\n%s", diff)
	}
}

// pod2 returns a pod as the API has it, in any namespace.
func (e *env) pod2(namespace, name string) *corev1.Pod {
	e.t.Helper()
	p, err := e.client.CoreV1().Pods(namespace).Get(e.ctx, name, metaGet)
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// podsUsage sums what pods hold per GPU, from their hami.io/vgpu-devices-allocated, each pod
// counted by the version's default accounting (allocation.PodUsage: an init container's share
// collapses with the app containers' on a GPU they share).
func podsUsage(t *testing.T, pods []*corev1.Pod, version allocation.Version) map[string]allocation.Usage {
	t.Helper()
	out := map[string]allocation.Usage{}
	for _, p := range pods {
		pd, ok, err := allocation.Allocated(p, annotation.NVIDIA(), version)
		if err != nil || !ok {
			t.Fatalf("pod %s: devices %v %v", p.Name, ok, err)
		}
		for gpu, u := range allocation.PodUsage(pd, p, allocation.Config{Version: version}) {
			out[gpu] = out[gpu].Add(u)
		}
	}
	return out
}

// series is one line of an exposition: name{labels} value.
type series struct {
	name   string
	labels [][2]string // in the order written (sorted by name)
	value  string
}

func parseSeries(line string) (series, bool) {
	open, closing := strings.IndexByte(line, '{'), strings.LastIndexByte(line, '}')
	if strings.HasPrefix(line, "#") || open < 0 || closing < open {
		return series{}, false
	}
	s := series{name: line[:open], value: strings.TrimPrefix(line[closing+1:], " ")}
	for pair := range strings.SplitSeq(line[open+1:closing], `",`) {
		k, val, _ := strings.Cut(pair, `="`)
		s.labels = append(s.labels, [2]string{k, strings.TrimSuffix(val, `"`)})
	}
	return s, true
}

func (s series) String() string {
	parts := make([]string, len(s.labels))
	for i, l := range s.labels {
		parts[i] = l[0] + `="` + l[1] + `"`
	}
	return s.name + "{" + strings.Join(parts, ",") + "} " + s.value
}

func (s series) label(names ...string) string {
	for _, l := range s.labels {
		if slices.Contains(names, l[0]) {
			return l[1]
		}
	}
	return ""
}

func (s *series) setLabel(value string, names ...string) {
	for i := range s.labels {
		if slices.Contains(names, s.labels[i][0]) {
			s.labels[i][1] = value
		}
	}
}

func formatValue(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// trueNodeGauges rewrites the node gauges of an exposition to usage (GPU → what the pods hold):
// values, and in v2.9.0 the labels that carry usage (device_cores = used cores,
// shared_containers); then it sorts each family's series again as Gather does. It returns the
// text and the number of series it changed.
func trueNodeGauges(t *testing.T, text string, version allocation.Version, usage map[string]allocation.Usage, devmem map[string]int32) (string, int) {
	t.Helper()
	type rewrite func(s *series, u allocation.Usage, mem int32)
	mem := func(s *series, u allocation.Usage, _ int32) { s.value = formatValue(float64(u.Usedmem) * (1 << 20)) }
	cores := func(s *series, u allocation.Usage, _ int32) {
		if version == allocation.VersionV290 {
			s.setLabel(strconv.FormatInt(u.Usedcores, 10), "device_cores", "devicecores")
		}
	}
	shared := func(s *series, u allocation.Usage, _ int32) {
		s.setLabel(strconv.FormatInt(u.Used, 10), "shared_containers", "sharedcontainers")
	}
	rules := map[string][]rewrite{
		"hami_gpu_memory_allocated_bytes": {mem, cores}, "GPUDeviceMemoryAllocated": {mem, cores},
		"hami_gpu_shared_count":         {func(s *series, u allocation.Usage, _ int32) { s.value = formatValue(float64(u.Used)) }},
		"hami_gpu_core_allocated_ratio": {func(s *series, u allocation.Usage, _ int32) { s.value = formatValue(float64(u.Usedcores)) }},
		"hami_node_gpu_overview":        {mem, cores, shared}, "nodeGPUOverview": {mem, cores, shared},
		"hami_node_gpu_memory_allocated_ratio": {func(s *series, u allocation.Usage, m int32) {
			s.value = formatValue(float64(u.Usedmem) / float64(m))
		}},
	}
	rules["GPUDeviceSharedNum"] = rules["hami_gpu_shared_count"]
	rules["GPUDeviceCoreAllocated"] = rules["hami_gpu_core_allocated_ratio"]
	rules["nodeGPUMemoryPercentage"] = rules["hami_node_gpu_memory_allocated_ratio"]

	lines := strings.Split(text, "\n")
	changed := 0
	for start := 0; start < len(lines); {
		end := start
		for end < len(lines) && (end == start || !strings.HasPrefix(lines[end], "# HELP")) {
			end++
		}
		block := lines[start:end]
		var ss []series
		for _, l := range block {
			if s, ok := parseSeries(l); ok {
				ss = append(ss, s)
			}
		}
		if len(ss) > 0 && rules[ss[0].name] != nil {
			for i := range ss {
				gpu := ss[i].label("device_uuid", "deviceuuid")
				before := ss[i].String()
				for _, r := range rules[ss[i].name] {
					r(&ss[i], usage[gpu], devmem[gpu])
				}
				if ss[i].String() != before {
					changed++
				}
			}
			slices.SortStableFunc(ss, func(a, b series) int {
				for k := range a.labels {
					if c := strings.Compare(a.labels[k][1], b.labels[k][1]); c != 0 {
						return c
					}
				}
				return 0
			})
			header := 0
			for header < len(block) && strings.HasPrefix(block[header], "#") {
				header++
			}
			for i, s := range ss {
				block[header+i] = s.String()
			}
		}
		start = end
	}
	return strings.Join(lines, "\n"), changed
}
