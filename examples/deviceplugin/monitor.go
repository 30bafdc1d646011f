package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/monitor"
	"github.com/hamireg/hamireg/nvmlscan"
)

// monitorFlags are the node monitor's flags (HAMi's vGPUmonitor, in this process).
type monitorFlags struct {
	on, legacy, feedback, processes, feedbackMetrics, smActivity bool
	root, version, prioritySource                                string
	resync, period                                               time.Duration
}

// resyncFromEnv is HAMI_RESYNC_INTERVAL as HAMi's monitor reads it: a Go duration, else (with
// a warning) the default.
func resyncFromEnv(getenv func(string) string, warn func(string)) time.Duration {
	v := getenv("HAMI_RESYNC_INTERVAL")
	if v == "" {
		return monitor.DefaultResyncInterval
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		warn(fmt.Sprintf("HAMI_RESYNC_INTERVAL=%q is not a positive duration; using %v", v, monitor.DefaultResyncInterval))
		return monitor.DefaultResyncInterval
	}
	return d
}

// addMonitorFlags defines the monitor's flags on flags.
func addMonitorFlags(flags *flag.FlagSet, m *monitorFlags, getenv func(string) string, warn func(string)) {
	flags.BoolVar(&m.on, "monitor", true, "run the node monitor (HAMi's vGPUmonitor): HAMi-core's per-container regions as HAMi's metrics on /metrics, and the priority feedback (default: on with --prepare-state-dir)")
	flags.StringVar(&m.root, "monitor-root", "", "the `folder` holding HAMi-core's containers/ (and the DRA driver's claims/) folders (HAMi's monitor HOOK_PATH; default <hook-path>/vgpu)")
	flags.BoolVar(&m.legacy, "legacy-metrics", false, "also serve HAMi's legacy monitor family names (HAMi: --legacy-metrics)")
	flags.StringVar(&m.version, "monitor-version", "master", "whose monitor families: master (HAMi v2.10.0) or v2.9.0")
	flags.DurationVar(&m.resync, "monitor-resync-interval", resyncFromEnv(getenv, warn), "how long the folder of a pod no longer on the node is kept (env HAMI_RESYNC_INTERVAL)")
	flags.DurationVar(&m.period, "monitor-period", monitor.DefaultPeriod, "the monitor's round: folder scan and priority feedback (HAMi: 5s)")
	flags.BoolVar(&m.feedback, "monitor-feedback", true, "run HAMi's priority feedback (writes recent_kernel and utilization_switch into the regions)")
	flags.StringVar(&m.prioritySource, "monitor-priority-source", "region", "where a container's priority comes from: region (HAMi: the tenant-writable region) or pod-spec (nvidia.com/priority, else CUDA_TASK_PRIORITY)")
	flags.BoolVar(&m.processes, "monitor-process-metrics", false, "serve the per-process families: HAMi-core's accounting against NVML's per host PID, processes without a slot, stale slots")
	flags.BoolVar(&m.feedbackMetrics, "monitor-feedback-metrics", false, "serve each container's priority, blocked state, utilization switch and priority mismatches")
	flags.BoolVar(&m.smActivity, "monitor-activity-from-sm-util", false, "the priority feedback also counts a container with SM utilisation as active (keeps the core limit from latching off)")
}

// options returns the monitor's options, nil when it is off: explicitly, or by default
// without --prepare-state-dir (no folder of HAMi-core is made then). set reports whether a
// flag was given.
func (m *monitorFlags) options(set func(string) bool, prepare bool, hookPath string, scanner *nvmlscan.Scanner) (*monitor.Options, error) {
	if !m.on || !prepare && !set("monitor") {
		return nil, nil
	}
	o := &monitor.Options{
		Root:               cmp.Or(m.root, filepath.Join(hookPath, "vgpu")),
		LegacyMetrics:      m.legacy,
		ResyncInterval:     m.resync,
		Period:             m.period,
		DisableFeedback:    !m.feedback,
		ProcessMetrics:     m.processes,
		FeedbackMetrics:    m.feedbackMetrics,
		ActivityFromSMUtil: m.smActivity,
		Host:               nvmlHost{scanner},
	}
	switch m.version {
	case "master":
	case "v2.9.0":
		o.Version = annotation.VersionV290
	default:
		return nil, fmt.Errorf("--monitor-version %q is not master or v2.9.0", m.version)
	}
	switch m.prioritySource {
	case "region":
	case "pod-spec":
		o.PrioritySource = monitor.PriorityPodSpec
	default:
		return nil, fmt.Errorf("--monitor-priority-source %q is not region or pod-spec", m.prioritySource)
	}
	if m.resync <= 0 {
		return nil, fmt.Errorf("--monitor-resync-interval %v is not positive", m.resync)
	}
	if m.period <= 0 {
		return nil, fmt.Errorf("--monitor-period %v is not positive", m.period)
	}
	return o, nil
}

// prepareRoot makes <root>/containers (mode 0777, as HAMi's device plugin makes the
// containers' folders) so that the monitor's first scan finds it before the first Allocate.
func prepareRoot(ctx context.Context, root string) error {
	dir := filepath.Join(root, monitor.ContainersDir)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return fmt.Errorf("--monitor-root: %w (mount the host's <hook-path>/vgpu at the same path, or --monitor=false)", err)
	}
	klog.FromContext(ctx).V(2).Info("Node monitor reads HAMi-core's regions", "folder", dir)
	return nil
}

// nvmlHost is the monitor's view of the host GPUs: nvmlscan's Usage, on the scanner's NVML.
type nvmlHost struct{ s *nvmlscan.Scanner }

var _ monitor.Host = nvmlHost{}

// GPUs implements monitor.Host.
func (h nvmlHost) GPUs(ctx context.Context) ([]monitor.HostGPU, error) {
	us, err := h.s.Usage(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]monitor.HostGPU, len(us))
	for i, u := range us {
		g := monitor.HostGPU{Index: u.Index, UUID: u.UUID, Name: u.Name, MemoryUsed: u.MemoryUsed, MemoryTotal: u.MemoryTotal,
			MemoryErr: notSupported(u.MemoryErr), UtilGPU: u.UtilGPU, UtilMemory: u.UtilMemory, UtilErr: notSupported(u.UtilErr),
			ProcessesErr: u.ProcessesErr}
		if u.Processes != nil {
			g.Processes = make([]monitor.Process, len(u.Processes))
			for k, p := range u.Processes {
				g.Processes[k] = monitor.Process{PID: p.PID, UsedMemory: p.UsedMemory}
			}
		}
		out[i] = g
	}
	return out, nil
}

// notSupported marks NVML's NOT_SUPPORTED as the monitor's ErrNotSupported.
func notSupported(err error) error {
	if err != nil && errors.Is(err, nvmlscan.ErrNotSupported) {
		return fmt.Errorf("%w: %w", monitor.ErrNotSupported, err)
	}
	return err
}
