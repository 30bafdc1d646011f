package diagnose_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	restclient "k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/diagnose"
)

// mUUID is the GPU of rtRunning's allocation; mOther a GPU the pod does not use.
const (
	mUUID  = "GPU-00000000-1111-2222-3333-444455556666"
	mOther = "GPU-00000001-1111-2222-3333-444455556666"
)

// mScrape is a node monitor's answer: rtRunning's container cuda on mUUID with usage 1 GiB of
// a 3000 MiB limit, another pod, and the opt-in families.
const mScrape = `# HELP hami_vgpu_memory_used_bytes vGPU device memory usage in bytes
# TYPE hami_vgpu_memory_used_bytes gauge
hami_vgpu_memory_used_bytes{container="cuda",device_uuid="` + mUUID + `",namespace="team-a",pod="cuda-job",vdevice_index="0",zone="vGPU"} 1.073741824e+09
hami_vgpu_memory_used_bytes{container="main",device_uuid="` + mUUID + `",namespace="team-b",pod="other",vdevice_index="0",zone="vGPU"} 5.24288e+08
# HELP hami_vgpu_memory_limit_bytes vGPU device memory limit in bytes
# TYPE hami_vgpu_memory_limit_bytes gauge
hami_vgpu_memory_limit_bytes{container="cuda",device_uuid="` + mUUID + `",namespace="team-a",pod="cuda-job",vdevice_index="0",zone="vGPU"} 3.145728e+09
hami_vgpu_memory_limit_bytes{container="main",device_uuid="` + mUUID + `",namespace="team-b",pod="other",vdevice_index="0",zone="vGPU"} 1.048576e+09
# HELP hami_container_device_utilization_ratio Container device SM utilization ratio
# TYPE hami_container_device_utilization_ratio gauge
hami_container_device_utilization_ratio{container="cuda",device_uuid="` + mUUID + `",namespace="team-a",pod="cuda-job",vdevice_index="0",zone="vGPU"} 37
# HELP hami_container_last_kernel_elapsed_seconds Seconds since last kernel execution in container
# TYPE hami_container_last_kernel_elapsed_seconds gauge
hami_container_last_kernel_elapsed_seconds{container="cuda",device_uuid="` + mUUID + `",namespace="team-a",pod="cuda-job",vdevice_index="0",zone="vGPU"} 2
# TYPE hamireg_monitor_process_memory_bytes gauge
hamireg_monitor_process_memory_bytes{container="cuda",device_uuid="` + mUUID + `",hostpid="4242",namespace="team-a",pod="cuda-job",source="hami-core",vdevice_index="0",zone="vGPU"} 1.073741824e+09
hamireg_monitor_process_memory_bytes{container="cuda",device_uuid="` + mUUID + `",hostpid="4242",namespace="team-a",pod="cuda-job",source="nvml",vdevice_index="0",zone="vGPU"} 1.073741824e+09
# TYPE hamireg_monitor_process_memory_drift_ratio gauge
hamireg_monitor_process_memory_drift_ratio{container="cuda",device_uuid="` + mUUID + `",hostpid="4242",namespace="team-a",pod="cuda-job",vdevice_index="0",zone="vGPU"} 0
# TYPE hamireg_monitor_unaccounted_process_memory_bytes gauge
hamireg_monitor_unaccounted_process_memory_bytes{container="",device_index="3",device_uuid="` + mOther + `",namespace="",pid="777",pod="",zone="vGPU"} 1e+08
`

// scrapeEvidence is rtEvidence of rtRunning("gpu-1") with the monitor answering text.
func scrapeEvidence(t *testing.T, text string) diagnose.PodEvidence {
	t.Helper()
	ev := rtEvidence(rtRunning("gpu-1"))
	m, err := diagnose.ParseMonitorScrape(strings.NewReader(text), ev.Pod)
	if err != nil {
		t.Fatalf("ParseMonitorScrape: %v", err)
	}
	m.Node, m.PluginPod, m.Port = "gpu-1", "kube-system/hami-device-plugin-gpu-1", 9394
	ev.Monitor = m
	return ev
}

func TestParseMonitorScrapeKeepsThePod(t *testing.T) {
	t.Parallel()
	pod := rtRunning("gpu-1")
	m, err := diagnose.ParseMonitorScrape(strings.NewReader(mScrape), pod)
	if err != nil {
		t.Fatal(err)
	}
	if m.OtherContainers != 1 {
		t.Errorf("OtherContainers %d, want 1", m.OtherContainers)
	}
	if !m.Serves(diagnose.FamilyMonitorDrift) || m.Serves(diagnose.FamilyMonitorStaleSlot) {
		t.Errorf("families %v", m.Families)
	}
	// 4 HAMi series, 2 process, 1 drift; the unaccounted process is on a GPU the pod lacks.
	if len(m.Series) != 7 {
		t.Fatalf("%d series, want 7: %+v", len(m.Series), m.Series)
	}
	for _, s := range m.Series {
		if s.Labels["pod"] != "cuda-job" || s.Labels["namespace"] != "team-a" {
			t.Errorf("series of another pod kept: %+v", s)
		}
		if _, ok := s.Labels["zone"]; ok {
			t.Errorf("zone kept: %+v", s)
		}
	}
	// On one of the pod's GPUs, the unaccounted process is kept, whoever it belongs to.
	onMine := strings.ReplaceAll(mScrape, `device_uuid="`+mOther+`"`, `device_uuid="`+mUUID+`"`)
	m, err = diagnose.ParseMonitorScrape(strings.NewReader(onMine), pod)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Series) != 8 || m.Series[len(m.Series)-1].Name != diagnose.FamilyMonitorUnaccounted {
		t.Errorf("unaccounted process on the pod's GPU not kept: %+v", m.Series)
	}
}

func TestParseMonitorScrapeLegacy(t *testing.T) {
	t.Parallel()
	legacy := `# TYPE vGPU_device_memory_usage_in_bytes gauge
vGPU_device_memory_usage_in_bytes{ctrname="cuda",deviceuuid="` + mUUID + `",podname="cuda-job",podnamespace="team-a",vdeviceid="0",zone="vGPU"} 2.097152e+06
# TYPE vGPU_device_memory_limit_in_bytes gauge
vGPU_device_memory_limit_in_bytes{ctrname="cuda",deviceuuid="` + mUUID + `",podname="cuda-job",podnamespace="team-a",vdeviceid="0",zone="vGPU"} 4.194304e+06
# TYPE Device_utilization_desc_of_container gauge
Device_utilization_desc_of_container{ctrname="cuda",deviceuuid="` + mUUID + `",podname="cuda-job",podnamespace="team-a",vdeviceid="0",zone="vGPU"} NaN
`
	pod := rtRunning("gpu-1")
	m, err := diagnose.ParseMonitorScrape(strings.NewReader(legacy), pod)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{diagnose.FamilyMemoryUsed: 2 << 20, diagnose.FamilyMemoryLimit: 4 << 20}
	if len(m.Series) != len(want) { // the NaN utilisation is dropped
		t.Fatalf("series %+v, want %v", m.Series, want)
	}
	for _, s := range m.Series {
		if want[s.Name] != s.Value || s.Labels["container"] != "cuda" || s.Labels["vdevice_index"] != "0" || s.Labels["device_uuid"] != mUUID {
			t.Errorf("series %+v", s)
		}
	}
	// With the new families present too, the legacy ones are not read twice.
	m, err = diagnose.ParseMonitorScrape(strings.NewReader(mScrape+legacy), pod)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range m.Series {
		if s.Name == diagnose.FamilyMemoryUsed {
			n++
			if s.Value != 1<<30 {
				t.Errorf("used %v, want the new family's 1 GiB", s.Value)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d used series, want 1", n)
	}
}

func TestParseMonitorScrapeGarbage(t *testing.T) {
	t.Parallel()
	for _, text := range []string{"hami_vgpu_memory_used_bytes{", "<html>502 Bad Gateway</html>", "# TYPE x gauge\n# TYPE x counter\n"} {
		if _, err := diagnose.ParseMonitorScrape(strings.NewReader(text), rtRunning("gpu-1")); !errors.Is(err, diagnose.ErrMonitor) {
			t.Errorf("%q: err %v, want ErrMonitor", text, err)
		}
	}
	if _, err := diagnose.ParseMonitorScrape(strings.NewReader(""), nil); !errors.Is(err, diagnose.ErrInvalidOptions) {
		t.Errorf("nil pod: %v", err)
	}
}

// mSeries renders one series line.
func mSeries(name, labels string, v string) string {
	return name + "{" + labels + `,zone="vGPU"} ` + v + "\n"
}

const mPodLabels = `container="cuda",device_uuid="` + mUUID + `",namespace="team-a",pod="cuda-job",vdevice_index="0"`

func TestAnalyzePodUsage(t *testing.T) {
	t.Parallel()
	usage := func(used, limit string) string {
		return mSeries(diagnose.FamilyMemoryUsed, mPodLabels, used) + mSeries(diagnose.FamilyMemoryLimit, mPodLabels, limit)
	}
	proc := func(hami, nvml string) string {
		l := mPodLabels + `,hostpid="4242"`
		return mSeries(diagnose.FamilyMonitorProcessMemory, l+`,source="hami-core"`, hami) + mSeries(diagnose.FamilyMonitorProcessMemory, l+`,source="nvml"`, nvml)
	}
	other := mSeries(diagnose.FamilyMemoryUsed, `container="main",device_uuid="`+mOther+`",namespace="team-b",pod="other",vdevice_index="0"`, "1")
	tests := map[string]struct {
		text     string
		code     string
		severity diagnose.Severity
		wantCase diagnose.Case
		summary  string
		absent   []string
	}{
		"within the limit": {
			text: mScrape, wantCase: diagnose.Healthy,
			absent: []string{diagnose.CodeUsageOverLimit, diagnose.CodeAccountingDrift, diagnose.CodeProcessWithoutSlot, diagnose.CodeUsageNotReported},
		},
		"over the limit": {
			text: usage("4e9", "3.145728e+09"), code: diagnose.CodeUsageOverLimit, severity: diagnose.SeverityError,
			wantCase: diagnose.P8RunningWithoutLimits, summary: "uses 3814 MiB of GPU " + mUUID + ", above its limit of 3000 MiB",
		},
		"no limit is never over": {
			text: usage("4e9", "0"), wantCase: diagnose.Healthy, absent: []string{diagnose.CodeUsageOverLimit},
		},
		"drift under": {
			text: usage("1e9", "3.145728e+09") + proc("1.048576e+09", "2.097152e+09"), code: diagnose.CodeAccountingDrift,
			severity: diagnose.SeverityWarning, wantCase: diagnose.Healthy,
			summary: "container cuda, host PID 4242 on GPU " + mUUID + " (vdevice 0): HAMi-core counts 1000 MiB, NVML 2000 MiB (drift -50 %)",
		},
		"drift over, from the ratio": {
			text: usage("1e9", "3.145728e+09") + mSeries(diagnose.FamilyMonitorDrift, mPodLabels+`,hostpid="9"`, "0.25"),
			code: diagnose.CodeAccountingDrift, severity: diagnose.SeverityWarning, wantCase: diagnose.Healthy,
			summary: "host PID 9 on GPU " + mUUID + " (vdevice 0): drift +25 %: HAMi-core counts more",
		},
		"drift within 10 %": {
			text: usage("1e9", "3.145728e+09") + proc("1.1e9", "1e9"), wantCase: diagnose.Healthy, absent: []string{diagnose.CodeAccountingDrift},
		},
		"own process without a slot": {
			text: usage("1e9", "3.145728e+09") + mSeries(diagnose.FamilyMonitorUnaccounted, `container="cuda",device_index="0",device_uuid="`+mUUID+`",namespace="team-a",pid="31337",pod="cuda-job"`, "2.097152e+09"),
			code: diagnose.CodeProcessWithoutSlot, severity: diagnose.SeverityError, wantCase: diagnose.P8RunningWithoutLimits,
			summary: "container cuda runs host PID 31337 on GPU " + mUUID + " with 2000 MiB and no HAMi-core slot",
		},
		"unknown process without a slot on the pod's GPU": {
			text: usage("1e9", "3.145728e+09") + mSeries(diagnose.FamilyMonitorUnaccounted, `container="",device_index="0",device_uuid="`+mUUID+`",namespace="",pid="55",pod=""`, "1.048576e+08"),
			code: diagnose.CodeProcessWithoutSlot, severity: diagnose.SeverityWarning, wantCase: diagnose.Healthy,
			summary: "runs host PID 55 of an unknown container with 100 MiB",
		},
		"stale slot": {
			text: usage("1e9", "3.145728e+09") + mSeries(diagnose.FamilyMonitorStaleSlot, mPodLabels+`,hostpid="12"`, "5.24288e+08"),
			code: diagnose.CodeStaleSlot, severity: diagnose.SeverityWarning, wantCase: diagnose.Healthy,
			summary: "keeps a HAMi-core slot of host PID 12 on GPU " + mUUID + " (vdevice 0) with 500 MiB",
		},
		"blocked": {
			text: usage("1e9", "3.145728e+09") + mSeries(diagnose.FamilyMonitorBlocked, `container="cuda",namespace="team-a",pod="cuda-job"`, "1"),
			code: diagnose.CodeBlockedByPriority, severity: diagnose.SeverityInfo, wantCase: diagnose.Healthy, summary: "container cuda is blocked by the priority loop",
		},
		"not blocked": {
			text:     usage("1e9", "3.145728e+09") + mSeries(diagnose.FamilyMonitorBlocked, `container="cuda",namespace="team-a",pod="cuda-job"`, "0"),
			wantCase: diagnose.Healthy, absent: []string{diagnose.CodeBlockedByPriority},
		},
		"priority mismatch": {
			text: usage("1e9", "3.145728e+09") + mSeries(diagnose.FamilyMonitorPriorityMismatch, `container="cuda",namespace="team-a",pod="cuda-job",region="0",spec="1"`, "1"),
			code: diagnose.CodePriorityMismatch, severity: diagnose.SeverityWarning, wantCase: diagnose.Healthy, summary: "region says priority 0 but the pod spec says 1",
		},
		"no series, others reported": {
			text: other, code: diagnose.CodeUsageNotReported, severity: diagnose.SeverityInfo, wantCase: diagnose.Healthy,
			summary: "no GPU usage of pod team-a/cuda-job container cuda: it has no HAMi-core region yet",
		},
		"no series at all": {
			text: "", code: diagnose.CodeUsageNotReported, severity: diagnose.SeverityWarning, wantCase: diagnose.Healthy,
			summary: "reports no GPU usage at all",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r, err := diagnose.AnalyzePod(scrapeEvidence(t, tc.text), diagnose.Options{Clock: testingclock.NewFakePassiveClock(now)})
			if err != nil {
				t.Fatal(err)
			}
			if r.Case != tc.wantCase {
				t.Errorf("case %v, want %v: %+v", r.Case, tc.wantCase, r.Findings)
			}
			if r.Usage == nil {
				t.Fatal("no usage in the report")
			}
			for _, c := range tc.absent {
				if f, ok := r.Finding(c); ok {
					t.Errorf("unexpected %s: %s", c, f.Summary)
				}
			}
			if tc.code == "" {
				return
			}
			f, ok := r.Finding(tc.code)
			if !ok {
				t.Fatalf("no %s in %+v", tc.code, r.Findings)
			}
			if f.Severity != tc.severity || !strings.Contains(f.Summary, tc.summary) || len(f.Evidence) == 0 {
				t.Errorf("%s: %s %q, want %s containing %q (evidence %q)", tc.code, f.Severity, f.Summary, tc.severity, tc.summary, f.Evidence)
			}
			if f.Severity == diagnose.SeverityError && len(f.Fix) == 0 {
				t.Errorf("error finding without a fix: %+v", f)
			}
		})
	}
}

// The usage table: one row per allocated GPU with the monitor's values, the processes with
// their drift computed from the two counts.
func TestAnalyzePodUsageTable(t *testing.T) {
	t.Parallel()
	r, err := diagnose.AnalyzePod(scrapeEvidence(t, mScrape), diagnose.Options{Clock: testingclock.NewFakePassiveClock(now)})
	if err != nil {
		t.Fatal(err)
	}
	u := r.Usage
	if u == nil || len(u.GPUs) != 1 || len(u.Processes) != 1 || !u.OptIn {
		t.Fatalf("usage %+v", u)
	}
	g := u.GPUs[0]
	if !g.Reported || g.Container != "cuda" || g.Index != "0" || g.UUID != mUUID || g.UsedMiB() != 1024 || g.LimitMiB() != 3000 ||
		g.AllocatedMiB != 3000 || g.UsedPercent == nil || *g.UsedPercent < 34.13 || *g.UsedPercent > 34.14 || g.SMPercent == nil || *g.SMPercent != 37 {
		t.Errorf("row %+v", g)
	}
	p := u.Processes[0]
	if p.HostPID != "4242" || p.Drift == nil || *p.Drift != 0 || p.HAMiCoreBytes == nil || *p.HAMiCoreBytes != 1<<30 {
		t.Errorf("process %+v", p)
	}
	// The report travels as JSON (a bundle, -o json) and back.
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back diagnose.PodReport
	if err := json.Unmarshal(b, &back); err != nil || back.Usage == nil || back.Usage.GPUs[0].UsedBytes != 1<<30 {
		t.Errorf("JSON round trip: %v %+v", err, back.Usage)
	}
	// An allocated GPU the monitor does not report is a row too.
	ev := scrapeEvidence(t, mScrape)
	ev.Pod.Annotations["hami.io/vgpu-devices-allocated"] = mUUID + ",NVIDIA,3000,0:" + mOther + ",NVIDIA,3000,0:;"
	r, err = diagnose.AnalyzePod(ev, diagnose.Options{Clock: testingclock.NewFakePassiveClock(now)})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Usage.GPUs) != 2 || r.Usage.GPUs[1].UUID != mOther || r.Usage.GPUs[1].Reported {
		t.Errorf("rows %+v", r.Usage.GPUs)
	}
}

// proxyAnswer is what the fake pod proxy answers.
type proxyAnswer struct {
	body string
	err  error
}

func (p proxyAnswer) DoRaw(context.Context) ([]byte, error) { return []byte(p.body), p.err }
func (p proxyAnswer) Stream(context.Context) (io.ReadCloser, error) {
	if p.err != nil {
		return nil, p.err
	}
	return io.NopCloser(strings.NewReader(p.body)), nil
}

// Through Pod, the monitor is read through the pod proxy on the plugin Pod's port named
// metrics; failures are NotChecked findings that name the fix.
func TestPodReadsMonitor(t *testing.T) {
	t.Parallel()
	plugin := runningPod("gpu-1")
	plugin.Spec.Containers = append(plugin.Spec.Containers, corev1.Container{Name: "monitor",
		Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9400}}})
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "pods/proxy"}, plugin.Name, errors.New("no RBAC policy matched"))
	tests := map[string]struct {
		answer   proxyAnswer
		plugin   bool
		port     int32
		wantPort string
		code     string
		evidence string
		fix      string
	}{
		"read":           {answer: proxyAnswer{body: mScrape}, plugin: true, wantPort: "9400"},
		"port override":  {answer: proxyAnswer{body: mScrape}, plugin: true, port: 9394, wantPort: "9394"},
		"forbidden":      {answer: proxyAnswer{err: forbidden}, plugin: true, wantPort: "9400", code: diagnose.CodePodNotChecked, evidence: "forbidden", fix: "kubectl auth can-i get pods/proxy -n kube-system"},
		"unparsable":     {answer: proxyAnswer{body: "<html>"}, plugin: true, wantPort: "9400", code: diagnose.CodePodNotChecked, evidence: "parse node monitor metrics", fix: "kubectl get --raw /api/v1/namespaces/kube-system/pods/http:hami-device-plugin-gpu-1:9400/proxy/metrics"},
		"no plugin pod":  {answer: proxyAnswer{body: mScrape}, code: diagnose.CodePodNotChecked, evidence: "no Running device plugin Pod", fix: "kubectl hami-doctor node gpu-1"},
		"disabled":       {answer: proxyAnswer{body: mScrape}, plugin: true, port: -1},
		"timeout answer": {answer: proxyAnswer{err: context.DeadlineExceeded}, plugin: true, wantPort: "9400", code: diagnose.CodePodNotChecked, evidence: "deadline", fix: "did not answer within 5s"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pod := rtRunning("gpu-1")
			objs := append(healthyObjects("gpu-1"), pod, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rtNS}})
			if tc.plugin {
				objs = replace(objs, plugin.DeepCopy())
			} else {
				objs = without(objs, func(o runtime.Object) bool { p, ok := o.(*corev1.Pod); return ok && p.Name == plugin.Name })
			}
			c := fakeClient(true, objs...)
			var got []k8stesting.ProxyGetAction
			c.PrependProxyReactor("pods", func(a k8stesting.Action) (bool, restclient.ResponseWrapper, error) {
				got = append(got, a.(k8stesting.ProxyGetAction))
				return true, tc.answer, nil
			})
			r, err := diagnose.Pod(t.Context(), c, rtNS, rtPod, diagnose.Options{Clock: testingclock.NewFakePassiveClock(now), MonitorPort: tc.port})
			if err != nil {
				t.Fatal(err)
			}
			if tc.port < 0 {
				if r.Usage != nil || len(got) != 0 {
					t.Errorf("monitor read although disabled: %+v %v", r.Usage, got)
				}
				return
			}
			if tc.wantPort != "" {
				if len(got) != 1 || got[0].GetName() != plugin.Name || got[0].GetNamespace() != "kube-system" || got[0].GetPort() != tc.wantPort || got[0].GetPath() != "/metrics" || got[0].GetScheme() != "http" {
					t.Fatalf("proxy calls %+v, want one GET http %s:%s/metrics", got, plugin.Name, tc.wantPort)
				}
			}
			if r.Usage == nil {
				t.Fatalf("no usage: %+v", r.Findings)
			}
			if tc.code == "" {
				if r.Usage.Error != "" || len(r.Usage.GPUs) != 1 || r.Usage.GPUs[0].UsedMiB() != 1024 {
					t.Errorf("usage %+v", r.Usage)
				}
				return
			}
			var f diagnose.Finding
			for _, x := range r.Findings {
				if x.Code == tc.code && strings.Contains(x.Summary, "node monitor") {
					f = x
				}
			}
			if f.Code == "" || !strings.Contains(strings.Join(f.Evidence, "\n"), tc.evidence) || !strings.Contains(strings.Join(f.Fix, "\n"), tc.fix) {
				t.Errorf("finding %+v, want %s with evidence %q and fix %q", f, tc.code, tc.evidence, tc.fix)
			}
		})
	}
}

// A bundle about a Running GPU pod stores the monitor's scrape; analysed again from the
// bundle, it gives the same usage as the live diagnosis.
func TestWriteBundleStoresMonitor(t *testing.T) {
	t.Parallel()
	pod := rtRunning("gpu-1")
	objs := append(healthyObjects("gpu-1"), pod)
	for _, answer := range []proxyAnswer{{body: mScrape}, {err: apierrors.NewForbidden(schema.GroupResource{Resource: "pods/proxy"}, "hami-device-plugin-gpu-1", errors.New("denied"))}} {
		c := fakeClient(true, objs...)
		c.PrependProxyReactor("pods", func(k8stesting.Action) (bool, restclient.ResponseWrapper, error) { return true, answer, nil })
		var buf bytes.Buffer
		idx, err := diagnose.WriteBundle(t.Context(), c, diagnose.BundleTarget{Namespace: rtNS, Pod: rtPod}, &buf, diagnose.BundleOptions{Options: opts(), LogLines: -1})
		if err != nil {
			t.Fatal(err)
		}
		files, _ := readBundle(t, buf.Bytes(), idx.Root)
		data, ok := files["monitor/team-a/cuda-job.json"]
		if !ok {
			t.Fatalf("no monitor file in %v (missing %q)", idx.Files, idx.Missing)
		}
		var m diagnose.MonitorScrape
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatal(err)
		}
		ev := rtEvidence(pod)
		ev.Monitor = &m
		r, err := diagnose.AnalyzePod(ev, opts())
		if err != nil {
			t.Fatal(err)
		}
		if answer.err != nil {
			if m.Error == "" || !slices.ContainsFunc(idx.Missing, func(s string) bool { return strings.Contains(s, "grant get pods/proxy") }) {
				t.Errorf("forbidden read: scrape %+v, missing %q", m, idx.Missing)
			}
			if _, ok := r.Finding(diagnose.CodePodNotChecked); !ok {
				t.Errorf("no NotChecked finding from the recorded failure: %+v", r.Findings)
			}
			continue
		}
		if m.Endpoint != "/api/v1/namespaces/kube-system/pods/http:hami-device-plugin-gpu-1:9394/proxy/metrics" || len(m.Series) != 7 {
			t.Errorf("scrape %+v", m)
		}
		if r.Usage == nil || len(r.Usage.GPUs) != 1 || r.Usage.GPUs[0].UsedMiB() != 1024 || len(r.Usage.Processes) != 1 {
			t.Errorf("usage from the bundle %+v", r.Usage)
		}
	}
}

func TestMonitorOptions(t *testing.T) {
	t.Parallel()
	_, err := diagnose.AnalyzePod(rtEvidence(rtRunning("gpu-1")), diagnose.Options{MonitorPort: 70000})
	if !errors.Is(err, diagnose.ErrInvalidOptions) || !strings.Contains(err.Error(), "MonitorPort 70000") {
		t.Errorf("MonitorPort 70000: %v", err)
	}
}

// An init container with GPUs is never reported by the monitor (HAMi's reports the spec's
// containers only): no GPUUsageNotReported for it.
func TestUsageIgnoresInitContainers(t *testing.T) {
	t.Parallel()
	ev := scrapeEvidence(t, mScrape)
	init := ev.Pod.Spec.Containers[0]
	init.Name = "warmup"
	ev.Pod.Spec.InitContainers = []corev1.Container{init}
	r, err := diagnose.AnalyzePod(ev, opts())
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := r.Finding(diagnose.CodeUsageNotReported); ok {
		t.Errorf("unexpected %s: %s", f.Code, f.Summary)
	}
	ev.Pod.Spec.InitContainers = nil
	ev.Pod.Spec.Containers = append(ev.Pod.Spec.Containers, init)
	r, err = diagnose.AnalyzePod(ev, opts())
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := r.Finding(diagnose.CodeUsageNotReported); !ok || !strings.Contains(f.Summary, "container warmup") || f.Severity != diagnose.SeverityInfo {
		t.Errorf("regular container without series: %+v", f)
	}
}
