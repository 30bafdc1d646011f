package monitor

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/hamicore/region"
	"github.com/hamireg/hamireg/internal/vectors"
	"github.com/hamireg/hamireg/mig"
)

// metricsVector is one vector of monitor-metrics.json.
type metricsVector struct {
	Name  string `json:"name"`
	Input struct {
		NodeName   string `json:"node_name"`
		Containers []struct {
			Dir     string                `json:"dir"`
			Region  *vectors.RegionFields `json:"region"`
			Bytes   *vectors.FileBytes    `json:"bytes"`
			Entries []vectors.FolderEntry `json:"entries"`
		} `json:"containers"`
		Pods []vectorPod `json:"pods"`
		NVML struct {
			InitReturn  string      `json:"init_return"`
			CountReturn string      `json:"count_return"`
			Devices     []vectorGPU `json:"devices"`
		} `json:"nvml"`
	} `json:"input"`
	WantAdopted     []string `json:"want_adopted"`
	WantContentType string   `json:"want_content_type"`
	WantText        *string  `json:"want_text"`
	WantTextLegacy  *string  `json:"want_text_legacy"`
	WantPanic       any      `json:"want_panic"`
	WantPanicLegacy any      `json:"want_panic_legacy"`
}

type vectorPod struct {
	Name           string            `json:"name"`
	Namespace      string            `json:"namespace"`
	UID            types.UID         `json:"uid"`
	NodeName       string            `json:"node_name"`
	Labels         map[string]string `json:"labels"`
	Annotations    map[string]string `json:"annotations"`
	InitContainers []string          `json:"init_containers"`
	Containers     []string          `json:"containers"`
}

type vectorGPU struct {
	UUID         string `json:"uuid"`
	Name         string `json:"name"`
	MemoryUsed   uint64 `json:"memory_used"`
	MemoryTotal  uint64 `json:"memory_total"`
	MemoryReturn string `json:"memory_return"`
	UtilGPU      uint32 `json:"util_gpu"`
	UtilMemory   uint32 `json:"util_memory"`
	UtilReturn   string `json:"util_return"`
}

// fakeHost is a Host answering gpus (or err).
type fakeHost struct {
	gpus []HostGPU
	err  error
}

func (h *fakeHost) GPUs(ctx context.Context) ([]HostGPU, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return h.gpus, h.err
}

// nvmlError is the error a Host gives for an NVML return code: ErrNotSupported for
// ERROR_NOT_SUPPORTED.
func nvmlError(ret string) error {
	switch ret {
	case "", "SUCCESS":
		return nil
	case "ERROR_NOT_SUPPORTED":
		return fmt.Errorf("nvml: %w", ErrNotSupported)
	}
	return errors.New("nvml: " + ret)
}

func (v *metricsVector) host() *fakeHost {
	h := &fakeHost{}
	if err := errors.Join(nvmlError(v.Input.NVML.InitReturn), nvmlError(v.Input.NVML.CountReturn)); err != nil {
		h.err = err
		return h
	}
	for i, g := range v.Input.NVML.Devices {
		h.gpus = append(h.gpus, HostGPU{Index: i, UUID: g.UUID, Name: g.Name, MemoryUsed: g.MemoryUsed, MemoryTotal: g.MemoryTotal,
			MemoryErr: nvmlError(g.MemoryReturn), UtilGPU: g.UtilGPU, UtilMemory: g.UtilMemory, UtilErr: nvmlError(g.UtilReturn)})
	}
	return h
}

// nodePods are the pods of the vector's node (what the node-scoped informer lists).
func (v *metricsVector) nodePods() []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range v.Input.Pods {
		if p.NodeName != "" && p.NodeName != v.Input.NodeName {
			continue
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, Labels: p.Labels, Annotations: p.Annotations},
			Spec: corev1.PodSpec{NodeName: p.NodeName}}
		for _, n := range p.InitContainers {
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, corev1.Container{Name: n})
		}
		for _, n := range p.Containers {
			pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: n})
		}
		out = append(out, pod)
	}
	return out
}

// modelContainer is one container of the vector as the folder scan gives it, with the SDK's
// region fields.
type modelContainer struct {
	c      Container
	fields *vectors.RegionFields
	pod    *corev1.Pod
}

// containers writes each container's folder under dir and reads it as the folder scan does:
// folders of pods on the node only, the first "*.cache" entry (or the vector's bytes).
func (v *metricsVector) containers(t *testing.T, dir string, pods []*corev1.Pod) []modelContainer {
	t.Helper()
	var out []modelContainer
	for _, in := range v.Input.Containers {
		uid, name, ok := strings.Cut(in.Dir, "_")
		if !ok || uid == "" || name == "" {
			continue
		}
		i := slices.IndexFunc(pods, func(p *corev1.Pod) bool { return string(p.UID) == uid })
		if i < 0 {
			continue
		}
		folder := filepath.Join(dir, in.Dir)
		if err := os.MkdirAll(folder, 0o755); err != nil {
			t.Fatal(err)
		}
		path, fields := "", in.Region
		if in.Bytes != nil {
			b, err := in.Bytes.Bytes()
			if err != nil {
				t.Fatal(err)
			}
			path = filepath.Join(folder, "region.cache")
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		names := []string{}
		for _, e := range in.Entries {
			b, err := e.Content()
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(folder, e.Name), b, 0o600); err != nil {
				t.Fatal(err)
			}
			if strings.HasSuffix(e.Name, ".cache") {
				names = append(names, e.Name)
			}
		}
		if path == "" && len(names) > 0 {
			slices.Sort(names)
			path = filepath.Join(folder, names[0])
			for _, e := range in.Entries {
				if e.Name == names[0] {
					fields = e.Region
				}
			}
		}
		if path == "" {
			continue
		}
		pod := pods[i]
		c := Container{Key: in.Dir, Path: path, Pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, PodUID: pod.UID, Name: name,
			Init: slices.ContainsFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == name })}
		c.Region, c.Err = region.ReadFile(path)
		out = append(out, modelContainer{c: c, fields: fields, pod: pod})
	}
	return out
}

// scrapeText serves m's metrics (with the given containers) once through promhttp and returns
// the body and its Content-Type.
func scrapeText(t *testing.T, m *Monitor, cs []Container) (string, string) {
	t.Helper()
	reg := prometheus.NewRegistry()
	c := newCollector(m, func(context.Context) []Container { return cs })
	c.recovered = func(r any) { t.Errorf("Collect panicked: %v", r) }
	if err := m.register(reg, c); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: status %d: %s", rec.Code, rec.Body)
	}
	return rec.Body.String(), rec.Header().Get("Content-Type")
}

var (
	buildInfoLine = regexp.MustCompile(`(?m)^hami_build_info\{.*\} 1$`)
	elapsedSample = regexp.MustCompile(`\{unix_now-(\d+)\}`)
)

const normalisedBuildInfo = `hami_build_info{build_date="{build_date}",compiler="{compiler}",go_version="{go_version}",platform="{platform}",revision="{revision}",version="{version}"} 1`

// fmtValue formats a sample value as the text exposition does.
func fmtValue(v float64) string {
	switch v {
	case 0:
		return "0"
	case 1:
		return "1"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// testNow is the conformance tests' clock.
var testNow = time.Unix(1790000000, 0)

func TestConformanceMetrics(t *testing.T) {
	for _, folder := range vectors.Folders(t) {
		var f struct {
			Vectors []metricsVector `json:"vectors"`
		}
		if !folder.Read(t, "monitor-metrics.json", &f) {
			continue
		}
		version := vectors.Pick(folder, annotation.VersionMaster, annotation.VersionV290)
		checked := 0
		for _, v := range f.Vectors {
			for _, legacy := range []bool{false, true} {
				name := folder.Name() + "/" + v.Name
				want, panicked := v.WantText, v.WantPanic != nil
				if legacy {
					name += "/legacy"
					want, panicked = v.WantTextLegacy, v.WantPanicLegacy != nil
				}
				t.Run(name, func(t *testing.T) {
					if want == nil && !panicked {
						t.Fatal("vector has neither a text nor a panic")
					}
					checkMetricsVector(t, &v, version, legacy, want, panicked)
				})
				checked++
			}
		}
		t.Logf("checked %d vectors from %s (monitor-metrics.json, plain and legacy)", checked, folder.Dir)
	}
}

func checkMetricsVector(t *testing.T, v *metricsVector, version annotation.Version, legacy bool, want *string, panicked bool) {
	t.Helper()
	pods := v.nodePods()
	mcs := v.containers(t, t.TempDir(), pods)
	cs := make([]Container, len(mcs))
	for i := range mcs {
		cs[i] = mcs[i].c
	}
	m, err := New(PodsFunc(func() ([]*corev1.Pod, error) { return pods, nil }), Options{
		NodeName: v.Input.NodeName, Version: version, LegacyMetrics: legacy, Host: v.host(), Clock: clocktesting.NewFakeClock(testNow)})
	if err != nil {
		t.Fatal(err)
	}
	m.bindScrapeContext(t.Context()) // as Run does: scrapes query the host
	text, ctype := scrapeText(t, m, cs)
	if ctype != v.WantContentType {
		t.Errorf("Content-Type %q, want %q", ctype, v.WantContentType)
	}
	got := dropFamilies(buildInfoLine.ReplaceAllString(text, normalisedBuildInfo), "hamireg_")

	// The containers whose series the SDK's rules give differently from HAMi's: their series
	// are checked against the rule, every other byte against HAMi's text.
	differ := map[ctrKey]bool{}
	var model []string
	for i := range mcs {
		mc := &mcs[i]
		k := ctrKey{mc.pod.Namespace, mc.pod.Name, mc.c.Name}
		if why := sdkRuleDiffers(v, mc, version, panicked); why != "" {
			t.Logf("%s/%s/%s: the SDK's rule applies (%s)", k.ns, k.pod, k.ctr, why)
			differ[k] = true
		}
	}
	for _, p := range pods {
		for _, c := range allContainers(p) {
			k := ctrKey{p.Namespace, p.Name, c}
			if !hamiSelects(v, p, c) || panicked {
				differ[k] = true
			}
		}
	}
	for i := range mcs {
		if k := (ctrKey{mcs[i].pod.Namespace, mcs[i].pod.Name, mcs[i].c.Name}); differ[k] {
			model = append(model, modelRegionLines(t, &mcs[i], version, legacy)...)
		}
	}
	if version == annotation.VersionMaster {
		for _, p := range pods {
			model = append(model, modelMIGLines(p, legacy, differ)...)
		}
	}
	slices.Sort(model)
	if gotLines := ownedLines(got, differ); !slices.Equal(gotLines, model) {
		t.Errorf("series of the containers under the SDK's rules:\n got %q\nwant %q", gotLines, model)
	}

	if panicked {
		// HAMi has no text here: the rest is the host families and hami_build_info.
		hostModel := append(modelHostLines(v, version, legacy), normalisedBuildInfo)
		slices.Sort(hostModel)
		if gotLines := unownedLines(got); !slices.Equal(gotLines, hostModel) {
			t.Errorf("host series:\n got %q\nwant %q", gotLines, hostModel)
		}
		return
	}
	w := elapsedSample.ReplaceAllStringFunc(*want, func(s string) string {
		T, err := strconv.ParseUint(elapsedSample.FindStringSubmatch(s)[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return fmtValue(elapsed(testNow, T))
	})
	if g, w := dropOwned(got, differ), dropOwned(w, differ); g != w {
		t.Errorf("exposition differs from HAMi's (SDK-only families and the containers above left out):\n got:\n%s\nwant:\n%s", g, w)
	}
	// The host model agrees with HAMi where HAMi has a text.
	for _, l := range modelHostLines(v, version, legacy) {
		if !strings.Contains(w, l+"\n") {
			t.Errorf("host model line %q not in HAMi's text", l)
		}
	}
}

type ctrKey struct{ ns, pod, ctr string }

func allContainers(p *corev1.Pod) []string {
	var out []string
	for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		out = append(out, c.Name)
	}
	return out
}

// hamiSelects is HAMi v2.10.0's and v2.9.0's container selection: pods labelled
// hami.io/vgpu-node=<node>, their Spec.Containers. The SDK reports every container.
func hamiSelects(v *metricsVector, p *corev1.Pod, ctr string) bool {
	return p.Labels["hami.io/vgpu-node"] == v.Input.NodeName &&
		slices.ContainsFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == ctr })
}

// sdkRuleDiffers names the SDK rule by which the container's series differ from HAMi's, ""
// when none does.
func sdkRuleDiffers(v *metricsVector, mc *modelContainer, version annotation.Version, panicked bool) string {
	f := mc.fields
	switch {
	case panicked:
		return "HAMi panics; the SDK never does"
	case !slices.Contains(v.WantAdopted, mc.c.Key) && mc.c.Region != nil:
		return "the SDK reads a region HAMi does not load"
	case slices.Contains(v.WantAdopted, mc.c.Key) && mc.c.Region == nil:
		return "HAMi loads a region the SDK refuses: " + fmt.Sprint(mc.c.Err)
	case f == nil:
		return ""
	case f.Layout == "v1.1-seqlock-first":
		return "the SDK decodes the seqlock-first layout HAMi misreads"
	case version != annotation.VersionV290:
		return ""
	case f.ProcNum < 0 || f.ProcNum > region.MaxSlots || f.Num > region.MaxDevices:
		return "v2.9.0 does not clamp proc_num or num"
	}
	n := min(f.Num, region.MaxDevices)
	for i := range int(n) {
		if i >= len(f.UUIDs) || f.UUIDs[i] == "" {
			return "v2.9.0 serves an unwritten UUID as 40 NUL bytes"
		}
	}
	for _, p := range f.Procs {
		if (p.Status == 0 || p.Slot >= int(f.ProcNum)) && slices.ContainsFunc(p.Devices, func(d vectors.ProcDevice) bool {
			return d.Context|d.Module|d.Data|d.Total|d.SMUtil != 0
		}) {
			return "v2.9.0 sums exited slots (and, for v0, slots beyond proc_num)"
		}
	}
	return ""
}

// modelRegionLines are the SDK's series of one container by its rule, from the vector's
// region fields: devices below min(num, 16) with a written UUID whose 40-byte cut is UTF-8,
// sums over the live slots below clamp(proc_num, 0, 1024).
func modelRegionLines(t *testing.T, mc *modelContainer, version annotation.Version, legacy bool) []string {
	t.Helper()
	f := mc.fields
	if mc.c.Region == nil || f == nil {
		return nil
	}
	var out []string
	live := max(0, min(int(f.ProcNum), region.MaxSlots))
	for i := range int(min(f.Num, region.MaxDevices)) {
		if i >= len(f.UUIDs) || f.UUIDs[i] == "" {
			continue
		}
		raw := make([]byte, region.UUIDSize)
		copy(raw, f.UUIDs[i])
		uuid := string(raw[:40])
		if !utf8.ValidString(uuid) {
			continue
		}
		var ctx, mod, data, total, sm uint64
		for _, p := range f.Procs {
			if p.Status == 0 || p.Slot >= live || (f.Layout == "v1.2" && p.Seq%2 == 1) {
				continue
			}
			for _, d := range p.Devices {
				if d.Dev == i {
					ctx, mod, data, total, sm = ctx+d.Context, mod+d.Module, data+d.Data, total+d.Total, sm+d.SMUtil
				}
			}
		}
		limit := uint64(0)
		if i < len(f.Limits) {
			limit = f.Limits[i]
		}
		offset := total - ctx - mod - data
		ls := map[string]string{"namespace": mc.c.Pod.Namespace, "pod": mc.c.Pod.Name, "container": mc.c.Name, "vdevice_index": strconv.Itoa(i), "device_uuid": uuid, "zone": "vGPU"}
		breakdown := map[string]string{"context_size": u64(ctx), "module_size": u64(mod), "buffer_size": u64(data), "offset": u64(offset)}
		out = append(out,
			series("hami_vgpu_memory_used_bytes", ls, nil, float64(total)),
			series("hami_vgpu_memory_limit_bytes", ls, nil, float64(limit)),
			series("hami_container_device_utilization_ratio", ls, nil, float64(sm)),
			series("hami_vgpu_memory_context_bytes", ls, nil, float64(ctx)),
			series("hami_vgpu_memory_module_bytes", ls, nil, float64(mod)),
			series("hami_vgpu_memory_buffer_bytes", ls, nil, float64(data)))
		if version == annotation.VersionMaster {
			out = append(out, series("hami_container_device_memory_bytes", ls, nil, float64(total)))
		} else {
			out = append(out, series("hami_container_device_memory_bytes", ls, breakdown, float64(total)))
		}
		lkt := f.LastKernelTime
		if f.Layout == "v0" {
			lkt = 0
		}
		if lkt > 0 {
			out = append(out, series("hami_container_last_kernel_elapsed_seconds", ls, nil, elapsed(testNow, lkt)))
		}
		if legacy {
			ll := map[string]string{"podnamespace": ls["namespace"], "podname": ls["pod"], "ctrname": ls["container"], "vdeviceid": ls["vdevice_index"], "deviceuuid": uuid, "zone": "vGPU"}
			out = append(out,
				series("vGPU_device_memory_usage_in_bytes", ll, nil, float64(total)),
				series("vGPU_device_memory_limit_in_bytes", ll, nil, float64(limit)),
				series("Device_memory_desc_of_container", ll, map[string]string{"context": u64(ctx), "module": u64(mod), "data": u64(data), "offset": u64(offset)}, float64(total)),
				series("Device_utilization_desc_of_container", ll, nil, float64(sm)))
			if lkt > 0 {
				out = append(out, series("Device_last_kernel_of_container", ll, nil, elapsed(testNow, lkt)))
			}
		}
	}
	return out
}

// modelMIGLines are the SDK's hami_mig_device_info (and MigInfo) series of the containers of
// p in differ: every realised allocation, containerIndex counting init containers first.
func modelMIGLines(p *corev1.Pod, legacy bool, differ map[ctrKey]bool) []string {
	allocs, err := mig.DecodeAllocations(p.Annotations[mig.KeyAllocations])
	if err != nil {
		return nil
	}
	names := allContainers(p)
	var out []string
	for _, a := range allocs {
		if a.Runtime == nil || a.ContainerIndex >= len(names) || !differ[ctrKey{p.Namespace, p.Name, names[a.ContainerIndex]}] {
			continue
		}
		ls := map[string]string{"namespace": p.Namespace, "pod": p.Name, "container": names[a.ContainerIndex], "vdevice_index": strconv.Itoa(a.DeviceIndex),
			"device_uuid": a.GPUUUID, "zone": "vGPU"}
		out = append(out, series("hami_mig_device_info", ls, map[string]string{"mig_uuid": a.Runtime.MigUUID, "profile": a.Profile,
			"gpu_instance_id": strconv.Itoa(int(a.Runtime.GPUInstanceID)), "compute_instance_id": strconv.Itoa(int(a.Runtime.ComputeInstanceID))}, 1))
		if legacy {
			ll := map[string]string{"podnamespace": p.Namespace, "podname": p.Name, "ctrname": names[a.ContainerIndex], "vdeviceid": strconv.Itoa(a.DeviceIndex), "deviceuuid": a.GPUUUID, "zone": "vGPU"}
			out = append(out, series("MigInfo", ll, map[string]string{"instanceid": strconv.Itoa(int(a.Runtime.GPUInstanceID))}, 1))
		}
	}
	return out
}

// modelHostLines are the host series by HAMi's rules.
func modelHostLines(v *metricsVector, version annotation.Version, legacy bool) []string {
	h := v.host()
	if h.err != nil {
		return nil
	}
	var out []string
	for _, g := range h.gpus {
		ls := map[string]string{"device_index": strconv.Itoa(g.Index), "device_uuid": g.UUID, "device_type": "NVIDIA-" + g.Name, "zone": "vGPU"}
		ll := map[string]string{"deviceidx": ls["device_index"], "deviceuuid": g.UUID, "devicetype": ls["device_type"], "zone": "vGPU"}
		node, lnode := map[string]string{}, map[string]string{}
		if version == annotation.VersionMaster {
			node, lnode = map[string]string{"node": v.Input.NodeName}, map[string]string{"nodeid": v.Input.NodeName}
		}
		if g.MemoryErr != nil && !errors.Is(g.MemoryErr, ErrNotSupported) {
			continue
		}
		if g.MemoryErr == nil {
			out = append(out, series("hami_host_gpu_memory_used_bytes", ls, node, float64(g.MemoryUsed)))
			if legacy {
				out = append(out, series("HostGPUMemoryUsage", ll, lnode, float64(g.MemoryUsed)))
			}
		}
		if g.UtilErr != nil {
			continue
		}
		out = append(out, series("hami_host_gpu_utilization_ratio", ls, node, float64(g.UtilGPU)))
		if legacy {
			out = append(out, series("HostCoreUtilization", ll, lnode, float64(g.UtilGPU)))
		}
		if version == annotation.VersionMaster {
			out = append(out, series("hami_host_gpu_memory_controller_utilization_ratio", ls, nil, float64(g.UtilMemory)))
		}
	}
	return out
}

// series formats one sample line as the text exposition does: labels sorted by name.
func series(name string, labels, more map[string]string, v float64) string {
	all := map[string]string{}
	for k, x := range labels {
		all[k] = x
	}
	for k, x := range more {
		all[k] = x
	}
	keys := make([]string, 0, len(all))
	for k := range all {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString(name + "{")
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + `="` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(all[k]) + `"`)
	}
	b.WriteString("} " + fmtValue(v))
	return b.String()
}

// labelsOf parses the labels of a sample line.
func labelsOf(line string) map[string]string {
	open := strings.IndexByte(line, '{')
	if open < 0 {
		return nil
	}
	out := map[string]string{}
	s := line[open+1:]
	for len(s) > 0 && s[0] != '}' {
		eq := strings.Index(s, `="`)
		if eq < 0 {
			return out
		}
		name := strings.TrimPrefix(s[:eq], ",")
		s = s[eq+2:]
		var val strings.Builder
		for len(s) > 0 && s[0] != '"' {
			if s[0] == '\\' && len(s) > 1 {
				switch s[1] {
				case 'n':
					val.WriteByte('\n')
				default:
					val.WriteByte(s[1])
				}
				s = s[2:]
				continue
			}
			val.WriteByte(s[0])
			s = s[1:]
		}
		out[name] = val.String()
		s = strings.TrimPrefix(s, `"`)
		s = strings.TrimPrefix(s, ",")
	}
	return out
}

// ownerOf is the container a sample line belongs to (current or legacy label names).
func ownerOf(line string) (ctrKey, bool) {
	ls := labelsOf(line)
	if c, ok := ls["container"]; ok {
		return ctrKey{ls["namespace"], ls["pod"], c}, true
	}
	if c, ok := ls["ctrname"]; ok {
		return ctrKey{ls["podnamespace"], ls["podname"], c}, true
	}
	return ctrKey{}, false
}

func sampleLines(text string) []string {
	var out []string
	for l := range strings.Lines(text) {
		if l = strings.TrimSuffix(l, "\n"); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// ownedLines are the sorted sample lines of the containers in differ.
func ownedLines(text string, differ map[ctrKey]bool) []string {
	var out []string
	for _, l := range sampleLines(text) {
		if k, ok := ownerOf(l); ok && differ[k] {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return out
}

// unownedLines are the sorted sample lines of no container.
func unownedLines(text string) []string {
	var out []string
	for _, l := range sampleLines(text) {
		if _, ok := ownerOf(l); !ok {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return out
}

// dropOwned removes the sample lines of the containers in differ, and the HELP and TYPE
// lines of families left without samples.
func dropOwned(text string, differ map[ctrKey]bool) string {
	return filterFamilies(text, func(family, line string) bool {
		k, ok := ownerOf(line)
		return !ok || !differ[k]
	})
}

// dropFamilies removes the families whose names start with prefix.
func dropFamilies(text, prefix string) string {
	return filterFamilies(text, func(family, _ string) bool { return !strings.HasPrefix(family, prefix) })
}

// filterFamilies keeps the sample lines keep accepts, and a family's HELP and TYPE lines when
// any of its samples is kept.
func filterFamilies(text string, keep func(family, line string) bool) string {
	var out, header strings.Builder
	family, kept := "", false
	for l := range strings.Lines(text) {
		if strings.HasPrefix(l, "# HELP ") {
			family = strings.Fields(l)[2]
			header.Reset()
			kept = false
		}
		if strings.HasPrefix(l, "#") {
			header.WriteString(l)
			continue
		}
		if strings.TrimSpace(l) == "" {
			out.WriteString(l)
			continue
		}
		if !keep(family, strings.TrimSuffix(l, "\n")) {
			continue
		}
		if !kept {
			out.WriteString(header.String())
			kept = true
		}
		out.WriteString(l)
	}
	return out.String()
}
