package nodeagent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/hamicore"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/monitor"
	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/register"
)

// Source supplies the devices of the node. [github.com/hamireg/hamireg/nvmlscan.Scanner] is
// one; a vendor's own is a few lines (see the package example).
type Source interface {
	// Devices scans the node. devices are the devices to register, in any order, with Count
	// set to the split count and IDs that stay the same across restarts (see
	// annotation.Device). A negative Numa means the device's NUMA node is unknown: the
	// register annotation carries 0 (HAMi's value) and the kubelet gets no topology for it.
	// failed has one error per device that could not be read: the
	// agent logs it and records an Event on the Node, and the other devices still register.
	// err means the scan failed as a whole: the agent keeps what it published and retries.
	Devices(ctx context.Context) (devices []annotation.Device, failed []error, err error)
	// Changed returns a channel that is closed at the next change of the devices (a GPU
	// turning unhealthy or healthy again), after which the agent scans at once. Take it
	// before scanning; nil means the source never changes on its own (the agent still
	// rescans every Options.Period).
	Changed() <-chan struct{}
}

// TopologySource is a [Source] that also scores its devices' pairs for HAMi's topology-aware
// policy: nvmlscan's Scanner is one. PairScores gets the devices of the scan just made, in any
// order; scores has one entry per device (annotation.PairScore), warnings are pairs scored
// with a caveat (NVML's asymmetric link counts: recorded as [EventReasonAsymmetricLink]),
// and err means no scores this time.
type TopologySource interface {
	PairScores(ctx context.Context, devices []annotation.Device) (scores []annotation.PairScore, warnings []error, err error)
}

// Runner is a [Source] that has work of its own to run, such as nvmlscan's XID health watch:
// the agent runs it beside the rest and joins it.
type Runner interface {
	Run(ctx context.Context) error
}

// Defaults of [Options].
const (
	// DefaultPeriod is how often the agent rescans its source: HAMi's 30 s.
	DefaultPeriod = 30 * time.Second
	// DefaultRetryInitial is the first retry delay after a failed scan; it doubles up to the
	// period.
	DefaultRetryInitial = time.Second
	// EventComponent is the source component of the agent's Events.
	EventComponent = "hamireg-nodeagent"
)

// Reasons of the agent's Events.
const (
	// EventReasonDeviceFailed (Warning, on the Node): a device could not be read and is left
	// out of both channels.
	EventReasonDeviceFailed = "DeviceQueryFailed"
	// EventReasonScanFailed (Warning, on the Node): the source failed as a whole; what was
	// published stays.
	EventReasonScanFailed = "DeviceScanFailed"
	// EventReasonAllocateFailed (Warning, on the Pod): Allocate could not hand out the pod's
	// devices; its bind-phase is failed and the node lock released.
	EventReasonAllocateFailed = "AllocateFailed"
	// EventReasonTopologyFailed (Warning, on the Node): the topology scores could not be
	// computed; the register annotation is still published, the score annotation keeps its
	// last value.
	EventReasonTopologyFailed = "TopologyScoreFailed"
	// EventReasonAsymmetricLink (Warning, on the Node): two GPUs see different numbers of
	// links to each other and the pair scores 0 (HAMi master's reason).
	EventReasonAsymmetricLink = "AsymmetricGPUP2PLink"
)

// Options configure an [Agent]. The zero value means HAMi's chart defaults; each field
// names its default.
type Options struct {
	// Vendor is the device vendor: the register annotation key (RegisterKey, required), the
	// kubelet resource name (ResourceName, required) and the pod annotation of Allocate
	// (ToAllocateKey). A vendor whose ToAllocateKey is "" (HAMi's scheduler writes no pod
	// device list for it: Vastai, biren, AMDGPU) is served without HAMi's pod protocol: no
	// node lock, entry or bind-phase; the kubelet's replica IDs are mapped to the node's
	// devices and handed to the Allocator (see [ContainerRequest]). Default
	// annotation.NVIDIA(). Register.Vendor and Kubelet.Vendor must be unset or equal to it.
	Vendor annotation.Vendor
	// Version is the HAMi release whose wire shape and pod annotation rules the agent follows.
	// Default annotation.VersionMaster. Register.Shape must be unset or equal to it.
	Version annotation.Version
	// Period is how often the source is rescanned besides its Changed notifications.
	// Default [DefaultPeriod] (30 s).
	Period time.Duration
	// Register configures the register annotation writer (retry delays, metrics). Vendor,
	// Shape, Clock and EventRecorder are the agent's.
	Register register.Options
	// Kubelet configures the device plugin (plugin folder, socket, mode, and NUMATopology:
	// HAMi v2.10.0's enableNumaTopology, off by default, which sends each GPU's NUMA node
	// with its virtual devices to the kubelet's Topology Manager). Vendor, Clock and
	// the Allocate, GetPreferredAllocation and PreStartContainer callbacks are the agent's:
	// a vendor's answer to Allocate is Options.Allocator.
	Kubelet kubeletplugin.Options
	// Allocator answers Allocate for one container once the protocol has found its devices:
	// env, mounts, device nodes, CDI devices, annotations. Default: the Source, when it
	// implements [Allocator], else, for NVIDIA only, [HAMiCore]{} (HAMi-core's environment,
	// the chart's settings, no state folder). A vendor other than NVIDIA must have one: New
	// refuses it without (HAMi-core's CUDA environment and libvgpu.so mounts mean nothing to
	// another vendor's container), naming the method set it looked for. A [HAMiCore]'s Env
	// is checked by New (hamicore.EnvOptions.Validate), and a CDI device list strategy is
	// refused with Options.MIG (hamicore.ErrCDIUnsupported).
	Allocator Allocator
	// Clock drives the rescan and retry timers and the lock times. Default clock.RealClock{}.
	Clock clock.WithTicker
	// TopologyScores publishes the source's topology scores in the Node annotation
	// hami.io/node-nvidia-score, in the same merge patch as the register annotation, for HAMi's
	// topology-aware GPU policy: HAMi's device plugin does so only with
	// ENABLE_TOPOLOGY_SCORE=true (its chart sets that only when the default GPU policy is
	// exactly topology-aware). The source must implement [TopologySource] and the vendor be
	// NVIDIA (HAMi scores NVIDIA GPUs' NVLink and PCIe links only). A failed scoring is logged
	// and recorded as [EventReasonTopologyFailed] and never holds back the register
	// annotation (HAMi's loses both). Default false: the score annotation is not touched.
	TopologyScores bool
	// EventRecorder records the agent's Events (Node: failed scans and devices, failed
	// register writes; Pod: failed allocations). Default: while Run runs, a
	// broadcaster of its own sends them to the client's Events API (source component
	// [EventComponent]). Pass &record.FakeRecorder{} to record none.
	EventRecorder record.EventRecorder
	// MIG realises the MIG devices of containers whose devices are on GPUs in MIG mode (the
	// scanned devices' Mode "mig"): nvmlscan's MIG manager on a node. Allocate creates each
	// reservation of hami.io/vgpu-mig-allocations through it, and the agent releases the MIG
	// devices no live reservation owns every MIGReconcilePeriod (see the package
	// documentation: the agent owns every MIG device on the GPUs it registers in MIG mode).
	// Default nil: a container whose devices are on a GPU in MIG mode fails with [ErrMIG]
	// naming Options.MIG. NVIDIA only: New refuses it for another vendor. The agent reads the
	// node's live pods from its pod informer (see the package documentation).
	MIG MIGInstances
	// MIGReconcilePeriod is how often the MIG devices no live reservation owns are released
	// (with Options.MIG). Default [DefaultMIGReconcilePeriod] (5 s, HAMi's).
	MIGReconcilePeriod time.Duration
	// Registerer, when set, receives the agent's metrics: hamireg_nodeagent_allocations_total,
	// hamireg_nodeagent_allocate_errors_total by kind (the Allocate class), scans_total by
	// result, device_failures_total and annotation_decode_failures_total, labelled with the
	// vendor; and, unless Register.Registerer is set, the register writer's
	// (hamireg_register_*: writes, heals, no-ops, failures). Nil means no metrics.
	Registerer prometheus.Registerer
	// NodeCapacity keeps the memory and cores of the node's healthy devices in the Node's
	// status capacity and allocatable, under the vendor's memory and core resource names
	// (Vendor.ResourceMemoryName and ResourceCoreName: nvidia.com/gpumem in MiB and
	// nvidia.com/gpucores for NVIDIA), as HAMi's PR #2874 (--report-node-capacity) does, for
	// kubectl describe node, kube-state-metrics and autoscaler node templates. The values are
	// [NodeCapacityOf] the devices the kubelet counts: Devmem as the register annotation
	// carries it (after memory scaling) and Devcore. They are written by a merge patch of the
	// Node's status subresource only when they change (the first scan compares with the Node,
	// so a restart writes nothing new); a failed write is logged and retried at the next scan.
	// It needs patch on nodes/status ([ClusterRoleRulesFor]). The register annotation stays
	// what schedulers read; kube-scheduler must keep ignoring these resources (the
	// extender's managedResources with ignoredByScheduler, or NodeResourcesFit's
	// ignoredResources), and the kubelet's admission then counts them against pods that ask
	// them. New refuses a vendor with neither name. Default false: the status is not touched.
	NodeCapacity bool
	// DRA, when set, is the agent's DRA world: a DRA driver beside the device plugin that
	// publishes some GPUs as a ResourceSlice and prepares their claims, with one owner per GPU
	// (see [DRA] and the package documentation's "DRA" section). Package
	// github.com/hamireg/hamireg/nodeagent/nodedra builds one; only programs that import it
	// link the DRA libraries. NVIDIA only: New refuses it for another vendor. Nil: no DRA.
	DRA DRA
	// Monitor, when set, runs HAMi's node monitor beside the agent (package
	// github.com/hamireg/hamireg/monitor, what HAMi's vGPUmonitor container does): it reads
	// the HAMi-core regions under Monitor.Root, serves HAMi's per-container families on
	// Registerer and runs the priority feedback. The agent lends it its pod informer of the
	// node (no second informer, no cluster-wide pod cache) and, when the DRA world resolves
	// claims (nodedra's does), the DRA world's prepared claims; Monitor.NodeName and Clock
	// default to the agent's. [Agent.Monitor] returns it, for its readiness.
	Monitor *monitor.Options
}

// Stats are an Agent's counters since New, for tests and readiness checks.
type Stats struct {
	// Scans counts successful scans of the source; ScanFailures failed ones.
	Scans, ScanFailures uint64
	// DeviceFailures counts devices left out of a scan because they could not be read.
	DeviceFailures uint64
	// Allocations counts containers whose devices Allocate handed out; AllocateFailures the
	// containers it refused.
	Allocations, AllocateFailures uint64
	// PodsCompleted counts pods whose last container was served: bind-phase success and the
	// node lock released.
	PodsCompleted uint64
	// NodeCapacityPatches counts the patches of the Node's status that Options.NodeCapacity
	// sent and the API server accepted.
	NodeCapacityPatches uint64
}

// Agent is the node side of HAMi's protocol for one node: it keeps the register annotation
// (channel 2) and the kubelet's device count (channel 1) equal to one scan of its [Source],
// and serves the kubelet's Allocate from the scheduler's pod annotations. Create it with
// [New] and call [Agent.Run].
type Agent struct {
	client  kubernetes.Interface
	node    string
	source  Source
	vendor  annotation.Vendor
	version annotation.Version
	period  time.Duration
	alloc   Allocator
	// topology scores the devices when Options.TopologyScores is set; nil otherwise.
	topology TopologySource
	clock    clock.WithTicker

	writer *register.Writer
	plugin *kubeletplugin.Plugin
	locks  *nodelock.Locker
	events *forwardRecorder
	// backoff is the retry schedule of Allocate's requests (apiBackoff; shorter in tests).
	backoff wait.Backoff
	// mig realises MIG devices (Options.MIG), nil without; migPeriod is the release period.
	mig       MIGInstances
	migPeriod time.Duration
	// devices are the devices of the last scan, nil before the first.
	devices atomic.Pointer[[]annotation.Device]
	// dra is the DRA side (Options.DRA), nil without.
	dra *draState
	// monitor is the node monitor of Options.Monitor, nil without it.
	monitor *monitor.Monitor
	// capacity writes the Node's device capacity (Options.NodeCapacity), nil without; only
	// the scan loop uses it.
	capacity *capacityWriter
	// pods is the node's pod informer, nil unless MIG or DRA reads it; Run waits for its sync
	// before the MIG loop, the DRA world and the kubelet registration start.
	pods *nodePods
	// migCreated are the MIG devices the agent created lately, by MIG UUID (under allocMu).
	migCreated map[string]migCreated

	running atomic.Bool
	// allocMu serialises Allocate calls: each reads and rewrites the pod's annotations.
	allocMu sync.Mutex
	// cleanupAt is when an Allocate last failed without finishing the protocol (the API server
	// did not answer): the cleanup loop then fails and unlocks the pod the lock named then.
	// Zero when nothing is pending. cleanupKick wakes the loop.
	// cleanupDone holds a pod whose last container was served but whose bind-phase success or
	// lock release did not go through: the loop completes it instead.
	cleanupMu   sync.Mutex
	cleanupAt   time.Time
	cleanupDone types.NamespacedName
	cleanupKick chan struct{}
	// lastFailed is the text of the last scan's device failures, to record an Event only
	// when they change. Only the scan loop uses it. lastTopology is the same for the
	// topology scoring's error and warnings.
	lastFailed, lastTopology string

	metrics *metrics
	// probe is what Healthy and Ready read of the current Run.
	probe probeState

	stats struct {
		scans, scanFailures, deviceFailures, allocations, allocateFailures, podsCompleted, capacityPatches atomic.Uint64
	}
}

// New returns an Agent for node nodeName that publishes the devices of source. client needs
// the permissions of [ClusterRoleRules]. New validates its arguments and the options of the
// parts (errors wrap [ErrInvalidOptions], or register's [register.ErrNoNodeName] and
// [register.ErrInvalidNodeName]); it starts nothing and sends no request.
func New(client kubernetes.Interface, nodeName string, source Source, opts Options) (*Agent, error) {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("new node agent: "+format+": %w", append(args, ErrInvalidOptions)...)
	}
	if client == nil {
		return nil, invalid("nil client")
	}
	if source == nil {
		return nil, invalid("nil device source")
	}
	vendor := cmp.Or(opts.Vendor, annotation.NVIDIA())
	if opts.Register.Vendor != (annotation.Vendor{}) && opts.Register.Vendor != vendor {
		return nil, invalid("Register.Vendor %q differs from Vendor %q", opts.Register.Vendor.Name, vendor.Name)
	}
	if opts.Kubelet.Vendor != (annotation.Vendor{}) && opts.Kubelet.Vendor != vendor {
		return nil, invalid("Kubelet.Vendor %q differs from Vendor %q", opts.Kubelet.Vendor.Name, vendor.Name)
	}
	if opts.Register.Shape != annotation.VersionMaster && opts.Register.Shape != opts.Version {
		return nil, invalid("Register.Shape %d differs from Version %d", int(opts.Register.Shape), int(opts.Version))
	}
	if opts.Period < 0 {
		return nil, invalid("negative Period %v", opts.Period)
	}
	if opts.MIGReconcilePeriod < 0 {
		return nil, invalid("negative MIGReconcilePeriod %v", opts.MIGReconcilePeriod)
	}
	if opts.Kubelet.Allocate != nil || opts.Kubelet.GetPreferredAllocation != nil || opts.Kubelet.PreStartContainer != nil {
		return nil, invalid("the Kubelet callbacks are the agent's: leave Kubelet.Allocate, GetPreferredAllocation and PreStartContainer unset and give the container's answer as Options.Allocator (the agent runs HAMi's protocol around it)")
	}
	if err := checkVendorOptions(vendor, source, opts); err != nil {
		return nil, invalid("%w", err)
	}
	if err := checkHAMiCore(opts); err != nil {
		return nil, invalid("%w", err)
	}
	a := &Agent{
		client:  client,
		node:    nodeName,
		source:  source,
		vendor:  vendor,
		version: opts.Version,
		period:  cmp.Or(opts.Period, DefaultPeriod),
		alloc:   opts.Allocator,
		clock:   opts.Clock,
		events:  &forwardRecorder{},
		backoff: apiBackoff,

		mig:       opts.MIG,
		migPeriod: cmp.Or(opts.MIGReconcilePeriod, DefaultMIGReconcilePeriod),

		cleanupKick: make(chan struct{}, 1),
		migCreated:  map[string]migCreated{},
	}
	if a.clock == nil {
		a.clock = clock.RealClock{}
	}
	if opts.TopologyScores {
		ts, ok := source.(TopologySource)
		switch {
		case !ok:
			return nil, invalid("TopologyScores needs a source that implements TopologySource (%T does not)", source)
		case vendor.ScoreKey == "":
			return nil, invalid("TopologyScores needs a vendor with a ScoreKey (%q has none)", vendor.Name)
		}
		a.topology = ts
	}
	if opts.NodeCapacity {
		c, err := newCapacityWriter(client.CoreV1(), nodeName, vendor)
		if err != nil {
			return nil, invalid("%w", err)
		}
		a.capacity = c
	}
	if a.alloc == nil {
		if sa, ok := source.(Allocator); ok {
			a.alloc = sa
		} else {
			a.alloc = HAMiCore{} // NVIDIA: checkVendorOptions refused the others
		}
	}
	if opts.EventRecorder != nil {
		a.events.set(opts.EventRecorder)
	}

	m, err := newMetrics(opts.Registerer, vendor.Name)
	if err != nil {
		return nil, fmt.Errorf("new node agent: %w", err)
	}
	a.metrics = m
	ro := opts.Register
	if ro.Registerer == nil {
		ro.Registerer = opts.Registerer
	}
	ro.Vendor, ro.Shape, ro.Clock, ro.EventRecorder = vendor, opts.Version, a.clock, a.events
	w, err := register.New(client, nodeName, ro)
	if err != nil {
		return nil, partError(err)
	}
	a.writer = w

	ko := opts.Kubelet
	ko.Vendor, ko.Clock = vendor, a.clock
	ko.Allocate = a.allocate
	if vendor.ToAllocateKey != "" { // without the scheduler's choice there is nothing to prefer
		ko.GetPreferredAllocation = a.preferredAllocation
	}
	p, err := kubeletplugin.New(ko)
	if err != nil {
		return nil, partError(err)
	}
	a.plugin = p

	l, err := nodelock.New(client.CoreV1(), nodelock.Options{Clock: a.clock})
	if err != nil {
		return nil, partError(err)
	}
	a.locks = l

	if opts.DRA != nil {
		a.dra = &draState{world: opts.DRA}
	}
	if a.mig != nil || a.dra != nil || opts.Monitor != nil {
		a.pods = newNodePods(a)
	}
	if opts.Monitor != nil {
		mon, err := newMonitor(a, opts)
		if err != nil {
			return nil, invalid("Monitor: %w", err)
		}
		a.monitor = mon
	}
	return a, nil
}

// allocatorMethod is the method set New looks for on a source of a vendor other than NVIDIA.
const allocatorMethod = "Allocate(context.Context, nodeagent.ContainerRequest) (allocation.Response, error)"

// checkVendorOptions refuses what the agent cannot do for vendor: HAMi-core's answer, MIG,
// topology scores and DRA are NVIDIA's. The error names the fix.
func checkVendorOptions(vendor annotation.Vendor, source Source, opts Options) error {
	if vendor.Name == annotation.NVIDIA().Name {
		return nil
	}
	if opts.Allocator == nil {
		if _, ok := source.(Allocator); !ok {
			hint := "implement it on the source or set Options.Allocator"
			if t := reflect.TypeOf(source); t.Kind() != reflect.Pointer && reflect.PointerTo(t).Implements(reflect.TypeFor[Allocator]()) {
				hint = fmt.Sprintf("*%v has it (a pointer receiver), %v does not: pass &%v instead of %v", t, t, t, t)
			}
			return fmt.Errorf("vendor %q needs an Allocator (HAMi-core's NVIDIA environment is the default for NVIDIA only): the source %T has no method %s: %s",
				vendor.Name, source, allocatorMethod, hint)
		}
	}
	switch {
	case opts.MIG != nil:
		return fmt.Errorf("no MIG for vendor %q: Options.MIG realises NVIDIA MIG devices only; leave it nil", vendor.Name)
	case opts.DRA != nil:
		return fmt.Errorf("no DRA for vendor %q: Options.DRA serves NVIDIA GPUs only (HAMi-core's limits in the claims' CDI specs); leave it nil", vendor.Name)
	case opts.TopologyScores:
		return fmt.Errorf("no topology scores for vendor %q: Options.TopologyScores scores NVIDIA GPUs' links only; leave it false", vendor.Name)
	}
	return nil
}

// checkHAMiCore checks the options of the default Allocator (opts.Allocator a HAMiCore, or
// nil for NVIDIA): its Env as hamicore.EnvOptions.Validate does, and no CDI device list
// strategy with Options.MIG (hamicore.ErrCDIUnsupported): the MIG instances are created at
// Allocate, after the host's CDI spec was written, so the runtime could not resolve them.
func checkHAMiCore(opts Options) error {
	var env hamicore.EnvOptions
	switch h := opts.Allocator.(type) {
	case HAMiCore:
		env = h.Env
	case *HAMiCore:
		if h == nil {
			return errors.New("Allocator is a nil *HAMiCore")
		}
		env = h.Env
	default:
		return nil
	}
	if err := env.Validate(); err != nil {
		return fmt.Errorf("Allocator HAMiCore.Env: %w", err)
	}
	if s, _ := hamicore.ParseDeviceListStrategies(env.DeviceListStrategy); s.AnyCDI() && opts.MIG != nil {
		return fmt.Errorf("Allocator HAMiCore.Env.DeviceListStrategy %q with Options.MIG: %w: the MIG instances are created at Allocate, after the host's CDI spec was written, so the container runtime could not resolve their CDI names: use envvar or volume-mounts on a MIG node",
			env.DeviceListStrategy, hamicore.ErrCDIUnsupported)
	}
	return nil
}

// partError wraps the error of a part's New; an invalid option of a part is also the
// agent's [ErrInvalidOptions].
func partError(err error) error {
	if errors.Is(err, ErrInvalidOptions) {
		return fmt.Errorf("new node agent: %w", err)
	}
	if errors.Is(err, register.ErrInvalidOptions) || errors.Is(err, kubeletplugin.ErrInvalidOptions) || errors.Is(err, nodelock.ErrInvalidOptions) {
		return fmt.Errorf("new node agent: %w", invalidPartError{err})
	}
	return fmt.Errorf("new node agent: %w", err)
}

// invalidPartError is a part's invalid-options error that is also the agent's: its text is the
// part's, and it unwraps to both.
type invalidPartError struct{ err error }

func (e invalidPartError) Error() string   { return e.err.Error() }
func (e invalidPartError) Unwrap() []error { return []error{e.err, ErrInvalidOptions} }

// NodeName returns the name of the agent's Node.
func (a *Agent) NodeName() string { return a.node }

// Writer returns the agent's register annotation writer (channel 2), for its Stats.
func (a *Agent) Writer() *register.Writer { return a.writer }

// Plugin returns the agent's device plugin (channel 1), for its Stats and socket path.
func (a *Agent) Plugin() *kubeletplugin.Plugin { return a.plugin }

// Stats returns the agent's counters.
func (a *Agent) Stats() Stats {
	s := &a.stats
	return Stats{
		Scans: s.scans.Load(), ScanFailures: s.scanFailures.Load(), DeviceFailures: s.deviceFailures.Load(),
		Allocations: s.allocations.Load(), AllocateFailures: s.allocateFailures.Load(), PodsCompleted: s.podsCompleted.Load(),
		NodeCapacityPatches: s.capacityPatches.Load(),
	}
}

// Run runs the agent until ctx ends, then returns nil once every goroutine it started has
// returned; it returns early with the error of a part that cannot go on (the kubelet socket
// missing, the kubelet rejecting the registration, a [Runner] source failing), after
// stopping the others. It:
//
//   - scans the source at once, every Options.Period and whenever its Changed channel
//     closes, and hands each scan to both channels, so that a GPU turning unhealthy or
//     healthy again reaches the annotation and the kubelet within a scan's time;
//   - keeps the register annotation right (package register: one write per change, drift
//     healed from the Node's watch);
//   - registers with the kubelet only once the annotation carries the first scan, so that
//     the scheduler never sees a device count without the devices behind it;
//   - serves Allocate with HAMi's protocol (see the package documentation);
//   - with Options.MIG or Options.DRA, runs one informer of the node's pods (field selector
//     spec.nodeName) and waits for its first LIST before registering with the kubelet,
//     releasing MIG devices or running the DRA world;
//   - with Options.MIG, releases every MIGReconcilePeriod the MIG devices no live reservation
//     owns;
//   - runs the source, if it is a [Runner];
//   - with Options.Monitor, runs the node monitor once the pod informer synced;
//   - with Options.DRA, runs the DRA world, which publishes the scan's DRA devices as a
//     ResourceSlice and prepares claims (see the package documentation's "DRA").
//
// [Agent.Healthy] and [Agent.Ready] report on the Run in progress (or the last one).
// Calling Run while another Run has not returned gives [ErrAlreadyRunning].
func (a *Agent) Run(ctx context.Context) error {
	if !a.running.CompareAndSwap(false, true) {
		return fmt.Errorf("run node agent of node %q: %w", a.node, ErrAlreadyRunning)
	}
	defer a.running.Store(false)
	a.probe.start(a.plugin.Stats().Sends)
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "node", klog.KRef("", a.node))
	ctx = klog.NewContext(ctx, logger)
	logger.Info("Starting node agent", "vendor", a.vendor.Name, "resourceName", a.vendor.ResourceName, "period", a.period)

	if a.events.get() == nil {
		b := record.NewBroadcaster(record.WithContext(ctx))
		defer b.Shutdown()
		b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.client.CoreV1().Events("")})
		a.events.set(b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: EventComponent, Host: a.node}))
		defer a.events.set(nil)
	}

	// The parts run side by side; the first one that fails stops the others, and its error
	// is Run's.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	part := func(f func(context.Context) error) {
		wg.Go(func() {
			if err := f(ctx); err != nil && ctx.Err() == nil {
				once.Do(func() { first = err; a.probe.fail(err) })
				cancel(err)
			}
		})
	}
	if r, ok := a.source.(Runner); ok {
		part(func(ctx context.Context) error {
			if err := r.Run(ctx); err != nil {
				return fmt.Errorf("run device source: %w", err)
			}
			return nil
		})
	}
	part(a.writer.Run)
	// podsSynced waits for the node's pod informer, when there is one: MIG's release, DRA and
	// the kubelet's Allocate (MIG's ownership checks) read it, and never before it synced.
	podsSynced := func(context.Context) bool { return true }
	if a.pods != nil {
		synced := make(chan struct{})
		part(func(ctx context.Context) error { a.pods.run(ctx); return nil })
		part(func(ctx context.Context) error {
			if a.pods.waitSynced(ctx) {
				close(synced)
			}
			return nil
		})
		podsSynced = func(ctx context.Context) bool {
			select {
			case <-synced:
				return true
			case <-ctx.Done():
				return false
			}
		}
	}
	part(func(ctx context.Context) error {
		logger.Info("Waiting for the register annotation before registering with the kubelet", "key", a.vendor.RegisterKey)
		if ctx.Err() != nil || a.writer.WaitForSync(ctx) != nil || !podsSynced(ctx) {
			return nil //nolint:nilerr // WaitForSync fails only when ctx ends: Run is stopping
		}
		logger.Info("Register annotation in place, registering with the kubelet")
		if err := a.plugin.Run(ctx); err != nil {
			return fmt.Errorf("run device plugin: %w", err)
		}
		return nil
	})
	part(func(ctx context.Context) error { a.scanLoop(ctx); return nil })
	part(func(ctx context.Context) error { a.cleanupLoop(ctx); return nil })
	if a.mig != nil {
		part(func(ctx context.Context) error {
			if podsSynced(ctx) {
				a.migLoop(ctx)
			}
			return nil
		})
	}
	if a.monitor != nil {
		part(func(ctx context.Context) error { return a.runMonitor(ctx, podsSynced) })
	}
	if a.dra != nil {
		part(func(ctx context.Context) error {
			if !podsSynced(ctx) {
				return nil
			}
			if err := a.dra.world.Run(ctx, draHost{a}); err != nil {
				return fmt.Errorf("run DRA world: %w", err)
			}
			return nil
		})
	}
	wg.Wait()
	a.probe.stop(first)
	return first
}

// scanLoop scans the source and hands every scan to both channels, until ctx ends.
func (a *Agent) scanLoop(ctx context.Context) {
	logger := klog.FromContext(ctx)
	timer := a.clock.NewTimer(a.period)
	defer timer.Stop()
	var retry time.Duration
	for {
		changed := a.source.Changed()
		wait := a.period
		if err := a.scan(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			retry = min(max(2*retry, DefaultRetryInitial), a.period)
			wait = retry
			logger.Error(err, "Failed to scan devices; keeping the devices published", "retryIn", wait)
		} else {
			retry = 0
		}
		if !timer.Stop() {
			select { // drain a timer that fired while we scanned
			case <-timer.C():
			default:
			}
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-timer.C():
		case <-changed:
			logger.V(2).Info("Devices changed, rescanning")
		}
	}
}

// scan runs one scan and publishes it.
func (a *Agent) scan(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	a.probe.scanStarted(a.clock.Now()) // the source's call only: a slow API server is no hang
	devs, failed, err := a.source.Devices(ctx)
	a.probe.scanDone(a.clock.Now(), err)
	if err != nil {
		a.stats.scanFailures.Add(1)
		a.metrics.scanned(err, 0)
		if ctx.Err() == nil {
			a.events.Event(a.nodeRef(), corev1.EventTypeWarning, EventReasonScanFailed, truncate(err.Error()))
		}
		return fmt.Errorf("scan devices of node %q: %w", a.node, err)
	}
	a.stats.scans.Add(1)
	a.stats.deviceFailures.Add(uint64(len(failed)))
	a.metrics.scanned(nil, len(failed))
	msgs := make([]string, 0, len(failed))
	for _, f := range failed {
		logger.Error(f, "Device left out: it could not be read; the other devices register")
		msgs = append(msgs, f.Error())
	}
	if text := strings.Join(msgs, "; "); text != a.lastFailed {
		a.lastFailed = text
		if text != "" {
			a.events.Event(a.nodeRef(), corev1.EventTypeWarning, EventReasonDeviceFailed,
				truncate(fmt.Sprintf("%d device(s) left out of the registration: %s", len(failed), text)))
		}
	}
	healthy := 0
	for _, d := range devs {
		if d.Health {
			healthy++
		}
	}
	logger.V(3).Info("Scanned devices", "devices", len(devs), "healthy", healthy, "failed", len(failed))
	devs = slices.Clone(devs)
	a.devices.Store(&devs)
	reg, kube := a.publishDRA(ctx, devs)
	reg = knownNUMA(reg)
	if a.topology != nil {
		a.publishWithScores(ctx, reg)
	} else {
		a.writer.SetDevices(reg)
	}
	a.plugin.SetDevices(kube)
	if a.capacity != nil {
		patched, err := a.capacity.update(ctx, NodeCapacityOf(kube))
		if patched {
			a.stats.capacityPatches.Add(1)
		}
		if err != nil && ctx.Err() == nil {
			logger.Error(err, "Failed to update the node's device capacity; retrying at the next scan")
		}
	}
	return nil
}

// knownNUMA returns devs with a negative (unknown) Numa written as 0, HAMi's value for an
// unknown NUMA node in the register annotation; devs itself is not modified. The kubelet's
// devices keep the negative value: no topology (kubeletplugin.VirtualDevices).
func knownNUMA(devs []annotation.Device) []annotation.Device {
	if !slices.ContainsFunc(devs, func(d annotation.Device) bool { return d.Numa < 0 }) {
		return devs
	}
	out := slices.Clone(devs)
	for i := range out {
		out[i].Numa = max(out[i].Numa, 0)
	}
	return out
}

// publishWithScores scores devs and hands both annotations to the writer; when scoring fails
// the devices are published alone.
func (a *Agent) publishWithScores(ctx context.Context, devs []annotation.Device) {
	logger := klog.FromContext(ctx)
	scores, warnings, err := a.topology.PairScores(ctx, slices.Clone(devs))
	var text string
	switch {
	case err != nil:
		text = err.Error()
		logger.Error(err, "Topology scores not computed; publishing the devices without them")
		a.writer.SetDevices(devs)
	default:
		msgs := make([]string, 0, len(warnings))
		for _, w := range warnings {
			msgs = append(msgs, w.Error())
		}
		text = strings.Join(msgs, "; ")
		a.writer.SetDevicesAndScores(devs, scores)
	}
	if text == a.lastTopology || ctx.Err() != nil {
		return
	}
	a.lastTopology = text
	switch {
	case err != nil:
		a.events.Event(a.nodeRef(), corev1.EventTypeWarning, EventReasonTopologyFailed,
			truncate("topology scores not computed, hami.io/node-nvidia-score keeps its last value: "+text))
	case text != "":
		a.events.Event(a.nodeRef(), corev1.EventTypeWarning, EventReasonAsymmetricLink, truncate(text))
	}
}

// nodeRef is the object the agent's Node Events are about; the kubelet uses the node name as
// the UID of its own Node Events, so kubectl describe node shows them.
func (a *Agent) nodeRef() *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", Name: a.node, UID: types.UID(a.node)}
}

// maxEventMessage bounds Event messages (errors from NVML or the API can be long).
const maxEventMessage = 1024

func truncate(s string) string {
	if len(s) <= maxEventMessage {
		return s
	}
	return s[:maxEventMessage-3] + "..."
}
