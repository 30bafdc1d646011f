package draplugin

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/hamicore"
)

// Defaults of [Options].
const (
	// DefaultRegistrarDir is the kubelet's plugin registration folder.
	DefaultRegistrarDir = "/var/lib/kubelet/plugins_registry"
	// DefaultPluginDirBase + "/" + driver is the plugin's data folder (dra.sock, checkpoint).
	DefaultPluginDirBase = "/var/lib/kubelet/plugins"
	// DefaultCDIDir is where the transient CDI specs are written (containerd and CRI-O read it).
	DefaultCDIDir = "/var/run/cdi"
	// DefaultSliceSyncDelay is how long the ResourceSlice controller waits after a change
	// before it writes (the controller's default: 30 s), so that a burst of changes is one
	// write.
	DefaultSliceSyncDelay = 30 * time.Second
	// CDIVendor and CDIClass make the kind of the plugin's CDI specs, CDIVendor/CDIClass.
	CDIVendor = "k8s.hamireg.io"
	CDIClass  = "claim"
	// CheckpointFile is the name of the checkpoint of prepared claims in Options.PluginDir.
	CheckpointFile = "checkpoint.json"
)

// maxSocketPath is the longest path a unix socket can be bound at (sun_path is 108 bytes
// with the terminating NUL).
const maxSocketPath = 107

// Errors, for errors.Is.
var (
	// ErrInvalidOptions: New was given options it cannot run with.
	ErrInvalidOptions = errors.New("invalid DRA plugin options")
	// ErrRefused: Prepare refused a device (Options.Refuse said no, the device is not one of
	// the published GPUs, or it is unhealthy).
	ErrRefused = errors.New("claim refused")
	// ErrCheckpoint: the checkpoint of prepared claims cannot be read or written.
	ErrCheckpoint = errors.New("DRA checkpoint")
	// ErrCheckpointCorrupt (also an ErrCheckpoint): the checkpoint is not one this plugin
	// wrote (not JSON, truncated, a checksum that does not match its content, claims Prepare
	// could not have written). The plugin moves such a file aside and rebuilds it from the
	// claims' CDI specs; the error says where the file went and what was rebuilt.
	ErrCheckpointCorrupt = fmt.Errorf("corrupted %w", ErrCheckpoint)
	// ErrCDI: a CDI spec cannot be written or removed.
	ErrCDI = errors.New("CDI spec")
	// ErrAlreadyRunning: Run was called while the Plugin runs.
	ErrAlreadyRunning = errors.New("DRA plugin already running")
)

// Options configure a [Plugin].
type Options struct {
	// Profile is the driver name and device naming; required (dra.SDKProfile() or
	// dra.HAMiProfile()).
	Profile dra.Profile
	// Client reads claims and writes ResourceSlices; NodeName is the node's name (both
	// required); NodeUID is optional (looked up when empty).
	Client   kubernetes.Interface
	NodeName string
	NodeUID  types.UID
	// RegistrarDir is the kubelet's plugin registration folder. Default [DefaultRegistrarDir].
	RegistrarDir string
	// PluginDir holds dra.sock and the checkpoint ([CheckpointFile]). Default
	// [DefaultPluginDirBase]/<driver>.
	PluginDir string
	// CDIDir is where the transient CDI spec of each prepared claim goes. Default
	// [DefaultCDIDir].
	CDIDir string
	// Env shapes the HAMi-core edits (hamicore.ClaimResponse). New refuses what
	// hamicore.EnvOptions.Validate refuses, and the CDI device list strategies
	// (hamicore.ErrCDIUnsupported): a claim's own CDI spec carries its device list.
	Env hamicore.EnvOptions
	// PrepareStateDir makes Prepare create each claim's HAMi-core state folder on the host,
	// <HookPath>/vgpu/claims/<claim UID>, empty with mode 0777, and Unprepare remove it, as
	// nodeagent.HAMiCore does for containers. Set it when the plugin sees the host's
	// <HookPath>/vgpu at the same path. Default false: the folder is left to the host, and
	// the plugin touches no host folder but the CDI specs and its checkpoint.
	PrepareStateDir bool
	// SliceSyncDelay: see [DefaultSliceSyncDelay]. Negative: no delay (tests).
	SliceSyncDelay time.Duration
	// Refuse is asked before a claim is prepared, with the GPUs its results name: a non-nil
	// error refuses the claim (wrapped in [ErrRefused]). The node agent refuses GPUs the
	// device-plugin world owns or that hold a HAMi allocation. Nil: refuse none.
	Refuse func(ctx context.Context, gpus []annotation.Device) error
	// MIG creates the MIG device of a result that names a MIG placement (dra.Slices
	// publishes them for GPUs in MIG mode) at Prepare and destroys it at Unprepare: the node
	// agent's MIG realiser (package nodedra sets it). Nil: a claim with a MIG device is
	// refused ([ErrNoMIG]), and New fails when the checkpoint records MIG devices, which only
	// a realiser can destroy.
	MIG MIGDevices
	// OnError, when set, is called by [Plugin.HandleError] after it logged a background
	// error (publishing the ResourceSlice, the gRPC servers, a recovered checkpoint), for
	// instance to record an Event on the Node. Nil: the error is only logged.
	OnError func(ctx context.Context, err error, msg string)

	// DisableHealthService turns the kubelet's device health stream off
	// (kubeletplugin.HealthService(false)): the plugin then does not advertise the
	// DRAResourceHealth service, the kubelet does not call WatchHealthStatus, and device
	// health is only the slice's <driver>/unhealthy taint. Set it for a kubelet that is not
	// to be offered the service: one before 1.36, where the ResourceHealthStatus gate is
	// alpha and off (it never subscribes, the service is only advertised at registration),
	// or a cluster whose pods' status must not carry device health. Default false: health is
	// served, and a kubelet 1.36+ (ResourceHealthStatus beta, on) shows it in the pods'
	// status.containerStatuses[].allocatedResourcesStatus.
	DisableHealthService bool
	// HealthCheckTimeout is the lease the kubelet puts on each reported device health: a
	// device not reported again within it reads Unknown. The plugin re-sends the full state
	// every third of it. Default [DefaultHealthCheckTimeout] (30 s); at least 1 s (the wire
	// carries whole seconds).
	HealthCheckTimeout time.Duration
	// StaleClaimPeriod is how often Run checks the prepared claims against the API server
	// and unprepares the stale ones ([Plugin.Cleanup]), besides once when it starts. Zero:
	// [DefaultStaleClaimPeriod]; negative: never (not even at the start).
	StaleClaimPeriod time.Duration
	// Clock is the time source of the health reports (their LastUpdated and the re-send
	// ticker) and of the stale-claim cleanup, and names moved-aside checkpoints. Default:
	// the real clock.
	Clock clock.WithTicker
	// AfterCDISpec, when set, is called by Prepare after a claim's CDI spec (and state folder)
	// are written and before the checkpoint records the claim, with the plugin's lock held: a
	// process killed there leaves an orphan spec, which the next start adopts or removes. It
	// is a fault-injection point for crash tests. Nil: nothing is called.
	AfterCDISpec func(ctx context.Context, claim types.UID)
}

// Stats are a Plugin's counters.
type Stats struct {
	// Prepared and Unprepared count claims prepared and unprepared (idempotent repeats
	// included); Refused counts claims refused.
	Prepared, Unprepared, Refused uint64
	// SliceCreates, SliceUpdates and SliceDeletes are the ResourceSlice controller's writes,
	// summed over the plugin's runs.
	SliceCreates, SliceUpdates, SliceDeletes int64
	// HealthReports counts the device health reports sent to the kubelet (every stream's).
	HealthReports uint64
	// StaleUnprepared counts prepared claims the cleanup unprepared because the API server no
	// longer allocates them here; OrphansAdopted and OrphansRemoved count the CDI specs
	// without a checkpoint entry it adopted or removed; Cleanups counts Run's cleanup rounds.
	StaleUnprepared, OrphansAdopted, OrphansRemoved, Cleanups uint64
	// CheckpointRecoveries counts corrupted checkpoints moved aside and rebuilt.
	CheckpointRecoveries uint64
}

// Plugin is the DRA kubelet plugin of one node: it registers with the kubelet, publishes the
// node's GPUs as one ResourceSlice pool and prepares claims with HAMi-core's limits as CDI
// specs.
type Plugin struct {
	opts      Options
	syncDelay time.Duration
	ckptPath  string

	clock         clock.WithTicker
	cleanupPeriod time.Duration // negative: off

	// opMu serialises Prepare, Unprepare and the cleanup in this process (the helper does
	// too, but they may be called directly), and the flock on LockFile across processes
	// (Plugin.lock takes both); it is taken before mu and never while Refuse is waited for
	// under mu. ckptSum, the SHA-256 of the checkpoint as last read or written, is guarded
	// by it.
	opMu    sync.Mutex
	ckptSum [sha256.Size]byte

	mu          sync.Mutex
	gpus        []annotation.Device
	devices     []resourcev1.Device // of all slices, for Prepare
	slices      []resourceslice.Slice
	haveDevices bool
	devVersion  uint64 // bumped by SetDevices
	running     bool
	ctrl        *resourceslice.Controller
	pastSlices  resourceslice.Stats // the writes of the controllers of earlier runs
	claims      map[types.UID]preparedClaim
	recovery    error // New's checkpoint recovery, reported by Run

	prepared, unprepared, refused                             atomic.Uint64
	staleUnprepared, orphansAdopted, orphansRemoved, cleanups atomic.Uint64
	recoveries                                                atomic.Uint64

	// Device health for the kubelet (health.go).
	healthTimeout  time.Duration
	health         healthState // guarded by mu, but for its WaitGroup
	healthReports  atomic.Uint64
	healthWatchers atomic.Int64
}

var _ kubeletplugin.DRAPlugin = (*Plugin)(nil)

// New validates opts (errors wrap [ErrInvalidOptions]) and returns a Plugin; it starts
// nothing, but reads the checkpoint of the claims a previous process prepared in PluginDir.
// A corrupted checkpoint ([ErrCheckpointCorrupt]) is moved aside and rebuilt from the CDI
// specs (Run reports it); one that cannot be read or recovered is an error wrapping
// [ErrCheckpoint] that names the file.
func New(opts Options) (*Plugin, error) {
	if opts.Profile.Driver == "" {
		return nil, fmt.Errorf("%w: Options.Profile.Driver is empty: set Options.Profile to dra.SDKProfile() or dra.HAMiProfile()", ErrInvalidOptions)
	}
	if opts.Client == nil {
		return nil, fmt.Errorf("%w: Options.Client is nil: pass the node agent's Kubernetes client (it reads claims and writes ResourceSlices)", ErrInvalidOptions)
	}
	if opts.NodeName == "" {
		return nil, fmt.Errorf("%w: Options.NodeName is empty: set it to the node's name (the downward API's spec.nodeName)", ErrInvalidOptions)
	}
	if err := opts.Env.Validate(); err != nil {
		return nil, fmt.Errorf("%w: Options.Env: %w", ErrInvalidOptions, err)
	}
	if s, _ := hamicore.ParseDeviceListStrategies(opts.Env.DeviceListStrategy); s.AnyCDI() {
		return nil, fmt.Errorf("%w: Options.Env.DeviceListStrategy %q: %w: a claim's devices are listed in the claim's own CDI spec, which cannot name other CDI devices: use envvar or volume-mounts for DRA",
			ErrInvalidOptions, opts.Env.DeviceListStrategy, hamicore.ErrCDIUnsupported)
	}
	if t := opts.HealthCheckTimeout; t != 0 && t < time.Second {
		return nil, fmt.Errorf("%w: Options.HealthCheckTimeout %v: the kubelet takes whole seconds, give at least 1s (or 0 for %v)", ErrInvalidOptions, t, DefaultHealthCheckTimeout)
	}
	opts.RegistrarDir = cmp.Or(opts.RegistrarDir, DefaultRegistrarDir)
	opts.PluginDir = cmp.Or(opts.PluginDir, filepath.Join(DefaultPluginDirBase, opts.Profile.Driver))
	opts.CDIDir = cmp.Or(opts.CDIDir, DefaultCDIDir)
	for _, s := range []struct{ field, path string }{
		{"Options.PluginDir", filepath.Join(opts.PluginDir, "dra.sock")},
		{"Options.RegistrarDir", filepath.Join(opts.RegistrarDir, opts.Profile.Driver+"-reg.sock")},
	} {
		if len(s.path) > maxSocketPath {
			return nil, fmt.Errorf("%w: %s gives the socket path %s of %d bytes, a unix socket takes at most %d: choose a shorter folder", ErrInvalidOptions, s.field, s.path, len(s.path), maxSocketPath)
		}
	}
	p := &Plugin{
		opts:          opts,
		ckptPath:      filepath.Join(opts.PluginDir, CheckpointFile),
		clock:         defaultClock(opts.Clock),
		healthTimeout: cmp.Or(opts.HealthCheckTimeout, DefaultHealthCheckTimeout),
		cleanupPeriod: opts.StaleClaimPeriod,
	}
	if p.cleanupPeriod == 0 {
		p.cleanupPeriod = DefaultStaleClaimPeriod
	}
	p.health.changed = make(chan struct{})
	switch {
	case opts.SliceSyncDelay < 0:
		p.syncDelay = 0
	case opts.SliceSyncDelay == 0:
		p.syncDelay = DefaultSliceSyncDelay
	default:
		p.syncDelay = opts.SliceSyncDelay
	}
	claims, sum, err := readCheckpoint(p.ckptPath, opts.Profile.Driver)
	switch {
	case errors.Is(err, ErrCheckpointCorrupt):
		if err := p.recoverAtNew(); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	default:
		p.claims, p.ckptSum = claims, sum
	}
	if opts.MIG == nil && checkpointHasMIG(p.claims) {
		return nil, fmt.Errorf("%w: %w: the checkpoint %s records MIG devices of prepared claims, which Unprepare must destroy: set Options.MIG", ErrInvalidOptions, ErrNoMIG, p.ckptPath)
	}
	return p, nil
}

// Driver returns the plugin's driver name.
func (p *Plugin) Driver() string { return p.opts.Profile.Driver }

// SetDevices sets the scanned GPUs and their DRA devices (dra.Devices of the same scan):
// the slice follows them (written only when it changes), Prepare resolves device names
// through them, and the health reported to the kubelet follows their <driver>/unhealthy
// taints (see [Plugin.WatchHealthStatus]). It may be called before Run. It is SetSlices with
// one slice.
func (p *Plugin) SetDevices(gpus []annotation.Device, devices []resourcev1.Device) {
	p.SetSlices(gpus, []dra.Slice{{Devices: devices}})
}

// SetSlices sets the scanned GPUs and the slices of the node's pool (dra.Slices of the same
// scan: GPU devices, MIG devices and their counter sets): the pool's slices follow them, in
// order (written only when they change), and Prepare resolves device names through them. It
// may be called before Run.
func (p *Plugin) SetSlices(gpus []annotation.Device, slices []dra.Slice) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gpus = append([]annotation.Device(nil), gpus...)
	p.devices = nil
	p.slices = make([]resourceslice.Slice, len(slices))
	for i, s := range slices {
		out := resourceslice.Slice{}
		if s.SharedCounters != nil {
			out.SharedCounters = make([]resourcev1.CounterSet, len(s.SharedCounters))
			for j := range s.SharedCounters {
				s.SharedCounters[j].DeepCopyInto(&out.SharedCounters[j])
			}
		}
		if s.Devices != nil || s.SharedCounters == nil {
			out.Devices = make([]resourcev1.Device, len(s.Devices))
			for j := range s.Devices {
				s.Devices[j].DeepCopyInto(&out.Devices[j])
			}
			p.devices = append(p.devices, out.Devices...)
		}
		p.slices[i] = out
	}
	p.setHealthLocked(p.devices)
	p.haveDevices = true
	p.devVersion++
	if p.ctrl != nil {
		// The controller diffs against the stored slice: the same devices write nothing.
		p.ctrl.Update(p.resourcesLocked())
	}
}

// resourcesLocked is the desired state of the controller: one pool named after the node
// with the slices of the last SetSlices (SetDevices: one slice with the devices in their
// given order); nil before the first, so that a plugin that has not scanned yet does not
// publish an empty pool. p.mu is held.
func (p *Plugin) resourcesLocked() *resourceslice.DriverResources {
	if !p.haveDevices {
		return nil
	}
	return &resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		p.opts.NodeName: {Slices: p.slices},
	}}
}

// Run registers with the kubelet (kubeletplugin.Start), publishes the devices and serves
// Prepare and Unprepare until ctx ends; it returns nil then, after stopping everything it
// started, or early with the error that stopped it.
func (p *Plugin) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.running {
		p.mu.Unlock()
		return ErrAlreadyRunning
	}
	p.running = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.running = false
		p.mu.Unlock()
	}()
	logger := klog.FromContext(ctx)

	for _, dir := range []string{p.opts.RegistrarDir, p.opts.PluginDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("create plugin folder: %w", err)
		}
	}
	uid := p.opts.NodeUID
	if uid == "" {
		node, err := p.opts.Client.CoreV1().Nodes().Get(ctx, p.opts.NodeName, metav1.GetOptions{})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("look up node %s for its UID (the ResourceSlice's owner): %w", p.opts.NodeName, err)
		}
		uid = node.UID
	}
	p.startHealth()
	defer p.stopHealth()               // after the helper stopped: ends the health streams and waits for them
	stopCleanup := p.startCleanup(ctx) // cleanup.go
	defer stopCleanup()
	helper, err := kubeletplugin.Start(ctx, p,
		kubeletplugin.DriverName(p.opts.Profile.Driver),
		kubeletplugin.KubeClient(p.opts.Client),
		kubeletplugin.NodeName(p.opts.NodeName),
		kubeletplugin.NodeUID(uid),
		kubeletplugin.RegistrarDirectoryPath(p.opts.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(p.opts.PluginDir),
		kubeletplugin.HealthService(!p.opts.DisableHealthService),
		kubeletplugin.Serialize(true),
	)
	if err != nil {
		return fmt.Errorf("start DRA kubelet plugin %s: %w", p.opts.Profile.Driver, err)
	}
	defer helper.Stop()

	p.mu.Lock()
	resources, version := p.resourcesLocked(), p.devVersion
	p.mu.Unlock()
	delay := p.syncDelay
	ctrl, err := resourceslice.StartController(ctx, resourceslice.Options{
		DriverName:   p.opts.Profile.Driver,
		KubeClient:   p.opts.Client,
		Owner:        &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: p.opts.NodeName, UID: uid},
		Resources:    resources,
		SyncDelay:    &delay,
		ErrorHandler: p.HandleError,
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("start the ResourceSlice controller of %s: %w", p.opts.Profile.Driver, err)
	}
	p.mu.Lock()
	p.ctrl = ctrl
	if p.devVersion != version { // SetDevices ran while the controller started
		ctrl.Update(p.resourcesLocked())
	}
	p.mu.Unlock()
	logger.V(2).Info("DRA plugin running", "driver", p.opts.Profile.Driver, "node", p.opts.NodeName, "pluginDir", p.opts.PluginDir)

	<-ctx.Done()

	p.mu.Lock()
	p.ctrl = nil
	p.mu.Unlock()
	ctrl.Stop()
	s := ctrl.GetStats()
	p.mu.Lock()
	p.pastSlices.NumCreates += s.NumCreates
	p.pastSlices.NumUpdates += s.NumUpdates
	p.pastSlices.NumDeletes += s.NumDeletes
	p.mu.Unlock()
	logger.V(2).Info("DRA plugin stopped", "driver", p.opts.Profile.Driver)
	return nil
}

// HandleError implements kubeletplugin.DRAPlugin: it logs err, at error level, with whether
// it is recoverable (errors.Is(err, kubeletplugin.ErrRecoverable): the helper and the
// controller retry), and hands it to Options.OnError. A fatal error (the gRPC servers failed)
// is not acted upon here: the node agent, which owns the process, decides.
func (p *Plugin) HandleError(ctx context.Context, err error, msg string) {
	recoverable := errors.Is(err, kubeletplugin.ErrRecoverable)
	klog.FromContext(ctx).Error(err, msg, "driver", p.opts.Profile.Driver, "recoverable", recoverable)
	if p.opts.OnError != nil {
		p.opts.OnError(ctx, err, msg)
	}
}

// PreparedGPUs returns the UUIDs of the GPUs that prepared claims hold, with the claim UIDs.
func (p *Plugin) PreparedGPUs() map[string][]types.UID {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string][]types.UID)
	for uid, c := range p.claims {
		for _, d := range c.Devices {
			if !containsUID(out[d.UUID], uid) {
				out[d.UUID] = append(out[d.UUID], uid)
			}
		}
	}
	return out
}

// Claim returns the namespace and name of the prepared claim with UID uid; ok is false for a
// claim this plugin has not prepared (or has unprepared). The node monitor uses it to tie the
// claim's HAMi-core region (<HookPath>/vgpu/claims/<uid>/) to the pods that use the claim.
func (p *Plugin) Claim(uid types.UID) (claim types.NamespacedName, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.claims[uid]
	if !ok {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, true
}

func containsUID(uids []types.UID, uid types.UID) bool {
	for _, u := range uids {
		if u == uid {
			return true
		}
	}
	return false
}

// Stats returns the plugin's counters.
func (p *Plugin) Stats() Stats {
	p.mu.Lock()
	slices := p.pastSlices
	if p.ctrl != nil {
		s := p.ctrl.GetStats()
		slices.NumCreates += s.NumCreates
		slices.NumUpdates += s.NumUpdates
		slices.NumDeletes += s.NumDeletes
	}
	p.mu.Unlock()
	return Stats{
		Prepared:      p.prepared.Load(),
		Unprepared:    p.unprepared.Load(),
		Refused:       p.refused.Load(),
		SliceCreates:  slices.NumCreates,
		SliceUpdates:  slices.NumUpdates,
		SliceDeletes:  slices.NumDeletes,
		HealthReports: p.healthReports.Load(),

		StaleUnprepared:      p.staleUnprepared.Load(),
		OrphansAdopted:       p.orphansAdopted.Load(),
		OrphansRemoved:       p.orphansRemoved.Load(),
		Cleanups:             p.cleanups.Load(),
		CheckpointRecoveries: p.recoveries.Load(),
	}
}

// ClusterRoleRules are the RBAC rules the plugin needs: resourceslices (get, list, watch,
// create, update, delete), resourceclaims (get: the helper reads a claim before Prepare, and
// [Plugin.Cleanup] checks each prepared claim), nodes (get).
func ClusterRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{resourcev1.GroupName}, Resources: []string{"resourceslices"}, Verbs: []string{"get", "list", "watch", "create", "update", "delete"}},
		{APIGroups: []string{resourcev1.GroupName}, Resources: []string{"resourceclaims"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
	}
}
