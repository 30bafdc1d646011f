package diagnose

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/allocation"
)

// Stable codes of the GPU usage findings of a Running pod (from the node monitor).
const (
	// CodeUsageNotReported: the monitor reports no usage of the pod (or of one container):
	// no HAMi-core region yet (no CUDA call), or the monitor does not see it.
	CodeUsageNotReported = "GPUUsageNotReported"
	// CodeUsageOverLimit: a container uses more GPU memory than its limit.
	CodeUsageOverLimit = "GPUMemoryOverLimit"
	// CodeAccountingDrift: HAMi-core's count of a process's memory differs from NVML's by more
	// than [DriftThreshold].
	CodeAccountingDrift = "GPUMemoryAccountingDrift"
	// CodeProcessWithoutSlot: a process on one of the pod's GPUs has no HAMi-core slot: it
	// runs outside HAMi's limits.
	CodeProcessWithoutSlot = "GPUProcessWithoutSlot"
	// CodeStaleSlot: a HAMi-core slot of the pod names a process NVML no longer lists.
	CodeStaleSlot = "GPUStaleSlot"
	// CodeBlockedByPriority: the priority loop blocks the container's kernels.
	CodeBlockedByPriority = "GPUBlockedByPriority"
	// CodePriorityMismatch: the priority in the container's region is not the pod spec's.
	CodePriorityMismatch = "GPUPriorityMismatch"
)

// DriftThreshold is the relative difference between HAMi-core's and NVML's count of one
// process's memory above which it is a finding.
const DriftThreshold = 0.10

// UsageReport is a Running pod's GPU usage as the node monitor of its node reports it.
type UsageReport struct {
	// Node is the pod's node; PluginPod ("namespace/name") and Endpoint where it was read.
	Node      string `json:"node,omitempty"`
	PluginPod string `json:"pluginPod,omitempty"`
	Endpoint  string `json:"endpoint,omitempty"`
	// Error is the read failure, "" when the monitor was read.
	Error string `json:"error,omitempty"`
	// GPUs has one row per container and GPU: the allocated ones (from the pod's
	// allocation annotation) and every one the monitor reports, init containers first.
	GPUs []GPUUsage `json:"gpus,omitempty"`
	// Processes has one row per process the monitor's opt-in families name on the pod's
	// GPUs (HAMi-core's and NVML's count, their drift), sorted by container, GPU and PID.
	Processes []ProcessUsage `json:"processes,omitempty"`
	// OptIn says the monitor serves the SDK's per-process families (drift, slotless
	// processes): without them those checks were not made.
	OptIn bool `json:"optIn"`
}

// GPUUsage is one container's use of one GPU.
type GPUUsage struct {
	Container string `json:"container"`
	// Index is the container-local device index (the monitor's vdevice_index), "" when the
	// monitor does not report the GPU.
	Index string `json:"index,omitempty"`
	UUID  string `json:"uuid"`
	// Reported says the monitor reports this GPU for the container; the values below are
	// zero when not.
	Reported bool `json:"reported"`
	// UsedBytes is HAMi-core's count; LimitBytes the limit (0: none, or not reported).
	UsedBytes  int64 `json:"usedBytes"`
	LimitBytes int64 `json:"limitBytes"`
	// AllocatedMiB is the memory the scheduler allocated (the annotation), 0 when unknown.
	AllocatedMiB int64 `json:"allocatedMiB,omitempty"`
	// UsedPercent is UsedBytes / LimitBytes in %, absent without a limit.
	UsedPercent *float64 `json:"usedPercent,omitempty"`
	// SMPercent is the SM utilisation (may exceed 100), LastKernelSeconds the time since the
	// last kernel; absent when not reported.
	SMPercent         *float64 `json:"smPercent,omitempty"`
	LastKernelSeconds *float64 `json:"lastKernelSeconds,omitempty"`
}

// UsedMiB is UsedBytes in MiB, rounded down.
func (g GPUUsage) UsedMiB() int64 { return g.UsedBytes >> 20 }

// LimitMiB is LimitBytes in MiB, rounded down.
func (g GPUUsage) LimitMiB() int64 { return g.LimitBytes >> 20 }

// ProcessUsage is one host process of the pod on one GPU, as HAMi-core and NVML count it.
type ProcessUsage struct {
	Container string `json:"container"`
	Index     string `json:"index,omitempty"`
	UUID      string `json:"uuid"`
	HostPID   string `json:"hostPID"`
	// HAMiCoreBytes and NVMLBytes are the two counts, absent when not reported.
	HAMiCoreBytes *int64 `json:"hamiCoreBytes,omitempty"`
	NVMLBytes     *int64 `json:"nvmlBytes,omitempty"`
	// Drift is (HAMi-core − NVML) / NVML, absent when unknown: the monitor's
	// FamilyMonitorDrift, else computed from the two counts.
	Drift *float64 `json:"drift,omitempty"`

	// driftReported says Drift is the monitor's own series.
	driftReported bool
}

// bytesOf turns a series value into bytes, clamped to [0, MaxInt64].
func bytesOf(v float64) int64 {
	switch {
	case v <= 0 || math.IsNaN(v):
		return 0
	case v >= math.MaxInt64:
		return math.MaxInt64
	}
	return int64(v)
}

// mib renders bytes as MiB.
func mib(b int64) string { return strconv.FormatInt(b>>20, 10) + " MiB" }

// checkUsage reads the node monitor's scrape of a Running GPU pod: its usage table and the
// usage findings.
func (a *podAnalysis) checkUsage() {
	m := a.ev.Monitor
	p := a.pod
	if m == nil || p.Status.Phase != corev1.PodRunning || !a.req.Any() {
		return
	}
	u := &UsageReport{Node: m.Node, PluginPod: m.PluginPod, Endpoint: m.Endpoint, Error: m.Error,
		OptIn: m.Serves(FamilyMonitorProcessMemory) || m.Serves(FamilyMonitorDrift) || m.Serves(FamilyMonitorUnaccounted)}
	a.r.Usage = u
	obj := fmt.Sprintf("pod %s/%s", p.Namespace, p.Name)
	if m.Error != "" {
		a.add(Finding{Severity: SeverityInfo, Code: CodePodNotChecked,
			Summary:  fmt.Sprintf("could not read the node monitor of node %s: the GPU usage of %s is not checked", cmp.Or(m.Node, "?"), obj),
			Evidence: []string{m.Error}, Fix: monitorReadFix(m, a.opts)})
		return
	}
	order := a.containerOrder()
	rows := map[string]*GPUUsage{} // container/uuid40
	var keys []string
	row := func(ctr, uuid string) *GPUUsage {
		k := ctr + "/" + uuid40(uuid)
		if r, ok := rows[k]; ok {
			return r
		}
		r := &GPUUsage{Container: ctr, UUID: uuid}
		rows[k] = r
		keys = append(keys, k)
		return r
	}
	if pd, ok, err := allocation.Allocated(p, a.opts.Vendor, a.opts.Allocation.Version); ok && err == nil {
		for i, c := range pd {
			for _, d := range c {
				row(a.containerName(i), d.GPU()).AllocatedMiB = int64(d.Usedmem)
			}
		}
	}
	var procs []*ProcessUsage
	proc := func(l map[string]string) *ProcessUsage {
		for _, x := range procs {
			if x.Container == l["container"] && x.UUID == l["device_uuid"] && x.HostPID == l["hostpid"] {
				return x
			}
		}
		x := &ProcessUsage{Container: l["container"], Index: l["vdevice_index"], UUID: l["device_uuid"], HostPID: l["hostpid"]}
		procs = append(procs, x)
		return x
	}
	var unaccounted, stale, blocked, mismatch []MonitorSeries
	for _, s := range m.Series {
		l := s.Labels
		switch s.Name {
		case FamilyMemoryUsed, FamilyMemoryLimit, FamilyUtilization, FamilyLastKernel:
			r := row(l["container"], l["device_uuid"])
			r.Reported, r.Index = true, cmp.Or(r.Index, l["vdevice_index"])
			v := s.Value
			switch s.Name {
			case FamilyMemoryUsed:
				r.UsedBytes = bytesOf(v)
			case FamilyMemoryLimit:
				r.LimitBytes = bytesOf(v)
			case FamilyUtilization:
				r.SMPercent = &v
			case FamilyLastKernel:
				r.LastKernelSeconds = &v
			}
		case FamilyMonitorProcessMemory:
			x, b := proc(l), bytesOf(s.Value)
			switch l["source"] {
			case "hami-core":
				x.HAMiCoreBytes = &b
			case "nvml":
				x.NVMLBytes = &b
			}
		case FamilyMonitorDrift:
			v := s.Value
			x := proc(l)
			x.Drift, x.driftReported = &v, true
		case FamilyMonitorUnaccounted:
			unaccounted = append(unaccounted, s)
		case FamilyMonitorStaleSlot:
			stale = append(stale, s)
		case FamilyMonitorBlocked:
			if s.Value > 0 {
				blocked = append(blocked, s)
			}
		case FamilyMonitorPriorityMismatch:
			if s.Value > 0 {
				mismatch = append(mismatch, s)
			}
		}
	}
	for _, k := range keys {
		r := rows[k]
		if r.LimitBytes > 0 {
			pct := float64(r.UsedBytes) / float64(r.LimitBytes) * 100
			r.UsedPercent = &pct
		}
		u.GPUs = append(u.GPUs, *r)
	}
	slices.SortStableFunc(u.GPUs, func(x, y GPUUsage) int {
		return cmp.Or(cmp.Compare(order(x.Container), order(y.Container)), cmp.Compare(x.Container, y.Container),
			compareIndex(x.Index, y.Index), cmp.Compare(x.UUID, y.UUID))
	})
	for _, x := range procs {
		if x.Drift == nil && x.HAMiCoreBytes != nil && x.NVMLBytes != nil && *x.NVMLBytes > 0 {
			d := (float64(*x.HAMiCoreBytes) - float64(*x.NVMLBytes)) / float64(*x.NVMLBytes)
			x.Drift = &d
		}
		u.Processes = append(u.Processes, *x)
	}
	slices.SortFunc(u.Processes, func(x, y ProcessUsage) int {
		return cmp.Or(cmp.Compare(order(x.Container), order(y.Container)), cmp.Compare(x.Container, y.Container),
			compareIndex(x.Index, y.Index), cmp.Compare(x.UUID, y.UUID), compareIndex(x.HostPID, y.HostPID))
	})
	a.usageReported(u, m)
	a.overLimit(u)
	a.drift(u)
	a.unaccounted(unaccounted)
	a.staleSlots(stale)
	a.priority(blocked, mismatch)
}

// containerOrder ranks container names as the pod spec lists them, init containers first.
func (a *podAnalysis) containerOrder() func(string) int {
	rank := map[string]int{}
	for i, c := range a.pod.Spec.InitContainers {
		rank[c.Name] = i
	}
	for i, c := range a.pod.Spec.Containers {
		rank[c.Name] = len(a.pod.Spec.InitContainers) + i
	}
	return func(name string) int {
		if r, ok := rank[name]; ok {
			return r
		}
		return math.MaxInt
	}
}

// compareIndex orders decimal strings by value, others after them as text.
func compareIndex(x, y string) int {
	a, errA := strconv.ParseUint(x, 10, 64)
	b, errB := strconv.ParseUint(y, 10, 64)
	switch {
	case errA == nil && errB == nil:
		return cmp.Compare(a, b)
	case errA == nil:
		return -1
	case errB == nil:
		return 1
	}
	return cmp.Compare(x, y)
}

// usageReported says why the monitor reports nothing for the pod, or for one of its GPU
// containers.
func (a *podAnalysis) usageReported(u *UsageReport, m *MonitorScrape) {
	p := a.pod
	reported := map[string]bool{}
	for _, g := range u.GPUs {
		if g.Reported {
			reported[g.Container] = true
		}
	}
	// HAMi's monitor reports the pod spec's containers only, never init containers (native
	// sidecars included).
	var missing []string
	for i, c := range a.req.Containers {
		if i < len(p.Spec.InitContainers) {
			continue
		}
		if c.Count > 0 && !reported[a.containerName(i)] {
			missing = append(missing, a.containerName(i))
		}
	}
	if len(missing) == 0 {
		return
	}
	obj := fmt.Sprintf("pod %s/%s", p.Namespace, p.Name)
	ev := []string{fmt.Sprintf("%s (%s): no %s series for %s %s", m.PluginPod, m.Endpoint, FamilyMemoryUsed, obj, plural("container", missing))}
	execFix := fmt.Sprintf("kubectl -n %s exec %s -c %s -- sh -c 'cat /etc/ld.so.preload; echo LD_PRELOAD=$LD_PRELOAD; ls /usr/local/vgpu'    # HAMi-core must be preloaded", p.Namespace, p.Name, missing[0])
	switch {
	case len(reported) == 0 && m.OtherContainers == 0:
		pns, pname, _ := strings.Cut(m.PluginPod, "/")
		ev = append(ev, fmt.Sprintf("%s reports no container of any pod on node %s", m.PluginPod, m.Node))
		a.add(Finding{Severity: SeverityWarning, Code: CodeUsageNotReported,
			Summary:  fmt.Sprintf("the node monitor of node %s reports no GPU usage at all, %s included: no container on the node has made a CUDA call through HAMi-core yet, or the monitor does not see HAMi-core's cache folders (its hook path is not the device plugin's)", m.Node, obj),
			Evidence: ev,
			Fix:      []string{execFix, fmt.Sprintf("kubectl -n %s get pod %s -o yaml | grep -A3 -i hostPath    # the monitor mounts the hook path (/usr/local/vgpu) the plugin gives containers", pns, pname)}})
	default:
		if m.OtherContainers > 0 {
			ev = append(ev, fmt.Sprintf("%s reports %d container(s) of other pods, so it reads HAMi-core's regions", m.PluginPod, m.OtherContainers))
		}
		a.add(Finding{Severity: SeverityInfo, Code: CodeUsageNotReported,
			Summary:  fmt.Sprintf("the node monitor reports no GPU usage of %s %s: it has no HAMi-core region yet (no CUDA call so far), or HAMi-core is not loaded in it (then its limits do not apply)", obj, plural("container", missing)),
			Evidence: ev, Fix: []string{execFix}})
	}
}

// plural renders "container a" or "containers a, b".
func plural(word string, names []string) string {
	if len(names) == 1 {
		return word + " " + names[0]
	}
	return word + "s " + strings.Join(names, ", ")
}

// gpuName names one GPU of a container: "GPU-… (vdevice 0)".
func gpuName(uuid, index string) string {
	if index == "" {
		return uuid
	}
	return fmt.Sprintf("%s (vdevice %s)", uuid, index)
}

// overLimit flags GPUs used above their limit.
func (a *podAnalysis) overLimit(u *UsageReport) {
	p := a.pod
	for _, g := range u.GPUs {
		if g.LimitBytes <= 0 || g.UsedBytes <= g.LimitBytes {
			continue
		}
		obj := fmt.Sprintf("pod %s/%s container %s", p.Namespace, p.Name, g.Container)
		a.add(Finding{Case: P8RunningWithoutLimits, Severity: SeverityError, Code: CodeUsageOverLimit,
			Summary: fmt.Sprintf("%s uses %s of GPU %s, above its limit of %s: HAMi-core should have refused the allocation (unified memory or oversubscription enabled, memory allocated outside HAMi-core's hooks)",
				obj, mib(g.UsedBytes), g.UUID, mib(g.LimitBytes)),
			Evidence: []string{fmt.Sprintf("%s: %s %d, %s %d (%.0f %%)", gpuName(g.UUID, g.Index), FamilyMemoryUsed, g.UsedBytes, FamilyMemoryLimit, g.LimitBytes, *g.UsedPercent)},
			Fix: []string{
				fmt.Sprintf("kubectl -n %s exec %s -c %s -- sh -c 'env | grep -E \"CUDA_(DEVICE_MEMORY|OVERSUBSCRIBE|DISABLE_CONTROL)\"'    # the limit HAMi-core applies", p.Namespace, p.Name, g.Container),
				fmt.Sprintf("kubectl hami-doctor pod %s/%s -o json | jq .usage.processes    # which process holds it (needs the monitor's per-process families)", p.Namespace, p.Name),
			}})
	}
}

// drift flags processes whose HAMi-core count differs from NVML's by more than DriftThreshold.
func (a *podAnalysis) drift(u *UsageReport) {
	p := a.pod
	for _, x := range u.Processes {
		if x.Drift == nil || math.Abs(*x.Drift) <= DriftThreshold {
			continue
		}
		counts := fmt.Sprintf("drift %+.0f %%", *x.Drift*100)
		if x.HAMiCoreBytes != nil && x.NVMLBytes != nil {
			counts = fmt.Sprintf("HAMi-core counts %s, NVML %s (%s)", mib(*x.HAMiCoreBytes), mib(*x.NVMLBytes), counts)
		}
		labels := fmt.Sprintf("namespace=%q,pod=%q,container=%q,device_uuid=%q,hostpid=%q", p.Namespace, p.Name, x.Container, x.UUID, x.HostPID)
		var ev []string
		if x.driftReported {
			ev = append(ev, fmt.Sprintf("%s{%s} = %.3f", FamilyMonitorDrift, labels, *x.Drift))
		}
		if x.HAMiCoreBytes != nil && x.NVMLBytes != nil {
			ev = append(ev, fmt.Sprintf("%s{%s,source=\"hami-core\"} = %d, {source=\"nvml\"} = %d", FamilyMonitorProcessMemory, labels, *x.HAMiCoreBytes, *x.NVMLBytes))
		}
		f := Finding{Severity: SeverityWarning, Code: CodeAccountingDrift, Evidence: ev,
			Fix: []string{fmt.Sprintf("kubectl -n %s exec %s -c %s -- sh -c 'cat /etc/ld.so.preload; echo LD_PRELOAD=$LD_PRELOAD'    # HAMi-core must be preloaded in every process", p.Namespace, p.Name, x.Container)},
			OnNode: []string{
				fmt.Sprintf("nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv | grep -w %s    # the driver's count", x.HostPID),
				fmt.Sprintf("grep -c libvgpu /proc/%s/maps    # 0: HAMi-core is not loaded in the process", x.HostPID),
				fmt.Sprintf("tr '\\0' '\\n' < /proc/%s/environ | grep -E 'LD_PRELOAD|CUDA_DISABLE_CONTROL'", x.HostPID),
			}}
		what := fmt.Sprintf("pod %s/%s container %s, host PID %s on GPU %s: %s", p.Namespace, p.Name, x.Container, x.HostPID, gpuName(x.UUID, x.Index), counts)
		if *x.Drift < 0 {
			f.Case = P8RunningWithoutLimits
			f.Summary = what + ": HAMi-core counts less than the driver: memory allocated outside HAMi-core's hooks (a CUDA call it does not intercept, a library linked statically) escapes the limit"
		} else {
			f.Summary = what + ": HAMi-core counts more than the driver: the container reaches its limit early (a slot of an exited process, or a count HAMi-core never lowered)"
		}
		a.add(f)
	}
}

// unaccounted flags processes on the pod's GPUs that have no HAMi-core slot.
func (a *podAnalysis) unaccounted(series []MonitorSeries) {
	p := a.pod
	for _, s := range series {
		l := s.Labels
		pid, uuid := l["pid"], l["device_uuid"]
		ev := []string{fmt.Sprintf("%s{device_index=%q,device_uuid=%q,pid=%q,namespace=%q,pod=%q,container=%q} = %d",
			FamilyMonitorUnaccounted, l["device_index"], uuid, pid, l["namespace"], l["pod"], l["container"], bytesOf(s.Value))}
		onNode := []string{
			fmt.Sprintf("cat /proc/%s/cgroup | tail -1    # which container the process belongs to", pid),
			fmt.Sprintf("grep -c libvgpu /proc/%s/maps    # 0: HAMi-core is not loaded", pid),
			fmt.Sprintf("tr '\\0' '\\n' < /proc/%s/environ | grep -E 'LD_PRELOAD|CUDA_DISABLE_CONTROL'", pid),
		}
		why := "HAMi-core is not loaded in it (LD_PRELOAD missing or /etc/ld.so.preload replaced, a statically linked CUDA runtime) or CUDA_DISABLE_CONTROL is set"
		if l["namespace"] == p.Namespace && l["pod"] == p.Name {
			a.add(Finding{Case: P8RunningWithoutLimits, Severity: SeverityError, Code: CodeProcessWithoutSlot,
				Summary: fmt.Sprintf("pod %s/%s container %s runs host PID %s on GPU %s with %s and no HAMi-core slot: its limits are bypassed; %s",
					p.Namespace, p.Name, cmp.Or(l["container"], "?"), pid, uuid, mib(bytesOf(s.Value)), why),
				Evidence: ev, OnNode: onNode,
				Fix: []string{fmt.Sprintf("kubectl -n %s exec %s -c %s -- sh -c 'cat /etc/ld.so.preload; echo LD_PRELOAD=$LD_PRELOAD; echo CUDA_DISABLE_CONTROL=$CUDA_DISABLE_CONTROL'",
					p.Namespace, p.Name, cmp.Or(l["container"], "<container>"))}})
			continue
		}
		owner := "an unknown container"
		if l["pod"] != "" {
			owner = fmt.Sprintf("pod %s/%s container %s", l["namespace"], l["pod"], cmp.Or(l["container"], "?"))
		}
		a.add(Finding{Severity: SeverityWarning, Code: CodeProcessWithoutSlot,
			Summary: fmt.Sprintf("GPU %s, which pod %s/%s shares, runs host PID %s of %s with %s and no HAMi-core slot: it is outside HAMi's limits and can take this pod's memory; %s",
				uuid, p.Namespace, p.Name, pid, owner, mib(bytesOf(s.Value)), why),
			Evidence: ev, OnNode: onNode})
	}
}

// staleSlots flags slots of the pod whose process NVML no longer lists.
func (a *podAnalysis) staleSlots(series []MonitorSeries) {
	p := a.pod
	for _, s := range series {
		l := s.Labels
		a.add(Finding{Severity: SeverityWarning, Code: CodeStaleSlot,
			Summary: fmt.Sprintf("pod %s/%s container %s keeps a HAMi-core slot of host PID %s on GPU %s with %s, but NVML no longer lists the process: the memory counts against the container's limit until HAMi-core drops the slot (a process killed with SIGKILL)",
				p.Namespace, p.Name, l["container"], l["hostpid"], gpuName(l["device_uuid"], l["vdevice_index"]), mib(bytesOf(s.Value))),
			Evidence: []string{fmt.Sprintf("%s{container=%q,device_uuid=%q,hostpid=%q} = %d", FamilyMonitorStaleSlot, l["container"], l["device_uuid"], l["hostpid"], bytesOf(s.Value))},
			Fix: []string{fmt.Sprintf("kubectl -n %s exec %s -c %s -- nvidia-smi    # the next CUDA process in the container drops slots of exited processes; if the slot stays, restart the pod: %s",
				p.Namespace, p.Name, l["container"], recreateFix(p, ""))}})
	}
}

// priority reports containers the priority loop blocks and regions whose priority is not the
// pod spec's.
func (a *podAnalysis) priority(blocked, mismatch []MonitorSeries) {
	p := a.pod
	for _, s := range blocked {
		a.add(Finding{Severity: SeverityInfo, Code: CodeBlockedByPriority,
			Summary: fmt.Sprintf("pod %s/%s container %s is blocked by the priority loop: a higher-priority container (nvidia.com/priority 0) runs kernels on the same GPU; its kernels wait until that one is idle",
				p.Namespace, p.Name, s.Labels["container"]),
			Evidence: []string{fmt.Sprintf("%s{container=%q} = 1", FamilyMonitorBlocked, s.Labels["container"])}})
	}
	for _, s := range mismatch {
		l := s.Labels
		a.add(Finding{Severity: SeverityWarning, Code: CodePriorityMismatch,
			Summary: fmt.Sprintf("pod %s/%s container %s: HAMi-core's region says priority %s but the pod spec says %s: the process wrote its own priority word, so the priority loop treats it as the region says",
				p.Namespace, p.Name, l["container"], l["region"], l["spec"]),
			Evidence: []string{fmt.Sprintf("%s{container=%q,region=%q,spec=%q} = 1", FamilyMonitorPriorityMismatch, l["container"], l["region"], l["spec"])},
			Fix:      []string{recreateFix(p, "")}})
	}
}
