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
	"github.com/hamireg/hamireg/mig"
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
	// nil; OnError, if set, is called after the agent recorded the error as an Event. MIG,
	// when nil (the default), is the node agent's MIG realiser (nodeagent.Options.MIG, lent
	// through nodeagent.DRAHost while the agent runs the world): the same that creates the
	// device plugin's MIG instances; a claim with a MIG device reaching Prepare on an agent
	// without Options.MIG is refused (draplugin.ErrNoMIG).
	Plugin draplugin.Options
	// GPUs selects the GPUs the DRA world owns, by UUID or NVML index ("GPU-…" or "3").
	// Empty: all of them. The others stay in the device-plugin world. A GPU in MIG mode that
	// the world owns is published as MIG placements (dra.Slices), whose instances the agent's
	// MIG realiser creates at Prepare.
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
	if po.MIG == nil {
		po.MIG = hostMIG{w}
	}
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

// Owns implements nodeagent.DRA: Options.GPUs is empty or names the UUID or index of dev,
// whatever its mode.
func (w *World) Owns(dev annotation.Device) bool {
	return w.all || w.uuids[dev.ID] || w.indexes[dev.Index]
}

// SetNUMANodes implements nodeagent.NUMAReceiver: the next SetDevices publishes each GPU's
// NUMA node (by UUID) as the standard attribute resource.kubernetes.io/numaNode. The map is
// the world's.
func (w *World) SetNUMANodes(numa map[string]int) { w.numa.Store(&numa) }

var _ nodeagent.NUMAReceiver = (*World)(nil)

// SetDevices implements nodeagent.DRA: it maps the scan to the slices of the node's pool
// (dra.Slices with the profile: the device-plugin GPUs tainted, the MIG GPUs the world owns
// as MIG placements with their counter sets, the PCI bus IDs and the NUMA nodes of the last
// SetNUMANodes as attributes) and hands them to the plugin. A mapping error leaves the
// plugin's slices as they were.
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
	slices, err := dra.Slices(devices, opts)
	if err != nil {
		return fmt.Errorf("map the GPUs to DRA devices: %w", err)
	}
	n := 0
	for _, s := range slices {
		n += len(s.Devices)
	}
	klog.FromContext(ctx).V(4).Info("DRA devices", "driver", w.profile.Driver, "devices", n, "slices", len(slices))
	w.plugin.SetSlices(devices, slices)
	return nil
}

// hostMIG is the plugin's MIG realiser: the running agent's (nodeagent.DRAHost.MIG).
type hostMIG struct{ w *World }

var _ draplugin.MIGDevices = hostMIG{}

// realiser is the agent's MIG realiser; an error wrapping [ErrNotRunning] or
// draplugin.ErrNoMIG when there is none.
func (h hostMIG) realiser() (nodeagent.MIGInstances, error) {
	host := h.w.host.Load()
	if host == nil {
		return nil, fmt.Errorf("use the node agent's MIG realiser: %w", ErrNotRunning)
	}
	m := (*host).MIG()
	if m == nil {
		return nil, fmt.Errorf("the node agent has no MIG realiser: set nodeagent.Options.MIG (nvmlscan's MIG manager): %w", draplugin.ErrNoMIG)
	}
	return m, nil
}

func (h hostMIG) Instances(ctx context.Context) ([]mig.Instance, error) {
	m, err := h.realiser()
	if err != nil {
		return nil, err
	}
	return m.Instances(ctx)
}

func (h hostMIG) Create(ctx context.Context, gpuUUID, profile string, placement mig.Placement) (mig.Instance, error) {
	m, err := h.realiser()
	if err != nil {
		return mig.Instance{}, err
	}
	return m.Create(ctx, gpuUUID, profile, placement)
}

func (h hostMIG) Destroy(ctx context.Context, inst mig.Instance) error {
	m, err := h.realiser()
	if err != nil {
		return err
	}
	return m.Destroy(ctx, inst)
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
