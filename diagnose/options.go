package diagnose

import (
	"cmp"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/clock"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/handshake"
	"github.com/hamireg/hamireg/nodelock"
)

// Defaults of HAMi's Helm chart (release "hami" in kube-system).
const (
	DefaultNamespace         = "kube-system"
	DefaultDaemonSet         = "hami-device-plugin"
	DefaultPluginSelector    = "app.kubernetes.io/component=hami-device-plugin"
	DefaultPluginContainer   = "device-plugin"
	DefaultServiceAccount    = "hami-device-plugin"
	DefaultScheduler         = "hami-scheduler"
	DefaultSchedulerSelector = "app.kubernetes.io/component=hami-scheduler"
	DefaultExtenderContainer = "vgpu-scheduler-extender"
	DefaultLease             = "hami-scheduler"
	// DefaultSchedulerName is the scheduler name of HAMi's kube-scheduler profile, which its
	// webhook writes into spec.schedulerName.
	DefaultSchedulerName = "hami-scheduler"
	// DefaultSchedulerConfigMap holds the KubeSchedulerConfiguration of HAMi's kube-scheduler
	// (the chart's "<release>-scheduler-newversion").
	DefaultSchedulerConfigMap = "hami-scheduler-newversion"
	// DefaultWebhook is the MutatingWebhookConfiguration of HAMi's admission webhook (the
	// chart's "<release>-webhook").
	DefaultWebhook = "hami-webhook"
	// DefaultAllocateWait is how long a pod may be bound and allocating before its Allocate
	// counts as late (P5).
	DefaultAllocateWait = time.Minute
	// DefaultPluginPath is the host folder the chart mounts for the plugin's socket
	// (devicePlugin.pluginPath); it must be <kubelet --root-dir>/device-plugins.
	DefaultPluginPath = "/var/lib/kubelet/device-plugins"
	// DefaultLogTail is how many lines of a failing plugin container's log are searched.
	DefaultLogTail = 50
	// DefaultLogTimeout bounds each log read (the API server proxies it to the kubelet).
	DefaultLogTimeout = 5 * time.Second
	// DefaultMonitorTimeout bounds the read of a node monitor's /metrics (the API server
	// proxies it to the device plugin Pod).
	DefaultMonitorTimeout = 5 * time.Second
)

// Options says where HAMi is installed and how to read it. The zero value means the chart's
// defaults for NVIDIA.
type Options struct {
	// Namespace is where the device plugin DaemonSet, the scheduler Deployment and its Lease
	// live. Default "kube-system".
	Namespace string
	// DaemonSet is the device plugin DaemonSet. Default "hami-device-plugin".
	DaemonSet string
	// PluginSelector selects the device plugin Pods when the DaemonSet cannot be read (its own
	// selector is used otherwise). Default "app.kubernetes.io/component=hami-device-plugin".
	PluginSelector string
	// PluginContainer is the plugin's container in the Pod. Default "device-plugin".
	PluginContainer string
	// ServiceAccount is checked for "patch nodes" when the DaemonSet does not name one.
	// Default "hami-device-plugin".
	ServiceAccount string
	// Scheduler is HAMi's scheduler Deployment. Default "hami-scheduler".
	Scheduler string
	// SchedulerSelector selects the scheduler Pods. Default
	// "app.kubernetes.io/component=hami-scheduler".
	SchedulerSelector string
	// ExtenderContainer is the extender's container, whose args carry --node-label-selector.
	// Default "vgpu-scheduler-extender" (every container's args are searched when it is absent).
	ExtenderContainer string
	// Lease is the Lease kube-scheduler in the scheduler Pod holds. Default "hami-scheduler".
	Lease string
	// NodeLabelSelector overrides the selector read from the scheduler Deployment's args.
	NodeLabelSelector map[string]string
	// Vendor is the device vendor to check. Default annotation.NVIDIA().
	Vendor annotation.Vendor
	// ResourceName is the extended resource the plugin advertises. Default the vendor's
	// ("nvidia.com/gpu").
	ResourceName string
	// HAMiVersion selects the scheduler semantics to interpret the handshake with.
	HAMiVersion handshake.Version
	// Location is the scheduler's time zone, in which handshake timestamps are written.
	// Default time.Local.
	Location *time.Location
	// Clock is the source of time. Default the real clock.
	Clock clock.PassiveClock
	// LogTail is how many lines of a failing plugin container's previous log are searched for
	// NVML errors; negative disables log reads. Default 50.
	LogTail int64
	// LogTimeout bounds one log read. Default 5 s.
	LogTimeout time.Duration

	// The pod diagnosis ([Pod], [Pods]) reads these as well.

	// SchedulerName is HAMi's scheduler name in spec.schedulerName. Default "hami-scheduler".
	SchedulerName string
	// SchedulerConfigMap is the ConfigMap (in Namespace) with HAMi's KubeSchedulerConfiguration.
	// Default "hami-scheduler-newversion".
	SchedulerConfigMap string
	// Webhook is HAMi's MutatingWebhookConfiguration. Default "hami-webhook".
	Webhook string
	// Allocation is HAMi's device configuration on the scheduler side (resource names,
	// defaults, policies, version) the fit is recomputed with. The zero value is the chart's;
	// HAMiVersion v2.9.0 sets its Version to v2.9.0.
	Allocation allocation.Config
	// LockTimeout is HAMi's --node-lock-timeout. Default 5 min.
	LockTimeout time.Duration
	// AllocateWait is how long a bound pod may wait for Allocate before it counts as late.
	// Default 1 min.
	AllocateWait time.Duration
	// MonitorPort is the node monitor's port on the device plugin Pod, read through the API
	// server's pod proxy for a Running GPU pod's usage. Zero takes the Pod's container port
	// named "metrics" or "monitor", else DefaultMonitorPort (9394); a positive value
	// overrides them; negative reads no monitor. At most 65535.
	MonitorPort int32
	// MonitorTimeout bounds the monitor read. Default 5 s.
	MonitorTimeout time.Duration
}

func (o Options) withDefaults() (Options, error) {
	o.Namespace = cmp.Or(o.Namespace, DefaultNamespace)
	o.DaemonSet = cmp.Or(o.DaemonSet, DefaultDaemonSet)
	o.PluginSelector = cmp.Or(o.PluginSelector, DefaultPluginSelector)
	o.PluginContainer = cmp.Or(o.PluginContainer, DefaultPluginContainer)
	o.ServiceAccount = cmp.Or(o.ServiceAccount, DefaultServiceAccount)
	o.Scheduler = cmp.Or(o.Scheduler, DefaultScheduler)
	o.SchedulerSelector = cmp.Or(o.SchedulerSelector, DefaultSchedulerSelector)
	o.ExtenderContainer = cmp.Or(o.ExtenderContainer, DefaultExtenderContainer)
	o.Lease = cmp.Or(o.Lease, DefaultLease)
	if o.Vendor.Name == "" {
		o.Vendor = annotation.NVIDIA()
	}
	o.ResourceName = cmp.Or(o.ResourceName, o.Vendor.ResourceName)
	if o.ResourceName == "" {
		return o, fmt.Errorf("%w: vendor %s has no resource name; set ResourceName", ErrInvalidOptions, o.Vendor.Name)
	}
	if o.Vendor.RegisterKey == "" {
		return o, fmt.Errorf("%w: vendor %s has no register annotation", ErrInvalidOptions, o.Vendor.Name)
	}
	o.Location = cmp.Or(o.Location, time.Local)
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	o.LogTail = cmp.Or(o.LogTail, DefaultLogTail)
	if o.LogTimeout <= 0 {
		o.LogTimeout = DefaultLogTimeout
	}
	o.SchedulerName = cmp.Or(o.SchedulerName, DefaultSchedulerName)
	o.SchedulerConfigMap = cmp.Or(o.SchedulerConfigMap, DefaultSchedulerConfigMap)
	o.Webhook = cmp.Or(o.Webhook, DefaultWebhook)
	if o.HAMiVersion == handshake.VersionV290 {
		o.Allocation.Version = allocation.VersionV290
	}
	cfg, err := o.Allocation.WithDefaults()
	if err != nil {
		return o, fmt.Errorf("%w: Allocation: %w", ErrInvalidOptions, err)
	}
	o.Allocation = cfg
	if o.LockTimeout <= 0 {
		o.LockTimeout = nodelock.DefaultTimeout
	}
	if o.AllocateWait <= 0 {
		o.AllocateWait = DefaultAllocateWait
	}
	if o.MonitorPort > 65535 {
		return o, fmt.Errorf("%w: MonitorPort %d is not a port (1-65535; 0 for the Pod's port named metrics, negative for none)", ErrInvalidOptions, o.MonitorPort)
	}
	if o.MonitorTimeout <= 0 {
		o.MonitorTimeout = DefaultMonitorTimeout
	}
	for _, s := range []struct{ name, value string }{{"PluginSelector", o.PluginSelector}, {"SchedulerSelector", o.SchedulerSelector}} {
		if _, err := labels.Parse(s.value); err != nil {
			return o, fmt.Errorf("%w: %s %q: %w", ErrInvalidOptions, s.name, s.value, err)
		}
	}
	return o, nil
}
