package diagnose

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
)

// The node monitor's metric families a pod diagnosis reads: HAMi's vGPUmonitor and the SDK's
// device plugin serve the Family… ones (every series with zone="vGPU" and the labels
// namespace, pod, container, vdevice_index, device_uuid); the FamilyMonitor… ones are the
// SDK's opt-in families, present only where the operator enabled them.
const (
	// FamilyMemoryUsed is Σ HAMi-core's per-process total of a container on one GPU, bytes.
	FamilyMemoryUsed = "hami_vgpu_memory_used_bytes"
	// FamilyMemoryLimit is the container's limit on the GPU, bytes (0: none).
	FamilyMemoryLimit = "hami_vgpu_memory_limit_bytes"
	// FamilyUtilization is Σ SM utilisation of the container's processes, % (may exceed 100).
	FamilyUtilization = "hami_container_device_utilization_ratio"
	// FamilyLastKernel is the seconds since the container's last kernel on the GPU.
	FamilyLastKernel = "hami_container_last_kernel_elapsed_seconds"

	// FamilyLegacyMemoryUsed, FamilyLegacyMemoryLimit and FamilyLegacyUtilization are HAMi's
	// legacy names (labels podnamespace, podname, ctrname, vdeviceid, deviceuuid), read when
	// the new family is absent.
	FamilyLegacyMemoryUsed  = "vGPU_device_memory_usage_in_bytes"
	FamilyLegacyMemoryLimit = "vGPU_device_memory_limit_in_bytes"
	FamilyLegacyUtilization = "Device_utilization_desc_of_container"

	// FamilyMonitorProcessMemory is one process's memory on a GPU as HAMi-core
	// (source="hami-core") or NVML (source="nvml") counts it, with its hostpid.
	FamilyMonitorProcessMemory = "hamireg_monitor_process_memory_bytes"
	// FamilyMonitorDrift is (HAMi-core − NVML) / NVML for one process, signed.
	FamilyMonitorDrift = "hamireg_monitor_process_memory_drift_ratio"
	// FamilyMonitorUnaccounted is an NVML compute process on a GPU shared through HAMi-core
	// that has no slot in any region (labels device_index, device_uuid, pid, and namespace,
	// pod, container when known).
	FamilyMonitorUnaccounted = "hamireg_monitor_unaccounted_process_memory_bytes"
	// FamilyMonitorStaleSlot is a slot whose process NVML no longer lists, bytes.
	FamilyMonitorStaleSlot = "hamireg_monitor_stale_slot_memory_bytes"
	// FamilyMonitorBlocked is 1 while the priority loop blocks the container.
	FamilyMonitorBlocked = "hamireg_monitor_container_blocked"
	// FamilyMonitorPriorityMismatch is 1 when the region's priority (label region) is not
	// the pod spec's (label spec).
	FamilyMonitorPriorityMismatch = "hamireg_monitor_priority_mismatch"
)

// DefaultMonitorPort is the node monitor's port (HAMi's vGPUmonitor, the SDK's device plugin)
// when the device plugin Pod names no container port "metrics" or "monitor".
const DefaultMonitorPort = 9394

// MaxMonitorBytes caps what is read of one /metrics answer.
const MaxMonitorBytes = 32 << 20

// ErrMonitor classifies every failure to read a node monitor: no device plugin Pod on the
// node, the pods/proxy read refused or timed out, an answer that does not parse.
var ErrMonitor = errors.New("node monitor not readable")

// legacyFamilies maps each legacy family to the new one it stands for.
var legacyFamilies = map[string]string{
	FamilyLegacyMemoryUsed:  FamilyMemoryUsed,
	FamilyLegacyMemoryLimit: FamilyMemoryLimit,
	FamilyLegacyUtilization: FamilyUtilization,
}

// legacyLabels maps the legacy label names to the new ones.
var legacyLabels = map[string]string{
	"podnamespace": "namespace", "podname": "pod", "ctrname": "container", "vdeviceid": "vdevice_index", "deviceuuid": "device_uuid",
}

// podFamilies are the families whose series name a pod in namespace and pod.
var podFamilies = []string{
	FamilyMemoryUsed, FamilyMemoryLimit, FamilyUtilization, FamilyLastKernel,
	FamilyMonitorProcessMemory, FamilyMonitorDrift, FamilyMonitorStaleSlot, FamilyMonitorBlocked, FamilyMonitorPriorityMismatch,
}

// MonitorSeries is one series of the node monitor: its family, its labels (zone dropped)
// and its value.
type MonitorSeries struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
	Value  float64           `json:"value"`
}

// MonitorScrape is what the node monitor of the pod's node serves about the pod: the series
// naming the pod, and the unaccounted processes on the pod's GPUs. A pod diagnosis reads it
// for a Running GPU pod ([Pod]); a support bundle stores it; [ParseMonitorScrape] makes one
// from /metrics text.
type MonitorScrape struct {
	// Node is the pod's node.
	Node string `json:"node,omitempty"`
	// PluginPod is the device plugin Pod scraped ("namespace/name"), Port its port.
	PluginPod string `json:"pluginPod,omitempty"`
	Port      int32  `json:"port,omitempty"`
	// Endpoint is the API server path that was read (kubectl get --raw takes it).
	Endpoint string `json:"endpoint,omitempty"`
	// Error is the read failure in words, "" when the monitor was read; Err is the same
	// error (errors.Is ErrMonitor), not carried in JSON.
	Error string `json:"error,omitempty"`
	Err   error  `json:"-"`
	// Families are the names of every family the monitor serves (for every pod), sorted: they
	// tell a monitor without the opt-in families from one that found nothing wrong.
	Families []string `json:"families,omitempty"`
	// OtherContainers counts the containers of other pods the monitor reports memory for: a
	// monitor that reports others but not this pod sees no HAMi-core region of it.
	OtherContainers int `json:"otherContainers"`
	// Series are the pod's series (legacy names and labels read as the new ones), and the
	// unaccounted processes on its GPUs, sorted by name and labels.
	Series []MonitorSeries `json:"series,omitempty"`
}

// Serves reports whether the monitor serves the family.
func (m *MonitorScrape) Serves(family string) bool { return slices.Contains(m.Families, family) }

// ParseMonitorScrape reads a node monitor's /metrics answer (Prometheus text format) and
// keeps what concerns pod: the series of the families above whose namespace and pod labels
// name it, and the unaccounted processes on its GPUs (the GPUs of its
// hami.io/vgpu-devices-allocated annotation and of its own series). Legacy families are read
// when their new family is absent. Series with a value that is not finite are dropped. The
// error (errors.Is ErrMonitor) says the text does not parse; nothing is kept then.
func ParseMonitorScrape(r io.Reader, pod *corev1.Pod) (*MonitorScrape, error) {
	if pod == nil {
		return nil, fmt.Errorf("%w: pod is nil", ErrInvalidOptions)
	}
	families, err := parseText(io.LimitReader(r, MaxMonitorBytes))
	if err != nil {
		return nil, fmt.Errorf("parse node monitor metrics: %w: %w", ErrMonitor, err)
	}
	m := &MonitorScrape{Families: sortedKeys(families)}
	all := map[string][]MonitorSeries{}
	for name, f := range families {
		target := name
		if nn, legacy := legacyFamilies[name]; legacy {
			if _, present := families[nn]; present {
				continue
			}
			target = nn
		}
		for _, metric := range f.GetMetric() {
			v, ok := metricValue(metric)
			if !ok {
				continue
			}
			s := MonitorSeries{Name: target, Value: v, Labels: map[string]string{}}
			for _, lp := range metric.GetLabel() {
				k := lp.GetName()
				if k == "zone" {
					continue
				}
				if target != name {
					k = cmp.Or(legacyLabels[k], k)
				}
				s.Labels[k] = lp.GetValue()
			}
			all[target] = append(all[target], s)
		}
	}
	mine := func(s MonitorSeries) bool {
		return s.Labels["namespace"] == pod.Namespace && s.Labels["pod"] == pod.Name
	}
	gpus := map[string]bool{}
	if pd, ok, err := allocation.Allocated(pod, annotation.NVIDIA(), allocation.VersionMaster); ok && err == nil {
		for _, c := range pd {
			for _, d := range c {
				gpus[uuid40(d.GPU())] = true
			}
		}
	}
	others := map[string]bool{}
	for _, name := range podFamilies {
		for _, s := range all[name] {
			if mine(s) {
				m.Series = append(m.Series, s)
				if u := s.Labels["device_uuid"]; u != "" {
					gpus[uuid40(u)] = true
				}
			} else if name == FamilyMemoryUsed {
				others[s.Labels["namespace"]+"/"+s.Labels["pod"]+"/"+s.Labels["container"]] = true
			}
		}
	}
	m.OtherContainers = len(others)
	for _, s := range all[FamilyMonitorUnaccounted] {
		if mine(s) || (s.Labels["device_uuid"] != "" && gpus[uuid40(s.Labels["device_uuid"])]) {
			m.Series = append(m.Series, s)
		}
	}
	slices.SortFunc(m.Series, compareSeries)
	return m, nil
}

// parseText parses the Prometheus text format. expfmt's parser dereferences a nil metric on
// some malformed input ("# TYPE a gauge\n{}", found by fuzzing prometheus/common v0.70.0);
// such a panic is a parse error here, never a crash of the diagnosis.
func parseText(r io.Reader) (families map[string]*dto.MetricFamily, err error) {
	defer func() {
		if p := recover(); p != nil {
			families, err = nil, fmt.Errorf("malformed text (the parser failed: %v)", p)
		}
	}()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(r)
}

// metricValue is the value of a gauge, untyped or counter sample, false when it has none or
// it is not finite.
func metricValue(m *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetUntyped() != nil:
		v = m.GetUntyped().GetValue()
	case m.GetCounter() != nil:
		v = m.GetCounter().GetValue()
	default:
		return 0, false
	}
	return v, !math.IsNaN(v) && !math.IsInf(v, 0)
}

// compareSeries orders series by name, then by their labels in key order.
func compareSeries(a, b MonitorSeries) int {
	if c := cmp.Compare(a.Name, b.Name); c != 0 {
		return c
	}
	return cmp.Compare(labelString(a.Labels), labelString(b.Labels))
}

// labelString renders labels as k="v",… in key order.
func labelString(l map[string]string) string {
	var b strings.Builder
	for i, k := range sortedKeys(l) {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%q", k, l[k])
	}
	return b.String()
}

// uuid40 is the UUID as the monitor labels it: its first 40 bytes.
func uuid40(u string) string {
	if len(u) > 40 {
		return u[:40]
	}
	return u
}

// readMonitor reads the node monitor of the pod's node through the API server's pod proxy
// and keeps the pod's series; the failure is in the scrape's Err and Error. pluginPods are
// the device plugin Pods already read (any nodes); opts has its defaults.
func readMonitor(ctx context.Context, client kubernetes.Interface, opts Options, pod *corev1.Pod, pluginPods []corev1.Pod) *MonitorScrape {
	node := pod.Spec.NodeName
	m := &MonitorScrape{Node: node}
	fail := func(err error) *MonitorScrape {
		m.Err, m.Error = err, err.Error()
		return m
	}
	plugin := monitorPod(ctx, client, opts, node, pluginPods)
	if plugin == nil {
		return fail(fmt.Errorf("find the node monitor on node %s: %w: no Running device plugin Pod (%s) on the node", node, ErrMonitor, opts.PluginSelector))
	}
	port := monitorPort(plugin, opts.MonitorPort)
	m.PluginPod, m.Port = plugin.Namespace+"/"+plugin.Name, port
	m.Endpoint = fmt.Sprintf("/api/v1/namespaces/%s/pods/http:%s:%d/proxy/metrics", plugin.Namespace, plugin.Name, port)
	ctx, cancel := context.WithTimeout(ctx, opts.MonitorTimeout)
	defer cancel()
	rw := client.CoreV1().Pods(plugin.Namespace).ProxyGet("http", plugin.Name, strconv.Itoa(int(port)), "/metrics", nil)
	if rw == nil {
		return fail(fmt.Errorf("get %s: %w: the client has no pod proxy", m.Endpoint, ErrMonitor))
	}
	stream, err := rw.Stream(ctx)
	if err != nil {
		return fail(fmt.Errorf("get %s: %w: %w", m.Endpoint, ErrMonitor, err))
	}
	defer func() { _ = stream.Close() }()
	data, err := io.ReadAll(io.LimitReader(stream, MaxMonitorBytes+1))
	switch {
	case err != nil:
		return fail(fmt.Errorf("read %s: %w: %w", m.Endpoint, ErrMonitor, err))
	case len(data) > MaxMonitorBytes:
		return fail(fmt.Errorf("read %s: %w: the answer is larger than %d bytes", m.Endpoint, ErrMonitor, MaxMonitorBytes))
	}
	got, err := ParseMonitorScrape(bytes.NewReader(data), pod)
	if err != nil {
		return fail(fmt.Errorf("read %s: %w", m.Endpoint, err))
	}
	got.Node, got.PluginPod, got.Port, got.Endpoint = m.Node, m.PluginPod, m.Port, m.Endpoint
	return got
}

// monitorPod is the Running device plugin Pod on the node, the newest: from the gathered
// plugin Pods, else from a list of every namespace with PluginSelector.
func monitorPod(ctx context.Context, client kubernetes.Interface, opts Options, node string, pluginPods []corev1.Pod) *corev1.Pod {
	pick := func(pods []corev1.Pod) *corev1.Pod {
		var best *corev1.Pod
		for i := range pods {
			p := &pods[i]
			if p.Spec.NodeName != node || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
				continue
			}
			if best == nil || p.CreationTimestamp.After(best.CreationTimestamp.Time) {
				best = p
			}
		}
		return best
	}
	if p := pick(pluginPods); p != nil {
		return p
	}
	list, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: opts.PluginSelector,
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return nil
	}
	return pick(list.Items)
}

// monitorPort is the port to scrape: the override when set, else the plugin Pod's container
// port named "metrics" or "monitor", else DefaultMonitorPort.
func monitorPort(p *corev1.Pod, override int32) int32 {
	if override > 0 {
		return override
	}
	for _, want := range []string{"metrics", "monitor"} {
		for _, c := range p.Spec.Containers {
			for _, port := range c.Ports {
				if port.Name == want && port.ContainerPort > 0 {
					return port.ContainerPort
				}
			}
		}
	}
	return DefaultMonitorPort
}

// wantsMonitor reports whether the pod's usage is read: Running on a node, with GPUs, and
// the monitor not disabled.
func wantsMonitor(pod *corev1.Pod, opts Options) bool {
	return opts.MonitorPort >= 0 && pod.Status.Phase == corev1.PodRunning && pod.Spec.NodeName != "" && allocation.Requests(pod, opts.Allocation).Any()
}

// monitorReadFix names what to do about a failed monitor read.
func monitorReadFix(m *MonitorScrape, opts Options) []string {
	var fix []string
	switch {
	case m.PluginPod == "":
		fix = append(fix, fmt.Sprintf("kubectl hami-doctor node %s    # why no device plugin Pod runs on the node", m.Node))
	case apierrors.IsForbidden(m.Err):
		fix = append(fix, "kubectl auth can-i get pods/proxy -n "+strings.Split(m.PluginPod, "/")[0]+"    # the doctor needs get pods/proxy (diagnose.PodClusterRoleRules)")
	case errors.Is(m.Err, context.DeadlineExceeded) || apierrors.IsTimeout(m.Err) || apierrors.IsServerTimeout(m.Err):
		fix = append(fix, fmt.Sprintf("kubectl get --raw %s | head    # the monitor did not answer within %v", m.Endpoint, opts.MonitorTimeout))
	default:
		fix = append(fix, fmt.Sprintf("kubectl get --raw %s | head", m.Endpoint))
	}
	if m.PluginPod != "" {
		ns, name, _ := strings.Cut(m.PluginPod, "/")
		fix = append(fix,
			fmt.Sprintf("kubectl -n %s get pod %s -o jsonpath='{range .spec.containers[*]}{.name}{\" \"}{.ports}{\"\\n\"}{end}'    # the monitor's port: name it metrics, or pass --monitor-port", ns, name),
			fmt.Sprintf("kubectl -n %s logs %s --all-containers --tail=50", ns, name))
	}
	return fix
}
