package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/mig"
)

// ErrOwnership is wrapped when a GPU is asked for by the world that does not own it: Allocate
// for a GPU with a prepared DRA claim, Prepare for a GPU the device-plugin world owns or that
// holds a HAMi allocation.
var ErrOwnership = errors.New("GPU owned by the other world")

// EventReasonDRAPublishFailed (Warning, on the Node): the DRA world could not publish its
// devices (the mapping failed, the ResourceSlice could not be written, the kubelet
// registration failed).
const EventReasonDRAPublishFailed = "DRAPublishFailed"

// DRA is a DRA world beside the agent's device-plugin world (Options.DRA): a DRA kubelet
// plugin that publishes some of the node's GPUs as a ResourceSlice and prepares their claims.
// Package github.com/hamireg/hamireg/nodeagent/nodedra builds one on the DRA kubelet helper;
// a program links k8s.io/dynamic-resource-allocation only when it imports that package. The
// agent owns the protocol between the two worlds: it keeps the GPUs the DRA world owns away
// from the kubelet's device count, cordons them in the register annotation, refuses them at
// Allocate, and lends the DRA world its view of the node's pods (see [DRAHost]).
type DRA interface {
	// Owns reports whether the DRA world owns dev. It must not change while the agent runs.
	Owns(dev annotation.Device) bool
	// SetDevices hands the DRA world every scan of the node, with the GPUs' PCI bus IDs by
	// UUID when the source is a [PCISource] (nil otherwise), before or while Run runs. An
	// error means the scan cannot be published: the DRA world keeps its last devices and the
	// agent records [EventReasonDRAPublishFailed].
	SetDevices(ctx context.Context, devices []annotation.Device, pciBusIDs map[string]string) error
	// PreparedGPUs returns the UUIDs of the GPUs that prepared claims hold, with the claim
	// UIDs: Allocate refuses them.
	PreparedGPUs() map[string][]types.UID
	// Run runs the DRA world until ctx ends, then returns nil once everything it started
	// returned; host is the agent's side, valid until Run returns. The agent calls Run once
	// its pod informer has synced.
	Run(ctx context.Context, host DRAHost) error
}

// DRAHost is what the agent lends its [DRA] world while it runs.
type DRAHost interface {
	// HeldByHAMi returns nil when no live pod on the node holds one of the GPUs uuids through
	// HAMi (the vendor's allocated pod annotation, hami.io/vgpu-devices-allocated for
	// NVIDIA); else an error wrapping [ErrOwnership] that names the GPU, the pod and the fix.
	// It reads the agent's pod informer, no API request; an error wrapping
	// [ErrPodsNotSynced] means the informer has not listed the pods.
	HeldByHAMi(ctx context.Context, uuids []string) error
	// Error records an error of the DRA world as the Warning Event
	// [EventReasonDRAPublishFailed] on the Node, once per distinct message.
	Error(ctx context.Context, err error, msg string)
	// MIG returns the agent's MIG realiser (Options.MIG), the one its device-plugin path
	// creates instances with, for the MIG devices of the claims the DRA world prepares on the
	// GPUs in MIG mode it owns; each call runs under the agent's Allocate lock, so the two
	// worlds never drive NVML's MIG calls at once. Nil without Options.MIG.
	MIG() MIGInstances
}

// PCISource is a [Source] that also knows each GPU's PCI bus ID: nvmlscan's Scanner is one.
// With Options.DRA the agent reads it after every scan and hands the IDs to the DRA world,
// which publishes them as the DRA devices' standard attribute resource.kubernetes.io/pciBusID.
type PCISource interface {
	// PCIBusIDs returns the PCI bus IDs of the GPUs of the last scan, by UUID, in the form
	// "0000:07:00.0" (lower-case, 4-digit domain); a GPU without an entry has no attribute.
	PCIBusIDs() map[string]string
}

// draState is the agent's side of its DRA world, nil without Options.DRA.
type draState struct {
	world DRA
	// mu guards lastError, the text of the last DRAPublishFailed Event, and mode, the
	// node's MappingMode after the last scan.
	mu        sync.Mutex
	lastError string
	mode      MappingMode
}

// OwnedByDRA reports whether the agent's DRA world owns dev (always false without
// Options.DRA). A GPU in MIG mode may be DRA's: the DRA world then publishes its MIG
// placements and creates the instances of its claims, and the agent's MIG release leaves the
// GPU's instances alone.
func (a *Agent) OwnedByDRA(dev annotation.Device) bool {
	if a.dra == nil {
		return false
	}
	return a.dra.world.Owns(dev)
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
	a.noteMapping(ctx, kubelet, len(owned))

	var pci map[string]string
	if ps, ok := a.source.(PCISource); ok {
		pci = ps.PCIBusIDs()
	}
	a.handNUMA(s.world)
	if err := s.world.SetDevices(ctx, slices.Clone(devs), pci); err != nil {
		// The slice keeps the last devices published; the other two outputs go on.
		a.draError(ctx, err, "Cannot publish the scanned GPUs as DRA devices; the ResourceSlice keeps its last devices")
		return register, kubelet
	}
	klog.FromContext(ctx).V(3).Info("DRA devices handed over", "devices", len(devs), "draOwned", len(owned))
	return register, kubelet
}

// draError records a DRA error as the Warning Event [EventReasonDRAPublishFailed] on the
// Node, once per distinct message.
func (a *Agent) draError(_ context.Context, err error, msg string) {
	s := a.dra
	text := msg + ": " + err.Error()
	s.mu.Lock()
	fresh := text != s.lastError
	s.lastError = text
	s.mu.Unlock()
	if fresh {
		a.events.Event(a.nodeRef(), corev1.EventTypeWarning, EventReasonDRAPublishFailed, truncate(text))
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
	prepared := s.world.PreparedGPUs()
	for _, u := range uuids {
		if claims := prepared[u]; len(claims) > 0 {
			return fmt.Errorf("GPU %s holds prepared DRA claim(s) %v: the device-plugin world may not use it until they are unprepared; if HAMi's scheduler placed the pod there, cordon the GPU for it (hami.io/device-cordon) or take it out of the DRA world's GPUs only once the claims are gone",
				u, claims)
		}
		i := slices.IndexFunc(devs, func(d annotation.Device) bool { return d.ID == u })
		dev := annotation.Device{ID: u, Index: ^uint(0)} // a GPU not scanned is matched by UUID alone
		if i >= 0 {
			dev = devs[i]
		}
		if a.OwnedByDRA(dev) {
			return fmt.Errorf("GPU %s is owned by the DRA world (Options.DRA), which no pod of HAMi's scheduler may get: use a HAMi extender that honours hami.io/device-cordon (HAMi master; for v2.9.0 run the agent with Options.Version VersionV290, which marks it unhealthy), or give the GPU to the device-plugin world by leaving it out of the DRA world's GPUs",
				u)
		}
	}
	return nil
}

// draHost is the agent's [DRAHost].
type draHost struct{ a *Agent }

var _ DRAHost = draHost{}

func (h draHost) Error(ctx context.Context, err error, msg string) { h.a.draError(ctx, err, msg) }

// MIG implements [DRAHost]: the agent's Options.MIG behind its Allocate lock.
func (h draHost) MIG() MIGInstances {
	if h.a.mig == nil {
		return nil
	}
	return lockedMIG(h)
}

// lockedMIG is the agent's MIG realiser with each call under the Allocate lock.
type lockedMIG struct{ a *Agent }

var _ MIGInstances = lockedMIG{}

func (l lockedMIG) Instances(ctx context.Context) ([]mig.Instance, error) {
	l.a.allocMu.Lock()
	defer l.a.allocMu.Unlock()
	return l.a.mig.Instances(ctx)
}

func (l lockedMIG) Create(ctx context.Context, gpuUUID, profile string, placement mig.Placement) (mig.Instance, error) {
	l.a.allocMu.Lock()
	defer l.a.allocMu.Unlock()
	return l.a.mig.Create(ctx, gpuUUID, profile, placement)
}

func (l lockedMIG) Destroy(ctx context.Context, inst mig.Instance) error {
	l.a.allocMu.Lock()
	defer l.a.allocMu.Unlock()
	return l.a.mig.Destroy(ctx, inst)
}

// HeldByHAMi implements [DRAHost]: it reads the node's live pods from the agent's informer.
func (h draHost) HeldByHAMi(ctx context.Context, uuids []string) error {
	a := h.a
	pods, err := a.pods.live()
	if err != nil {
		return err
	}
	want := make(map[string]bool, len(uuids))
	for _, u := range uuids {
		want[u] = true
	}
	for _, pod := range pods {
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
