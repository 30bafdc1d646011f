package nodedra

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
	"github.com/hamireg/hamireg/nodeagent"
)

// Sentinel errors: test with errors.Is.
var (
	// ErrInvalidOptions means [New] was given options it cannot work with. An invalid option
	// of the DRA plugin also matches draplugin.ErrInvalidOptions.
	ErrInvalidOptions = errors.New("invalid DRA options")
	// ErrNotRunning means a claim reached Prepare while the world was not run by a node
	// agent, so the ownership check has no view of the node's pods.
	ErrNotRunning = errors.New("DRA world not running under a node agent")
)

// Options configure a [World].
type Options struct {
	// Plugin configures the DRA kubelet plugin: Profile (required), folders, Env. Client and
	// NodeName are New's arguments; Refuse is the world's ownership check and must be left
	// nil; OnError, if set, is called after the agent recorded the error as an Event.
	Plugin draplugin.Options
	// GPUs selects the GPUs the DRA world owns, by UUID or NVML index ("GPU-…" or "3").
	// Empty: all of them. The others stay in the device-plugin world. GPUs in MIG mode are
	// never DRA's, even when listed.
	GPUs []string
}

// World is the DRA world of one node agent: a DRA kubelet plugin (package draplugin) that
// publishes the GPUs it owns as one ResourceSlice pool and prepares their claims, with the
// node agent's ownership check at Prepare. Give it to the agent as nodeagent.Options.DRA,
// which runs it.
type World struct {
	plugin  *draplugin.Plugin
	profile dra.Profile
	// all is set when Options.GPUs is empty; uuids and indexes are its entries otherwise.
	all     bool
	uuids   map[string]bool
	indexes map[uint]bool
	onError func(ctx context.Context, err error, msg string)
	// host is the agent's side while Run runs, nil otherwise.
	host atomic.Pointer[nodeagent.DRAHost]
	// numa holds the GPUs' NUMA nodes of the last SetNUMANodes, by UUID; nil before.
	numa atomic.Pointer[map[string]int]
}

var _ nodeagent.DRA = (*World)(nil)

// New returns the DRA world of node nodeName; client needs the permissions of
// [ClusterRoleRules]. It validates opts (errors wrap [ErrInvalidOptions]) and reads the DRA
// plugin's checkpoint (draplugin.ErrCheckpoint); it starts nothing.
func New(client kubernetes.Interface, nodeName string, opts Options) (*World, error) {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("new DRA world: "+format+": %w", append(args, ErrInvalidOptions)...)
	}
	if opts.Plugin.Profile.Driver == "" {
		return nil, invalid("Plugin.Profile is not set: choose dra.SDKProfile() or dra.HAMiProfile()")
	}
	if opts.Plugin.Refuse != nil {
		return nil, invalid("Plugin.Refuse is the world's ownership check: leave it nil")
	}
	w := &World{profile: opts.Plugin.Profile, all: len(opts.GPUs) == 0, uuids: map[string]bool{}, indexes: map[uint]bool{}, onError: opts.Plugin.OnError}
	for _, g := range opts.GPUs {
		switch {
		case g == "" || strings.TrimSpace(g) != g || strings.ContainsAny(g, ", \t\n"):
			return nil, invalid("GPUs entry %q: give a GPU UUID (GPU-…) or a decimal NVML index, without spaces or commas", g)
		case strings.IndexAny(g[:1], "0123456789+-") == 0:
			i, err := strconv.ParseUint(g, 10, 32)
			if err != nil {
				return nil, invalid("GPUs entry %q is neither a UUID nor a decimal NVML index (0, 1, ...)", g)
			}
			w.indexes[uint(i)] = true
		default:
			w.uuids[g] = true
		}
	}
	po := opts.Plugin
	po.Client, po.NodeName = client, nodeName
	po.Refuse = w.refuse
	po.OnError = w.handleError
	p, err := draplugin.New(po)
	if err != nil {
		if errors.Is(err, draplugin.ErrInvalidOptions) {
			return nil, fmt.Errorf("new DRA world: %w", invalidPluginError{err})
		}
		return nil, fmt.Errorf("new DRA world: %w", err)
	}
	w.plugin = p
	return w, nil
}

// invalidPluginError is the plugin's invalid-options error, also the world's.
type invalidPluginError struct{ err error }

func (e invalidPluginError) Error() string   { return e.err.Error() }
func (e invalidPluginError) Unwrap() []error { return []error{e.err, ErrInvalidOptions} }

// Plugin returns the world's DRA kubelet plugin, for its Stats and PreparedGPUs.
func (w *World) Plugin() *draplugin.Plugin { return w.plugin }

// Owns implements nodeagent.DRA: dev is not in MIG mode and Options.GPUs is empty or names
// its UUID or index.
func (w *World) Owns(dev annotation.Device) bool {
	if dev.Mode == dra.ModeMIG {
		return false
	}
	return w.all || w.uuids[dev.ID] || w.indexes[dev.Index]
}

// SetNUMANodes implements nodeagent.NUMAReceiver: the next SetDevices publishes each GPU's
// NUMA node (by UUID) as the standard attribute resource.kubernetes.io/numaNode. The map is
// the world's.
func (w *World) SetNUMANodes(numa map[string]int) { w.numa.Store(&numa) }

var _ nodeagent.NUMAReceiver = (*World)(nil)

// SetDevices implements nodeagent.DRA: it maps the scan to DRA devices (dra.Devices with the
// profile, the device-plugin GPUs tainted, the PCI bus IDs and the NUMA nodes of the last
// SetNUMANodes as attributes) and hands them to
// the plugin. A mapping error leaves the plugin's devices as they were.
func (w *World) SetDevices(ctx context.Context, devices []annotation.Device, pciBusIDs map[string]string) error {
	opts := dra.Options{Profile: w.profile, Owned: w.Owns, Extras: map[string]dra.Extra{}}
	for uuid, id := range pciBusIDs {
		opts.Extras[uuid] = dra.Extra{PCIBusID: id}
	}
	if numa := w.numa.Load(); numa != nil {
		for uuid, n := range *numa {
			e := opts.Extras[uuid]
			e.NUMANode = &n
			opts.Extras[uuid] = e
		}
	}
	devs, err := dra.Devices(devices, opts)
	if err != nil {
		return fmt.Errorf("map the GPUs to DRA devices: %w", err)
	}
	klog.FromContext(ctx).V(4).Info("DRA devices", "driver", w.profile.Driver, "devices", len(devs))
	w.plugin.SetDevices(devices, devs)
	return nil
}

// PreparedGPUs implements nodeagent.DRA: the plugin's prepared claims by GPU UUID.
func (w *World) PreparedGPUs() map[string][]types.UID { return w.plugin.PreparedGPUs() }

// Claim returns the namespace and name of a claim the world has prepared (see
// draplugin.Plugin.Claim): it is the node monitor's monitor.Claims.
func (w *World) Claim(uid types.UID) (types.NamespacedName, bool) { return w.plugin.Claim(uid) }

// Run implements nodeagent.DRA: it runs the DRA plugin until ctx ends, with host's view of
// the node for the ownership check at Prepare.
func (w *World) Run(ctx context.Context, host nodeagent.DRAHost) error {
	if host == nil {
		return fmt.Errorf("run DRA world: nil host: %w", ErrInvalidOptions)
	}
	w.host.Store(&host)
	defer w.host.Store(nil)
	if err := w.plugin.Run(ctx); err != nil {
		return fmt.Errorf("run DRA plugin: %w", err)
	}
	return nil
}

// refuse is the plugin's Refuse: a claim may be prepared only on GPUs the DRA world owns that
// no live pod on the node holds through HAMi (the host's pod informer). Errors wrap
// nodeagent.ErrOwnership, nodeagent.ErrPodsNotSynced or [ErrNotRunning].
func (w *World) refuse(ctx context.Context, gpus []annotation.Device) error {
	uuids := make([]string, 0, len(gpus))
	for _, g := range gpus {
		if !w.Owns(g) {
			return fmt.Errorf("GPU %s (index %d) belongs to the device-plugin world: its slice device carries the taint %s, which the claim must not tolerate; to give it to DRA list it in nodedra.Options.GPUs: %w",
				g.ID, g.Index, w.profile.OwnedByHAMiTaint(), nodeagent.ErrOwnership)
		}
		uuids = append(uuids, g.ID)
	}
	h := w.host.Load()
	if h == nil {
		return fmt.Errorf("check the HAMi allocations of GPUs %v: %w", uuids, ErrNotRunning)
	}
	return (*h).HeldByHAMi(ctx, uuids)
}

// handleError is the plugin's OnError: the agent records it, then the user's OnError.
func (w *World) handleError(ctx context.Context, err error, msg string) {
	if h := w.host.Load(); h != nil {
		(*h).Error(ctx, err, msg)
	}
	if w.onError != nil {
		w.onError(ctx, err, msg)
	}
}

// ClusterRoleRules are the rules an agent with a World needs besides
// nodeagent.ClusterRoleRules: the DRA plugin's (draplugin.ClusterRoleRules) and list and watch
// pods (the agent's pod informer, read by the ownership check at Prepare).
func ClusterRoleRules() []rbacv1.PolicyRule {
	return append(draplugin.ClusterRoleRules(),
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}})
}
