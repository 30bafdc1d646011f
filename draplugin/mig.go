package draplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/mig"
)

// MIGDevices realises the MIG devices of prepared claims (Options.MIG): the node agent's MIG
// realiser, the one its device-plugin path creates instances with (nvmlscan's MIG manager on
// a node, a simulation in tests). Its methods are those of nodeagent.MIGInstances.
type MIGDevices interface {
	// Instances lists the MIG devices that exist on the node's GPUs now, whoever created
	// them.
	Instances(ctx context.Context) ([]mig.Instance, error)
	// Create makes a GPU instance of the named profile at exactly placement on the GPU, and
	// a compute instance filling it, and returns the MIG device with its runtime identity.
	Create(ctx context.Context, gpuUUID, profile string, placement mig.Placement) (mig.Instance, error)
	// Destroy removes the MIG device; one already gone is not an error.
	Destroy(ctx context.Context, inst mig.Instance) error
}

// ErrNoMIG means a claim's result names a MIG device and the plugin has no Options.MIG, or the
// checkpoint records MIG devices and New was given none.
var ErrNoMIG = errors.New("no MIG realiser")

// preparedMIG is the MIG device Prepare created for one result: its profile, placement and
// runtime identity (mig.Instance without the GPU UUID, which is the device's UUID).
type preparedMIG struct {
	Profile           string `json:"profile"`
	ProfileID         uint32 `json:"profileID,omitempty"`
	Start             uint32 `json:"start"`
	Size              uint32 `json:"size"`
	MigUUID           string `json:"migUUID"`
	GPUInstanceID     uint32 `json:"gpuInstanceID"`
	ComputeInstanceID uint32 `json:"computeInstanceID"`
}

func (m preparedMIG) placement() mig.Placement { return mig.Placement{Start: m.Start, Size: m.Size} }

// instance is the mig.Instance of the MIG device m on GPU gpuUUID.
func (m preparedMIG) instance(gpuUUID string) mig.Instance {
	return mig.Instance{GPUUUID: gpuUUID, Profile: m.Profile, ProfileID: m.ProfileID, Placement: m.placement(),
		Runtime: mig.Runtime{MigUUID: m.MigUUID, GPUInstanceID: m.GPUInstanceID, ComputeInstanceID: m.ComputeInstanceID}}
}

func recordMIG(inst mig.Instance) *preparedMIG {
	return &preparedMIG{Profile: inst.Profile, ProfileID: inst.ProfileID, Start: inst.Placement.Start, Size: inst.Placement.Size,
		MigUUID: inst.MigUUID, GPUInstanceID: inst.GPUInstanceID, ComputeInstanceID: inst.ComputeInstanceID}
}

// checkpointHasMIG reports whether a prepared claim holds a MIG device.
func checkpointHasMIG(claims map[types.UID]preparedClaim) bool {
	for _, c := range claims {
		if slices.ContainsFunc(c.Devices, func(d preparedDevice) bool { return d.MIG != nil }) {
			return true
		}
	}
	return false
}

// migResult resolves a result naming a MIG device: the parent GPU (published, healthy) and
// the device to record, its runtime identity still empty. It refuses a placement that
// overlaps one a prepared claim (others, or this claim's devices so far, mine) holds on the
// GPU: the scheduler's counters keep them apart, this is defence in depth.
func (p *Plugin) migResult(r resourcev1.DeviceRequestAllocationResult, gpus []annotation.Device, published []resourcev1.Device,
	others []preparedClaim, mine []preparedDevice) (annotation.Device, preparedDevice, error) {
	m, err := dra.MIGFromResult(p.opts.Profile, r, gpus)
	if err != nil {
		return annotation.Device{}, preparedDevice{}, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	if !slices.ContainsFunc(published, func(d resourcev1.Device) bool { return d.Name == r.Device }) {
		return annotation.Device{}, preparedDevice{}, fmt.Errorf("%w: MIG device %s is not one this node publishes", ErrRefused, r.Device)
	}
	gpu := gpus[slices.IndexFunc(gpus, func(g annotation.Device) bool { return g.ID == m.GPUUUID })]
	if !gpu.Health {
		return annotation.Device{}, preparedDevice{}, fmt.Errorf("%w: MIG device %s: GPU %s is unhealthy", ErrRefused, r.Device, gpu.ID)
	}
	if p.opts.MIG == nil {
		return annotation.Device{}, preparedDevice{}, fmt.Errorf("%w: MIG device %s: %w: set Options.MIG (the node agent's MIG realiser; nodedra sets it)", ErrRefused, r.Device, ErrNoMIG)
	}
	held := func(ds []preparedDevice) error {
		for _, d := range ds {
			if d.MIG != nil && d.UUID == gpu.ID && mig.Overlaps(d.MIG.placement(), m.Placement) {
				return fmt.Errorf("%w: MIG device %s (%s at %d+%d) overlaps %s at %d+%d, prepared already on GPU %s", ErrRefused, r.Device,
					m.Profile.Name, m.Placement.Start, m.Placement.Size, d.MIG.Profile, d.MIG.Start, d.MIG.Size, gpu.ID)
			}
		}
		return nil
	}
	for _, o := range others {
		if err := held(o.Devices); err != nil {
			return annotation.Device{}, preparedDevice{}, err
		}
	}
	if err := held(mine); err != nil {
		return annotation.Device{}, preparedDevice{}, err
	}
	return gpu, preparedDevice{
		Request: r.Request, Pool: r.Pool, Device: r.Device, ShareID: r.ShareID, UUID: gpu.ID,
		MemoryMiB: max(int64(m.Profile.MemoryMB), 0), Cores: max(int64(m.Profile.Core), 0),
		MIG: &preparedMIG{Profile: m.Profile.Name, Start: m.Placement.Start, Size: m.Placement.Size},
	}, nil
}

// realiseMIG creates the MIG devices of the claim's devices that have none yet (devs is
// changed in place), reusing those of done, the claim as checkpointed before (its CDI spec
// was gone). Instances on the GPU that overlap a placement and that no prepared claim records
// (left behind by a plugin that stopped between creating and checkpointing them) are
// destroyed first: on a GPU the DRA world owns only the DRA world creates instances. It
// returns the instances it created, which the caller destroys again when the prepare fails;
// on error it has destroyed them itself.
func (p *Plugin) realiseMIG(ctx context.Context, devs []preparedDevice, done *preparedClaim, others []preparedClaim) (created []mig.Instance, err error) {
	logger := klog.FromContext(ctx)
	defer func() {
		if err != nil {
			p.destroyMIG(ctx, created)
			created = nil
		}
	}()
	var existing []mig.Instance
	listed := false
	for i := range devs {
		d := &devs[i]
		if d.MIG == nil {
			continue
		}
		if done != nil {
			if j := slices.IndexFunc(done.Devices, func(o preparedDevice) bool {
				return o.Device == d.Device && o.MIG != nil && o.MIG.MigUUID != ""
			}); j >= 0 {
				d.MIG = new(*done.Devices[j].MIG)
				continue
			}
		}
		if !listed {
			if existing, err = p.opts.MIG.Instances(ctx); err != nil {
				return created, fmt.Errorf("list the node's MIG devices: %w", err)
			}
			listed = true
		}
		for _, inst := range existing {
			if inst.GPUUUID != d.UUID || !mig.Overlaps(inst.Placement, d.MIG.placement()) || recorded(others, inst) ||
				slices.ContainsFunc(created, func(c mig.Instance) bool { return c.MigUUID == inst.MigUUID }) {
				continue
			}
			logger.Info("Destroying a MIG device no prepared claim records, at the placement of a claim", "gpu", inst.GPUUUID,
				"migUUID", inst.MigUUID, "profile", inst.Profile, "placement", fmt.Sprintf("%d+%d", inst.Placement.Start, inst.Placement.Size))
			if err := p.opts.MIG.Destroy(ctx, inst); err != nil {
				return created, fmt.Errorf("destroy MIG device %s, which no prepared claim records, at the placement of %s: %w", inst.MigUUID, d.Device, err)
			}
		}
		inst, err := p.opts.MIG.Create(ctx, d.UUID, d.MIG.Profile, d.MIG.placement())
		if err != nil {
			return created, fmt.Errorf("create MIG device %s (%s at %d+%d on GPU %s): %w", d.Device, d.MIG.Profile, d.MIG.Start, d.MIG.Size, d.UUID, err)
		}
		created = append(created, inst)
		if inst.MigUUID == "" || inst.GPUUUID != d.UUID || inst.Placement != d.MIG.placement() {
			return created, fmt.Errorf("the MIG realiser (%T) answered MIG device %q on GPU %s at %d+%d for %s at %d+%d on GPU %s",
				p.opts.MIG, inst.MigUUID, inst.GPUUUID, inst.Placement.Start, inst.Placement.Size, d.MIG.Profile, d.MIG.Start, d.MIG.Size, d.UUID)
		}
		d.MIG = recordMIG(inst)
		logger.V(2).Info("Created MIG device", "device", d.Device, "gpu", d.UUID, "migUUID", inst.MigUUID)
	}
	return created, nil
}

// recorded reports whether a prepared claim records inst.
func recorded(claims []preparedClaim, inst mig.Instance) bool {
	for _, c := range claims {
		for _, d := range c.Devices {
			if d.MIG != nil && d.UUID == inst.GPUUUID && d.MIG.MigUUID == inst.MigUUID {
				return true
			}
		}
	}
	return false
}

// destroyMIG destroys instances (best effort, logged): those created for a prepare that
// failed.
func (p *Plugin) destroyMIG(ctx context.Context, insts []mig.Instance) {
	for _, inst := range slices.Backward(insts) {
		if err := p.opts.MIG.Destroy(ctx, inst); err != nil {
			klog.FromContext(ctx).Error(err, "Failed to destroy a MIG device created for a failed prepare", "migUUID", inst.MigUUID)
		}
	}
}

// unprepareMIG destroys the MIG devices of a prepared claim.
func (p *Plugin) unprepareMIG(ctx context.Context, c preparedClaim) error {
	var errs []error
	for _, d := range c.Devices {
		if d.MIG == nil || d.MIG.MigUUID == "" {
			continue
		}
		if p.opts.MIG == nil {
			errs = append(errs, fmt.Errorf("destroy MIG device %s: %w", d.MIG.MigUUID, ErrNoMIG))
			continue
		}
		if err := p.opts.MIG.Destroy(ctx, d.MIG.instance(d.UUID)); err != nil {
			errs = append(errs, fmt.Errorf("destroy MIG device %s of %s: %w", d.MIG.MigUUID, d.Device, err))
			continue
		}
		klog.FromContext(ctx).V(2).Info("Destroyed MIG device", "device", d.Device, "gpu", d.UUID, "migUUID", d.MIG.MigUUID)
	}
	return errors.Join(errs...)
}
