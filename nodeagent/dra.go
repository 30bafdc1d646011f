package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
)

// ErrOwnership is wrapped when a GPU is asked for by the world that does not own it: Allocate
// for a GPU with a prepared DRA claim, Prepare for a GPU the device-plugin world owns or that
// holds a HAMi allocation.
var ErrOwnership = errors.New("GPU owned by the other world")

// EventReasonDRAPublishFailed (Warning, on the Node): the DRA plugin could not publish the
// ResourceSlice or register with the kubelet.
const EventReasonDRAPublishFailed = "DRAPublishFailed"

// DRAOptions make the agent serve DRA beside HAMi's two channels (Options.DRA).
type DRAOptions struct {
	// Plugin configures the DRA kubelet plugin: Profile (required), folders, Env. Client and
	// NodeName are the agent's (set by New); Refuse is the agent's ownership check and must
	// be left nil; OnError, if set, is called after the agent recorded the error.
	Plugin draplugin.Options
	// GPUs selects the GPUs the DRA world owns, by UUID or NVML index ("GPU-…" or "3").
	// Empty: all of them. The others stay in the device-plugin world. GPUs in MIG mode are
	// never DRA's, even when listed.
	GPUs []string
}

// PCISource is a [Source] that also knows each GPU's PCI bus ID: nvmlscan's Scanner is one.
// With Options.DRA the agent reads it after every scan and publishes the IDs as the DRA
// devices' standard attribute resource.kubernetes.io/pciBusID.
type PCISource interface {
	// PCIBusIDs returns the PCI bus IDs of the GPUs of the last scan, by UUID, in the form
	// "0000:07:00.0" (lower-case, 4-digit domain); a GPU without an entry has no attribute.
	PCIBusIDs() map[string]string
}

// draPlugin is what the agent uses of *draplugin.Plugin (a fake in the unit tests).
type draPlugin interface {
	SetDevices(gpus []annotation.Device, devices []resourcev1.Device)
	Run(ctx context.Context) error
	PreparedGPUs() map[string][]types.UID
}

var _ draPlugin = (*draplugin.Plugin)(nil)

// draState is the agent's DRA side, nil without Options.DRA.
type draState struct {
	profile dra.Profile
	plugin  draPlugin
	real    *draplugin.Plugin
	// all is set when Options.DRA.GPUs is empty; uuids and indexes are its entries otherwise.
	all     bool
	uuids   map[string]bool
	indexes map[uint]bool
	// onError is the user's Plugin.OnError, nil when unset.
	onError func(ctx context.Context, err error, msg string)

	// mu guards lastError, the text of the last DRAPublishFailed Event.
	mu        sync.Mutex
	lastError string
}

// newDRA validates o and builds the DRA side of agent a (a.client, a.node and a.events set).
func newDRA(a *Agent, o *DRAOptions) (*draState, error) {
	if o.Plugin.Profile.Driver == "" {
		return nil, fmt.Errorf("DRA.Plugin.Profile is not set: choose dra.SDKProfile() or dra.HAMiProfile(): %w", ErrInvalidOptions)
	}
	if o.Plugin.Refuse != nil {
		return nil, fmt.Errorf("DRA.Plugin.Refuse is the agent's ownership check: leave it nil: %w", ErrInvalidOptions)
	}
	s := &draState{profile: o.Plugin.Profile, all: len(o.GPUs) == 0, uuids: map[string]bool{}, indexes: map[uint]bool{}, onError: o.Plugin.OnError}
	for _, g := range o.GPUs {
		switch {
		case g == "" || strings.TrimSpace(g) != g || strings.ContainsAny(g, ", \t\n"):
			return nil, fmt.Errorf("DRA.GPUs entry %q: give a GPU UUID (GPU-…) or a decimal NVML index, without spaces or commas: %w", g, ErrInvalidOptions)
		case strings.IndexAny(g[:1], "0123456789+-") == 0:
			i, err := strconv.ParseUint(g, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("DRA.GPUs entry %q is neither a UUID nor a decimal NVML index (0, 1, ...): %w", g, ErrInvalidOptions)
			}
			s.indexes[uint(i)] = true
		default:
			s.uuids[g] = true
		}
	}
	po := o.Plugin
	po.Client, po.NodeName = a.client, a.node
	po.Refuse = a.refuse
	po.OnError = a.draError
	p, err := draplugin.New(po)
	if err != nil {
		return nil, err
	}
	s.plugin, s.real = p, p
	return s, nil
}

// OwnedByDRA reports whether the agent's DRA world owns dev (always false without Options.DRA):
// dev is not in MIG mode and Options.DRA.GPUs is empty or names its UUID or index.
func (a *Agent) OwnedByDRA(dev annotation.Device) bool {
	s := a.dra
	if s == nil || dev.Mode == dra.ModeMIG {
		return false
	}
	return s.all || s.uuids[dev.ID] || s.indexes[dev.Index]
}

// DRA returns the agent's DRA plugin, nil without Options.DRA.
func (a *Agent) DRA() *draplugin.Plugin {
	if a.dra == nil {
		return nil
	}
	return a.dra.real
}

// DRAClusterRoleRules are the rules an agent with Options.DRA needs besides
// [ClusterRoleRules]: the DRA plugin's (draplugin.ClusterRoleRules) and list pods (the
// ownership check at Prepare).
func DRAClusterRoleRules() []rbacv1.PolicyRule {
	return append(draplugin.ClusterRoleRules(),
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}})
}

// publishDRA hands one scan to the three outputs: devs are the scanned devices; it returns
// those for the register annotation and those for the kubelet. Without Options.DRA both are
// devs. The cordon is set before the register annotation's devices, so that the first write
// carries both.
func (a *Agent) publishDRA(ctx context.Context, devs []annotation.Device) (register, kubelet []annotation.Device) {
	s := a.dra
	if s == nil {
		return devs, devs
	}
	var owned []string
	register = slices.Clone(devs)
	kubelet = make([]annotation.Device, 0, len(devs))
	for i, d := range devs {
		if !a.OwnedByDRA(d) {
			kubelet = append(kubelet, d)
			continue
		}
		owned = append(owned, d.ID)
		if a.version == annotation.VersionV290 { // v2.9.0 has no cordon: unhealthy keeps its extender off
			register[i].Health = false
		}
	}
	a.writer.SetCordon(owned)

	opts := dra.Options{Profile: s.profile, Owned: a.OwnedByDRA}
	if ps, ok := a.source.(PCISource); ok {
		ids := ps.PCIBusIDs()
		opts.Extras = make(map[string]dra.Extra, len(ids))
		for uuid, id := range ids {
			opts.Extras[uuid] = dra.Extra{PCIBusID: id}
		}
	}
	devices, err := dra.Devices(devs, opts)
	if err != nil {
		// The slice keeps the last devices published; the other two outputs go on.
		a.draError(ctx, err, "Cannot map the scanned GPUs to DRA devices; the ResourceSlice keeps its last devices")
		return register, kubelet
	}
	klog.FromContext(ctx).V(3).Info("DRA devices", "driver", s.profile.Driver, "devices", len(devices), "draOwned", len(owned))
	s.plugin.SetDevices(devs, devices)
	return register, kubelet
}

// draError records a DRA publishing error as the Warning Event [EventReasonDRAPublishFailed]
// on the Node, once per distinct message, and hands it to the user's Plugin.OnError. The DRA
// plugin calls it from HandleError (after logging); the scan calls it when the mapping fails.
func (a *Agent) draError(ctx context.Context, err error, msg string) {
	s := a.dra
	text := msg + ": " + err.Error()
	s.mu.Lock()
	fresh := text != s.lastError
	s.lastError = text
	s.mu.Unlock()
	if fresh {
		a.events.Event(a.nodeRef(), corev1.EventTypeWarning, EventReasonDRAPublishFailed, truncate(text))
	}
	if s.onError != nil {
		s.onError(ctx, err, msg)
	}
}

// ownershipConflict is the reason Allocate must not hand out the GPUs uuids of a pod, nil
// when there is none: a GPU the DRA world owns, or one that prepared claims hold. Allocate
// fails with it as the cause of an [AllocateError] of class [ErrOwnership].
func (a *Agent) ownershipConflict(uuids []string) error {
	s := a.dra
	if s == nil {
		return nil
	}
	var devs []annotation.Device
	if p := a.devices.Load(); p != nil {
		devs = *p
	}
	prepared := s.plugin.PreparedGPUs()
	for _, u := range uuids {
		if claims := prepared[u]; len(claims) > 0 {
			return fmt.Errorf("GPU %s holds prepared DRA claim(s) %v: the device-plugin world may not use it until they are unprepared; if HAMi's scheduler placed the pod there, cordon the GPU for it (hami.io/device-cordon) or leave it out of Options.DRA.GPUs only once the claims are gone",
				u, claims)
		}
		i := slices.IndexFunc(devs, func(d annotation.Device) bool { return d.ID == u })
		if (i >= 0 && a.OwnedByDRA(devs[i])) || (i < 0 && (s.all || s.uuids[u])) {
			return fmt.Errorf("GPU %s is owned by the DRA world (Options.DRA.GPUs), which no pod of HAMi's scheduler may get: use a HAMi extender that honours hami.io/device-cordon (HAMi master; for v2.9.0 run the agent with Options.Version VersionV290, which marks it unhealthy), or give the GPU to the device-plugin world by leaving it out of Options.DRA.GPUs",
				u)
		}
	}
	return nil
}

// refuse is the DRA plugin's Refuse: a claim may be prepared only on GPUs the DRA world owns
// that no live pod on this node holds through HAMi (hami.io/vgpu-devices-allocated). Errors
// wrap [ErrOwnership], or are the API error of listing the node's pods.
func (a *Agent) refuse(ctx context.Context, gpus []annotation.Device) error {
	want := map[string]bool{}
	for _, g := range gpus {
		if !a.OwnedByDRA(g) {
			return fmt.Errorf("GPU %s (index %d) belongs to the device-plugin world: its slice device carries the taint %s, which the claim must not tolerate; to give it to DRA list it in Options.DRA.GPUs: %w",
				g.ID, g.Index, a.dra.profile.OwnedByHAMiTaint(), ErrOwnership)
		}
		want[g.ID] = true
	}
	pods, err := a.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", a.node).String(),
	})
	if err != nil {
		return fmt.Errorf("list the pods of node %s for their HAMi allocations: %w", a.node, err)
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Spec.NodeName != a.node || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		pd, ok, err := allocation.Allocated(pod, a.vendor, a.version)
		if !ok {
			continue
		}
		if err != nil {
			klog.FromContext(ctx).V(2).Info("Pod allocation not readable; not counted against DRA", "pod", klog.KObj(pod), "err", err)
			continue
		}
		for _, ctr := range pd {
			for _, d := range ctr {
				if want[d.UUID] {
					return fmt.Errorf("GPU %s is held by pod %s through HAMi (%s): the claim can be prepared once the pod ends; cordon the GPU for HAMi's scheduler (hami.io/device-cordon) so that no new pod gets it: %w",
						d.UUID, klog.KObj(pod), a.vendor.AllocatedKey, ErrOwnership)
				}
			}
		}
	}
	return nil
}
