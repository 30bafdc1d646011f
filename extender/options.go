package extender

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coreinformers "k8s.io/client-go/informers/core/v1"
	resourceinformers "k8s.io/client-go/informers/resource/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/nodelock"
)

// Defaults of [Options].
const (
	// DefaultSchedulerName is HAMi's chart scheduler name (profiles[].schedulerName).
	DefaultSchedulerName = "hami-scheduler"
	// DefaultMaxBodyBytes is HAMi's limit on a /filter body (1 MiB).
	DefaultMaxBodyBytes = 1 << 20
	// DefaultNodeLockWait is how long a bind waits for another pod's node lock: well below
	// the chart's extender httpTimeout of 30 s.
	DefaultNodeLockWait = 10 * time.Second
)

// Options configure an [Extender]. The zero value means HAMi's chart defaults, documented on
// each field.
type Options struct {
	// Config is the device configuration: resource names, defaults, policies and the HAMi
	// version whose rules apply. The zero value is HAMi's chart (see allocation.Config).
	Config allocation.Config
	// Vendor is the vendor scheduled: the register annotation the nodes are fitted from, the
	// resources pods ask with and the pod annotation keys written. The zero value means
	// annotation.NVIDIA(). Another vendor needs a JSON register annotation (annotation.NewVendor)
	// and gets allocation's generic fit (allocation.ConfigFor; Config then gives only the
	// policies and the HAMi version); a vendor HAMi fits with rules of its own (Ascend, Cambricon,
	// Hygon, …) is refused with allocation.ErrVendorRules and stays with HAMi's scheduler.
	Vendor annotation.Vendor
	// SchedulerName is what the admission webhook sets as a GPU pod's spec.schedulerName.
	// Empty means [DefaultSchedulerName].
	SchedulerName string
	// KeepDefaultScheduler stops the webhook from overwriting schedulerName
	// "default-scheduler" (HAMi's --force-overwrite-default-scheduler=false).
	KeepDefaultScheduler bool
	// NodeLockTimeout is how old a node lock must be before bind takes it over. Zero means
	// nodelock.DefaultTimeout (5 min, HAMi's --node-lock-timeout).
	NodeLockTimeout time.Duration
	// NodeLockWait is how long a bind waits for a node locked by another pod (one that is
	// between its bind and its device plugin's Allocate) before it fails with HAMi's "node
	// <node> has been locked within 5m0s". Zero means [DefaultNodeLockWait]; negative means
	// no wait (HAMi v2.9.0, where every such bind fails and kube-scheduler retries the pod
	// after its back-off of 1 to 10 s, so a node binds about one GPU pod per back-off).
	// HAMi master's --node-lock-retry-timeout. Keep it below the extender's httpTimeout in
	// the KubeSchedulerConfiguration.
	NodeLockWait time.Duration
	// Clock gives hami.io/vgpu-time, hami.io/bind-time and the lock time. Nil means the real
	// clock.
	Clock clock.WithTicker
	// EventRecorder records HAMi's Events on pods (FilteringSucceed, FilteringFailed,
	// BindingSucceed, BindingFailed). Nil means no Events.
	EventRecorder record.EventRecorder
	// MaxBodyBytes limits every request body. Zero means [DefaultMaxBodyBytes] (1 MiB, HAMi's
	// /filter limit); kube-scheduler with nodeCacheCapable false sends whole Nodes, which can
	// need more.
	MaxBodyBytes int64
	// Pods is the pod informer usage is counted from, from a shared informer factory the caller
	// starts. Nil means the extender runs its own over all namespaces in [Extender.Run].
	Pods coreinformers.PodInformer
	// ResourceQuotas is the ResourceQuota informer the namespaces' limits on GPU memory and
	// cores are read from, from a shared informer factory the caller starts. Nil means the
	// extender runs its own over all namespaces in [Extender.Run] (RBAC: resourcequotas list
	// and watch, see [ClusterRoleRules]).
	ResourceQuotas coreinformers.ResourceQuotaInformer
	// Nodes, when set, gives the node lock to the bind: it is read there
	// (nodelock.Options.Nodes). Nil means a GET of the Node per lock try. Use the lister of the
	// node cache's informer (the same factory): a bind waiting for another pod's lock is woken
	// by that informer's events and then reads the lock here. (The fit reads HAMi master's
	// hami.io/device-cordon from the node cache's snapshot, schedcache.NodeInfo.Cordon.)
	Nodes corev1listers.NodeLister
	// Registerer, when set, receives HAMi's scheduler metric families (the gauges HAMi's
	// --metrics-bind-address serves, with HAMi's names, help, labels and values, computed at
	// each scrape from the node cache and the pod usage), hami_build_info, and the extender's
	// own operational metrics, named hamireg_extender_* ([MetricsPrefix]). HAMi's families
	// label series with node names and GPU UUIDs: they are HAMi's wire. Nil means no metrics.
	// Serve it with promhttp.HandlerFor(registry, promhttp.HandlerOpts{}), as HAMi does.
	Registerer prometheus.Registerer
	// LegacyMetrics adds HAMi's legacy names (GPUDeviceMemoryLimit, nodeGPUOverview,
	// vGPUMemoryAllocated, QuotaUsed, …) beside the current ones: HAMi's --legacy-metrics.
	LegacyMetrics bool
	// TrustedUsers are the users (the admission request's userInfo.username) allowed to add,
	// change or remove a pod's scheduler-owned allocation annotations ([AllocationAnnotationKeys])
	// through the webhook: the scheduler's and the node agent's identities. Nil means
	// [DefaultTrustedUsers] (the ServiceAccounts kube-system/hami-scheduler and
	// kube-system/hami-device-plugin of the deploy folders); an empty, non-nil list trusts no
	// user. Nobody may create a pod that carries them.
	TrustedUsers []string
	// TrustedGroups are the groups whose members are trusted as TrustedUsers are. Nil means
	// [DefaultTrustedGroups] (system:masters); an empty, non-nil list trusts no group.
	TrustedGroups []string
	// BuildInfo labels hami_build_info. The zero value means [DefaultBuildInfo]: the SDK's
	// build.
	BuildInfo BuildInfo
	// SimulationLiveUsage changes what a filter with ExtenderArgs.Nodes (a simulation, see
	// [Extender.Filter]) counts on a request Node that is a registered live node, the same
	// name and the same UID as a Node of the node cache: what the live pods hold there (less
	// what the pod itself holds), so that a caller with nodeCacheCapable: false is not told a
	// full node fits. The devices still come from the request's Node. False (the zero value)
	// means HAMi v2.10.0's rule: every request Node is simulated empty. Request Nodes that are
	// not live nodes are simulated empty either way, and the namespace's live quota applies
	// either way.
	SimulationLiveUsage bool
	// DeviceClasses is the DeviceClass informer (resource.k8s.io/v1) of a shared informer
	// factory the caller starts; the extender reads the extended-resource mapping (KEP-5004)
	// from it. Where a class's spec.extendedResourceName is the vendor's count resource
	// (nvidia.com/gpu), kube-scheduler serves that resource through DRA on every node whose
	// allocatable of it is 0 or absent (dra.ServedThroughDRA): the filter passes such DRA
	// nodes for a whole-GPU ask (allocation.WholeGPUs) when no other candidate fits HAMi's
	// way, and fails them for a share with the fix; bind binds there without HAMi's
	// annotations and lock; the webhook keeps a whole-GPU ask count-only (see
	// [Extender.Filter], [Extender.Bind], [Extender.Admit]). Readiness waits for its sync.
	// RBAC: deviceclasses get, list and watch ([ClusterRoleRules]). Nil means no mapping is
	// read: every node is fitted HAMi's way (for a cluster without resource.k8s.io/v1), which
	// fails the DRA nodes of a cluster that has a mapping.
	DeviceClasses resourceinformers.DeviceClassInformer
}

func (o Options) withDefaults() (Options, error) {
	if o.Vendor.Name == "" {
		o.Vendor = annotation.NVIDIA()
	}
	if o.Vendor.Name != annotation.VendorNVIDIA {
		if err := o.Vendor.Validate(annotation.PartHandshake); err != nil {
			return o, fmt.Errorf("validate options: %w: %w", ErrInvalidOptions, err)
		}
		if o.Vendor.Format != annotation.FormatJSON || o.Vendor.ToAllocateKey == "" || o.Vendor.AllocatedKey == "" {
			return o, fmt.Errorf("validate options: vendor %s: the extender needs a JSON register annotation and the to-allocate and allocated pod keys (annotation.NewVendor sets them): %w", o.Vendor.Name, ErrInvalidOptions)
		}
	}
	// NVIDIA's fit for NVIDIA, the generic fit for another vendor; a vendor HAMi fits with rules
	// of its own is refused (allocation.ErrVendorRules), never fitted generically.
	cfg, err := allocation.ConfigFor(o.Vendor, o.Config)
	if err != nil {
		return o, fmt.Errorf("validate options: %w: %w", ErrInvalidOptions, err)
	}
	o.Config = cfg
	if o.NodeLockTimeout < 0 || o.MaxBodyBytes < 0 {
		return o, fmt.Errorf("validate options: negative node lock timeout or body limit: %w", ErrInvalidOptions)
	}
	o.SchedulerName = cmp.Or(o.SchedulerName, DefaultSchedulerName)
	o.NodeLockTimeout = cmp.Or(o.NodeLockTimeout, nodelock.DefaultTimeout)
	o.NodeLockWait = cmp.Or(o.NodeLockWait, DefaultNodeLockWait)
	o.MaxBodyBytes = cmp.Or(o.MaxBodyBytes, DefaultMaxBodyBytes)
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.TrustedUsers == nil {
		o.TrustedUsers = slices.Clone(DefaultTrustedUsers)
	}
	if o.TrustedGroups == nil {
		o.TrustedGroups = slices.Clone(DefaultTrustedGroups)
	}
	if slices.Contains(o.TrustedUsers, "") || slices.Contains(o.TrustedGroups, "") {
		return o, fmt.Errorf("validate options: an empty trusted user or group would trust anonymous requests; remove it: %w", ErrInvalidOptions)
	}
	return o, nil
}
