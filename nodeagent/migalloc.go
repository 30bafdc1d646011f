package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/hamicore"
	"github.com/hamireg/hamireg/mig"
)

// DefaultMIGReconcilePeriod is how often the agent releases MIG devices no live reservation
// owns: HAMi master's 5 s.
const DefaultMIGReconcilePeriod = 5 * time.Second

// migCacheGrace is how long a MIG device this agent created counts as owned by the pod it was
// created for, whatever the pod informer says: the informer may not have seen the pod's bind
// or its reservation patch yet when the release runs right after the Allocate.
const migCacheGrace = 30 * time.Second

// migCreated is a MIG device the agent created, for the pod key, at a time.
type migCreated struct {
	pod types.NamespacedName
	at  time.Time
}

// migEntry reports whether the devices of an entry are on GPUs of devices in MIG mode; a GPU
// not among devices counts as not MIG. An entry with both kinds is an error wrapping
// hamicore.ErrMixedModes.
func migEntry(entry allocation.ContainerDevices, devices []annotation.Device) (bool, error) {
	n := 0
	for _, d := range entry {
		i := slices.IndexFunc(devices, func(g annotation.Device) bool { return g.ID == d.GPU() })
		if i >= 0 && devices[i].Mode == allocation.ModeMIG {
			n++
		}
	}
	if n > 0 && n < len(entry) {
		return false, fmt.Errorf("%d of the entry's %d devices are on GPUs in MIG mode: %w", n, len(entry), hamicore.ErrMixedModes)
	}
	return n > 0, nil
}

// migGPUs returns the IDs of the GPUs of devices in MIG mode.
func migGPUs(devices []annotation.Device) map[string]bool {
	out := map[string]bool{}
	for _, d := range devices {
		if d.Mode == allocation.ModeMIG {
			out[d.ID] = true
		}
	}
	return out
}

// migRealisation is what realiseMIG did for one container.
type migRealisation struct {
	// instances are the container's MIG devices, one per entry device, in deviceIndex order.
	instances []mig.Instance
	// created are the instances created in this call: destroyed again when the Allocate
	// fails.
	created []mig.Instance
	// container is the entry index (the reservations' containerIndex); reservations are the
	// container's, in deviceIndex order, as read.
	container    int
	reservations []mig.Allocation
}

// migClaim is a reservation of a live pod.
type migClaim struct {
	pod   types.NamespacedName
	alloc mig.Allocation
}

// owns reports whether the reservation owns the MIG device: the same GPU and either the
// runtime identity recorded in the reservation, or, for a reservation without one yet (its
// pod is being allocated, or an agent stopped between creating the instance and recording
// it), exactly the reserved placement.
func (c migClaim) owns(inst mig.Instance) bool {
	if c.alloc.GPUUUID != inst.GPUUUID {
		return false
	}
	if c.alloc.Runtime != nil {
		return *c.alloc.Runtime == inst.Runtime
	}
	return c.alloc.Placement == inst.Placement
}

func (c migClaim) String() string {
	return fmt.Sprintf("pod %s container %d device %d", c.pod, c.alloc.ContainerIndex, c.alloc.DeviceIndex)
}

// decodeReservations decodes a pod's hami.io/vgpu-mig-allocations; a pod without the
// annotation has none.
func decodeReservations(pod *corev1.Pod) ([]mig.Allocation, error) {
	v, ok := pod.Annotations[mig.KeyAllocations]
	if !ok || v == "" {
		return nil, nil
	}
	return mig.DecodeAllocations(v)
}

// liveClaims returns the reservations of the node's pods that are not finished (phase
// Succeeded or Failed), read from the agent's pod informer, and the pods among them whose
// reservation annotation does not decode. The error wraps [ErrPodsNotSynced] before the
// informer's first LIST.
func (a *Agent) liveClaims(ctx context.Context) ([]migClaim, []types.NamespacedName, error) {
	pods, err := a.pods.live()
	if err != nil {
		return nil, nil, err
	}
	var (
		claims []migClaim
		bad    []types.NamespacedName
	)
	for _, pod := range pods {
		key := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
		allocs, err := decodeReservations(pod)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Undecodable MIG reservation annotation", "pod", klog.KObj(pod), "key", mig.KeyAllocations)
			bad = append(bad, key)
			continue
		}
		for _, al := range allocs {
			claims = append(claims, migClaim{pod: key, alloc: al})
		}
	}
	return claims, bad, nil
}

// realiseMIG makes the MIG devices of container entry ci of the pod exist: its reservations,
// one per entry device in deviceIndex order, are reused when realised already (the runtime
// identity recorded and an instance with that identity present), else created at exactly the
// reserved placement, after destroying the instances overlapping it that no live reservation
// owns. The error is the AllocateError to fail with (its pod fields unset); on error the
// instances created are destroyed again.
func (a *Agent) realiseMIG(ctx context.Context, b bound, ci int, ctr *corev1.Container, entry allocation.ContainerDevices) (_ *migRealisation, aerr *AllocateError) {
	logger := klog.FromContext(ctx)
	if a.mig == nil {
		return nil, &AllocateError{Kind: ErrMIG, Detail: fmt.Sprintf(
			"the devices %v are on GPUs in MIG mode and the agent has no MIG manager: set Options.MIG (nvmlscan's MIG manager)", entryUUIDs(entry))}
	}
	allocs, err := decodeReservations(b.pod)
	if err != nil {
		return nil, &AllocateError{Kind: ErrMalformed, Detail: "annotation " + mig.KeyAllocations, Err: err}
	}
	mine := mig.Find(allocs, ci)
	if len(mine) != len(entry) { // HAMi's words
		return nil, &AllocateError{Kind: ErrMIG, Detail: fmt.Sprintf("container %s has %d MIG reservations, requested %d devices", ctr.Name, len(mine), len(entry))}
	}
	for k, res := range mine {
		if res.GPUUUID != entry[k].GPU() {
			return nil, &AllocateError{Kind: ErrMIG, Detail: fmt.Sprintf(
				"the MIG reservation of device %d names GPU %s, the scheduler's entry GPU %s", res.DeviceIndex, res.GPUUUID, entry[k].GPU())}
		}
	}
	existing, err := a.mig.Instances(ctx)
	if err != nil {
		return nil, &AllocateError{Kind: ErrMIG, Detail: "list the node's MIG devices", Err: err}
	}
	r := &migRealisation{container: ci, reservations: mine}
	defer func() {
		if aerr != nil {
			a.undoMIG(ctx, r)
		}
	}()
	var (
		claims  []migClaim
		bad     []types.NamespacedName
		listed  bool
		podKey  = b.owner
		ownerOf = func(inst mig.Instance) (string, *AllocateError) {
			if !listed {
				var err error
				if claims, bad, err = a.liveClaims(ctx); err != nil {
					return "", &AllocateError{Kind: ErrAPI, Detail: "find the owner of MIG device " + inst.MigUUID, Err: err}
				}
				listed = true
			}
			for _, c := range claims {
				if c.pod == podKey && c.alloc.ContainerIndex == ci {
					continue // the reservations being realised
				}
				if c.owns(inst) {
					return c.String(), nil
				}
			}
			if c, ok := a.recentMIG(inst); ok && c.pod != podKey {
				return fmt.Sprintf("pod %s (created for it %v ago, not yet in the agent's pod cache)", c.pod, a.clock.Since(c.at).Round(time.Millisecond)), nil
			}
			if len(bad) > 0 {
				return fmt.Sprintf("possibly pods %v, whose %s does not decode", bad, mig.KeyAllocations), nil
			}
			return "", nil
		}
	)
	for _, res := range mine {
		if res.Runtime != nil {
			if j := slices.IndexFunc(existing, func(in mig.Instance) bool {
				return in.GPUUUID == res.GPUUUID && in.Runtime == *res.Runtime && in.Placement == res.Placement
			}); j >= 0 {
				logger.V(2).Info("Reusing the MIG device realised for the reservation", "device", res.DeviceIndex, "migUUID", existing[j].MigUUID)
				r.instances = append(r.instances, existing[j])
				continue
			}
		}
		for j := 0; j < len(existing); j++ {
			inst := existing[j]
			if inst.GPUUUID != res.GPUUUID || !mig.Overlaps(inst.Placement, res.Placement) {
				continue
			}
			if slices.ContainsFunc(r.instances, func(in mig.Instance) bool { return in == inst }) {
				return nil, &AllocateError{Kind: ErrMIG, Detail: fmt.Sprintf(
					"the reservation of device %d (%s at %s) overlaps another device of the same container on GPU %s", res.DeviceIndex, res.Profile, placementString(res.Placement), res.GPUUUID), Err: ErrPlacementTaken}
			}
			owner, aerr := ownerOf(inst)
			if aerr != nil {
				return nil, aerr
			}
			if owner != "" {
				return nil, &AllocateError{Kind: ErrMIG, Detail: fmt.Sprintf(
					"the reserved placement %s of %s on GPU %s overlaps MIG device %s (%s at %s), owned by %s", placementString(res.Placement), res.Profile, res.GPUUUID,
					inst.MigUUID, inst.Profile, placementString(inst.Placement), owner), Err: ErrPlacementTaken}
			}
			logger.Info("Destroying a MIG device no live reservation owns, to realise a reservation at its placement",
				"gpu", inst.GPUUUID, "migUUID", inst.MigUUID, "profile", inst.Profile, "placement", placementString(inst.Placement))
			if err := a.mig.Destroy(ctx, inst); err != nil {
				return nil, &AllocateError{Kind: ErrMIG, Detail: fmt.Sprintf("destroy MIG device %s, which no live reservation owns, at the reserved placement", inst.MigUUID), Err: err}
			}
			existing = slices.Delete(existing, j, j+1)
			j--
		}
		inst, err := a.mig.Create(ctx, res.GPUUUID, res.Profile, res.Placement)
		if err != nil {
			return nil, &AllocateError{Kind: ErrMIG, Detail: fmt.Sprintf("create MIG device %s at %s on GPU %s", res.Profile, placementString(res.Placement), res.GPUUUID), Err: err}
		}
		r.created = append(r.created, inst)
		if inst.MigUUID != "" {
			a.migCreated[inst.MigUUID] = migCreated{pod: podKey, at: a.clock.Now()}
		}
		if inst.MigUUID == "" || inst.GPUUUID != res.GPUUUID || inst.Placement != res.Placement {
			return nil, &AllocateError{Kind: ErrMIG, Detail: fmt.Sprintf(
				"the MIG manager (%T) answered MIG device %q on GPU %s at %s for %s at %s on GPU %s", a.mig, inst.MigUUID, inst.GPUUUID, placementString(inst.Placement),
				res.Profile, placementString(res.Placement), res.GPUUUID)}
		}
		logger.V(2).Info("Created MIG device", "device", res.DeviceIndex, "gpu", inst.GPUUUID, "profile", res.Profile, "placement", placementString(res.Placement), "migUUID", inst.MigUUID)
		existing = append(existing, inst)
		r.instances = append(r.instances, inst)
	}
	return r, nil
}

// undoMIG destroys the instances created by a realisation whose Allocate failed.
func (a *Agent) undoMIG(ctx context.Context, r *migRealisation) {
	if r == nil {
		return
	}
	for _, inst := range slices.Backward(r.created) {
		if err := a.mig.Destroy(ctx, inst); err != nil {
			klog.FromContext(ctx).Error(err, "Failed to destroy a MIG device created for a failed Allocate; the reconcile retries", "migUUID", inst.MigUUID)
		}
	}
	r.created = nil
}

// recordMIG merge-patches the runtime identity of the realised devices into the pod's
// hami.io/vgpu-mig-allocations, with the pod's resourceVersion as precondition, as HAMi's
// plugin does; on a conflict it reads the pod again and applies the identity to the fresh
// value. It writes nothing when the annotation already records every identity.
func (a *Agent) recordMIG(ctx context.Context, b bound, r *migRealisation) error {
	pod := b.pod
	first := true
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !first {
			err := a.call(ctx, func() (err error) {
				pod, err = a.client.CoreV1().Pods(b.owner.Namespace).Get(ctx, b.owner.Name, metav1.GetOptions{})
				return err
			})
			if err != nil {
				return fmt.Errorf("get the pod again after a conflict: %w", err)
			}
		}
		first = false
		allocs, err := decodeReservations(pod)
		if err != nil {
			return fmt.Errorf("decode %s: %w", mig.KeyAllocations, err)
		}
		changed := false
		for k, inst := range r.instances {
			dev := r.reservations[k].DeviceIndex
			j := slices.IndexFunc(allocs, func(al mig.Allocation) bool { return al.ContainerIndex == r.container && al.DeviceIndex == dev })
			if j < 0 || allocs[j].GPUUUID != inst.GPUUUID || allocs[j].Placement != inst.Placement {
				return fmt.Errorf("the reservation of container %d device %d changed while it was realised", r.container, dev)
			}
			rt := inst.Runtime
			if allocs[j].Runtime == nil || *allocs[j].Runtime != rt {
				allocs[j].Runtime = &rt
				changed = true
			}
		}
		if !changed {
			return nil
		}
		body, err := json.Marshal(migPatch{Metadata: migPatchMeta{
			Annotations:     map[string]string{mig.KeyAllocations: mig.EncodeAllocations(allocs)},
			ResourceVersion: pod.ResourceVersion,
		}})
		if err != nil {
			return fmt.Errorf("encode the patch of %s: %w", mig.KeyAllocations, err)
		}
		return a.call(ctx, func() error {
			_, err := a.client.CoreV1().Pods(b.owner.Namespace).Patch(ctx, b.owner.Name, types.MergePatchType, body, metav1.PatchOptions{FieldManager: FieldManager})
			return err
		})
	})
}

// migPatch is the body of the reservation patch, HAMi's: the annotation and the
// resourceVersion precondition.
type migPatch struct {
	Metadata migPatchMeta `json:"metadata"`
}

type migPatchMeta struct {
	Annotations     map[string]string `json:"annotations"`
	ResourceVersion string            `json:"resourceVersion"`
}

// legacyMIGEntry reports whether an entry carries HAMi v2.9.0's "[template-position]" MIG
// suffix on a device.
func legacyMIGEntry(entry allocation.ContainerDevices) bool {
	return slices.ContainsFunc(entry, func(d allocation.ContainerDevice) bool { return strings.Contains(d.UUID, "[") })
}

// placementString writes a placement as HAMi's messages do: {Start:0 Size:2}.
func placementString(p mig.Placement) string {
	return fmt.Sprintf("{Start:%d Size:%d}", p.Start, p.Size)
}

// reconcileMIG releases the MIG devices no live reservation owns: under the Allocate lock, it
// reads the node's pods from the agent's pod informer and destroys every MIG device on the node's GPUs in MIG mode (as last
// scanned; not those the DRA world owns, whose instances its claims hold) that no reservation of a pod that is not finished owns (see [migClaim.owns]).
// Devices matching a live reservation's runtime identity are kept: after a restart, that is
// how the agent adopts them. A reservation naming a GPU the node does not have is skipped
// (logged). When a live pod's reservation annotation does not decode, nothing is destroyed
// this round: what it owns is unknown.
func (a *Agent) reconcileMIG(ctx context.Context) error {
	if a.mig == nil {
		return nil
	}
	p := a.devices.Load()
	if p == nil {
		return nil // not scanned yet
	}
	gpus := migGPUs(*p)
	for id := range gpus {
		// The DRA world owns the instances of the MIG GPUs it owns (its prepared claims).
		if i := slices.IndexFunc(*p, func(d annotation.Device) bool { return d.ID == id }); i >= 0 && a.OwnedByDRA((*p)[i]) {
			delete(gpus, id)
		}
	}
	if len(gpus) == 0 {
		return nil
	}
	a.allocMu.Lock()
	defer a.allocMu.Unlock()
	logger := klog.FromContext(ctx)
	claims, bad, err := a.liveClaims(ctx)
	if err != nil {
		return err
	}
	for _, c := range claims {
		if !slices.ContainsFunc(*p, func(d annotation.Device) bool { return d.ID == c.alloc.GPUUUID }) {
			logger.V(3).Info("Skipping a MIG reservation naming a GPU this node does not have", "reservation", c.String(), "gpu", c.alloc.GPUUUID)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("release MIG devices: the %s of live pods %v does not decode, so what they own is unknown: nothing released", mig.KeyAllocations, bad)
	}
	insts, err := a.mig.Instances(ctx)
	if err != nil {
		return fmt.Errorf("release MIG devices: list them: %w", err)
	}
	var errs []error
	for _, inst := range insts {
		if !gpus[inst.GPUUUID] {
			continue
		}
		if i := slices.IndexFunc(claims, func(c migClaim) bool { return c.owns(inst) }); i >= 0 {
			logger.V(4).Info("MIG device owned by a live reservation", "migUUID", inst.MigUUID, "reservation", claims[i].String())
			continue
		}
		if c, ok := a.recentMIG(inst); ok {
			logger.V(4).Info("MIG device created recently; kept until the pod cache shows its reservation", "migUUID", inst.MigUUID, "pod", c.pod)
			continue
		}
		if err := a.mig.Destroy(ctx, inst); err != nil {
			errs = append(errs, fmt.Errorf("destroy MIG device %s: %w", inst.MigUUID, err))
			continue
		}
		logger.Info("Released a MIG device no live reservation owns", "gpu", inst.GPUUUID, "migUUID", inst.MigUUID, "profile", inst.Profile, "placement", placementString(inst.Placement))
	}
	return errors.Join(errs...)
}

// recentMIG returns the creation record of inst when the agent created it less than
// [migCacheGrace] ago for a pod the pod informer has not seen yet (once it has, the pod's
// reservation decides), and forgets the older records. The caller holds allocMu.
func (a *Agent) recentMIG(inst mig.Instance) (migCreated, bool) {
	now := a.clock.Now()
	for id, c := range a.migCreated {
		if now.Sub(c.at) >= migCacheGrace {
			delete(a.migCreated, id)
		}
	}
	c, ok := a.migCreated[inst.MigUUID]
	if !ok || a.pods.has(c.pod) {
		return migCreated{}, false
	}
	return c, true
}

// migLoop runs reconcileMIG at start and every period until ctx ends.
func (a *Agent) migLoop(ctx context.Context) {
	logger := klog.FromContext(ctx)
	ticker := a.clock.NewTicker(a.migPeriod)
	defer ticker.Stop()
	for {
		if err := a.reconcileMIG(ctx); err != nil && ctx.Err() == nil {
			logger.Error(err, "MIG release incomplete; retrying", "retryIn", a.migPeriod)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
	}
}
