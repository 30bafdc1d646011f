package nvmlscan

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/mig"
)

// MIGManager realises MIG devices on the scanner's GPUs through NVML: it lists the MIG
// devices that exist, creates a GPU instance of a published profile at an exact placement with
// the compute instance that fills it, and destroys them. Its method set is that of package
// nodeagent's MIGInstances. Get it from [Scanner.MIG].
//
// It shares the scanner's NVML initialisation (no Init or Shutdown of its own; HAMi's device
// plugin leaves 3-5 unbalanced nvmlInit calls per Allocate) and its MIG options: a profile
// name is resolved to the NVML profile the scan published under that name
// (Options.MIGProfileDiscovery), so a REV name is realised as exactly the profile whose
// memory and placements the node published, never silently as another. Its calls are
// serialised with scans and with each other, and fail with [ErrClosed] after
// [Scanner.Close].
type MIGManager struct {
	s *Scanner
}

// MIG returns the scanner's MIG manager.
func (s *Scanner) MIG() *MIGManager { return &MIGManager{s: s} }

// lock takes the scanner's scan lock, failing when the scanner is closed.
func (m *MIGManager) lock(what string) (unlock func(), err error) {
	m.s.scanMu.Lock()
	if m.s.isClosed() {
		m.s.scanMu.Unlock()
		return nil, fmt.Errorf("%s: %w", what, ErrClosed)
	}
	return m.s.scanMu.Unlock, nil
}

// handle returns the GPU of that UUID, classifying an unknown UUID as [ErrUnknownGPU].
func (m *MIGManager) handle(uuid string) (nvml.Device, error) {
	dev, ret := m.s.lib.DeviceGetHandleByUUID(uuid)
	switch ret {
	case nvml.SUCCESS:
		return dev, nil
	case nvml.ERROR_NOT_FOUND, nvml.ERROR_INVALID_ARGUMENT:
		return nil, fmt.Errorf("%w %s: %w", ErrUnknownGPU, uuid, ret)
	default:
		return nil, fmt.Errorf("get GPU %s: %w", uuid, ret)
	}
}

// discover runs the scan's MIG discovery on dev.
func (m *MIGManager) discover(logger klog.Logger, dev nvml.Device, uuid string) (migGPU, error) {
	name, ret := dev.GetName()
	if ret != nvml.SUCCESS {
		return migGPU{}, fmt.Errorf("get name of GPU %s: %w", uuid, ret)
	}
	var total uint64
	if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
		total = mem.Total
	}
	g := m.s.discoverMIG(logger, dev, uuid, name, total)
	if g.all == nil {
		g.all = allProfiles(dev, total)
	}
	return g, nil
}

// Instances lists the MIG devices that exist now on every GPU in MIG mode, whoever created
// them, in GPU then MIG device order. Profile is the published name of the instance's
// profile (the name a scan gives it), else nvidia-smi's name for it; ProfileID is NVML's
// profile id. A GPU that does not support MIG or has MIG off is left out.
func (m *MIGManager) Instances(ctx context.Context) ([]mig.Instance, error) {
	unlock, err := m.lock("list MIG instances")
	if err != nil {
		return nil, err
	}
	defer unlock()
	logger := klog.FromContext(ctx)
	n, ret := m.s.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("list MIG instances: count devices: %w", ret)
	}
	var out []mig.Instance
	for i := range n {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("list MIG instances: %w", context.Cause(ctx))
		}
		dev, ret := m.s.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("list MIG instances: get GPU %d: %w", i, ret)
		}
		uuid, ret := dev.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("list MIG instances: get UUID of GPU %d: %w", i, ret)
		}
		insts, err := m.instances(logger, dev, uuid)
		if err != nil {
			return nil, fmt.Errorf("list MIG instances: %w", err)
		}
		out = append(out, insts...)
	}
	return out, nil
}

// instances lists the MIG devices of one GPU; none when MIG is unsupported or off.
func (m *MIGManager) instances(logger klog.Logger, dev nvml.Device, uuid string) ([]mig.Instance, error) {
	current, _, ret := dev.GetMigMode()
	switch {
	case ret == nvml.ERROR_NOT_SUPPORTED:
		return nil, nil
	case ret != nvml.SUCCESS:
		return nil, fmt.Errorf("get MIG mode of GPU %s: %w", uuid, ret)
	case current != nvml.DEVICE_MIG_ENABLE:
		return nil, nil
	}
	count, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("get MIG device count of GPU %s: %w", uuid, ret)
	}
	var g *migGPU
	var out []mig.Instance
	for i := range count {
		md, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue // no MIG device at this index
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("get MIG device %d of GPU %s: %w", i, uuid, ret)
		}
		inst, err := m.describe(dev, md, uuid)
		if err != nil {
			return nil, err
		}
		if g == nil {
			d, err := m.discover(logger, dev, uuid)
			if err != nil {
				return nil, err
			}
			g = &d
		}
		inst.Profile = g.nameOf(inst.ProfileID)
		out = append(out, inst)
	}
	return out, nil
}

// describe reads a MIG device's identity: its UUID, GPU and compute instance ids, and its
// GPU instance's profile id and placement.
func (m *MIGManager) describe(dev, md nvml.Device, gpuUUID string) (mig.Instance, error) {
	inst := mig.Instance{GPUUUID: gpuUUID}
	migUUID, ret := md.GetUUID()
	if ret != nvml.SUCCESS {
		return inst, fmt.Errorf("get UUID of a MIG device of GPU %s: %w", gpuUUID, ret)
	}
	giID, ret := md.GetGpuInstanceId()
	if ret != nvml.SUCCESS {
		return inst, fmt.Errorf("get GPU instance id of MIG device %s: %w", migUUID, ret)
	}
	ciID, ret := md.GetComputeInstanceId()
	if ret != nvml.SUCCESS {
		return inst, fmt.Errorf("get compute instance id of MIG device %s: %w", migUUID, ret)
	}
	gi, ret := dev.GetGpuInstanceById(giID)
	if ret != nvml.SUCCESS {
		return inst, fmt.Errorf("get GPU instance %d of GPU %s: %w", giID, gpuUUID, ret)
	}
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return inst, fmt.Errorf("get info of GPU instance %d of GPU %s: %w", giID, gpuUUID, ret)
	}
	inst.ProfileID = info.ProfileId
	inst.Placement = mig.Placement{Start: info.Placement.Start, Size: info.Placement.Size}
	inst.Runtime = mig.Runtime{MigUUID: migUUID, GPUInstanceID: uint32(giID), ComputeInstanceID: uint32(ciID)}
	return inst, nil
}

// ensureMIGMode switches a GPU with MIG off (current and pending) on, and fails when a mode
// change waits for a GPU reset. It returns the GPU's handle, fetched again after a mode
// change (as HAMi does).
func (m *MIGManager) ensureMIGMode(logger klog.Logger, dev nvml.Device, uuid string) (nvml.Device, error) {
	current, pending, ret := dev.GetMigMode()
	if ret == nvml.ERROR_NOT_SUPPORTED {
		return nil, fmt.Errorf("%w: GPU %s: %w", ErrMIGNotSupported, uuid, ret)
	}
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("get MIG mode of GPU %s: %w", uuid, ret)
	}
	if current == nvml.DEVICE_MIG_DISABLE && pending == nvml.DEVICE_MIG_DISABLE {
		activation, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("enable MIG mode of GPU %s: %w", uuid, ret)
		}
		logger.Info("Enabled MIG mode of GPU", "gpuUUID", uuid, "activation", activation.Error())
		var err error
		if dev, err = m.handle(uuid); err != nil {
			return nil, err
		}
		if current, pending, ret = dev.GetMigMode(); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("get MIG mode of GPU %s: %w", uuid, ret)
		}
	}
	if current != pending || current != nvml.DEVICE_MIG_ENABLE {
		return nil, fmt.Errorf("GPU %s: MIG mode current %d, pending %d: %w", uuid, current, pending, ErrMIGModePending)
	}
	return dev, nil
}

// Create makes a GPU instance of the named profile at exactly placement on the GPU gpuUUID,
// with the compute instance that fills it (full size, shared engines), and returns the MIG
// device. It switches a GPU whose MIG mode is off (current and pending) on first.
//
// Errors, for errors.Is: [ErrUnknownGPU] (no such GPU), [ErrMIGNotSupported],
// [ErrMIGModePending] (a mode change waits for a GPU reset), [ErrUnknownProfile] (the GPU
// does not publish the profile), [ErrPlacementNotPossible] (not a possible placement of the
// profile), [ErrPlacementTaken] (another instance is in the way; the error names it when it
// is found), else the [nvml.Return] of the failed call. When a step after the GPU instance's
// creation fails, what was created is destroyed before Create returns.
func (m *MIGManager) Create(ctx context.Context, gpuUUID, profile string, placement mig.Placement) (mig.Instance, error) {
	unlock, err := m.lock("create MIG instance")
	if err != nil {
		return mig.Instance{}, err
	}
	defer unlock()
	inst, err := m.create(klog.FromContext(ctx), gpuUUID, profile, placement)
	if err != nil {
		return mig.Instance{}, fmt.Errorf("create MIG instance %s at %d+%d on GPU %s: %w",
			profile, placement.Start, placement.Size, gpuUUID, err)
	}
	return inst, nil
}

func (m *MIGManager) create(logger klog.Logger, gpuUUID, profile string, placement mig.Placement) (inst mig.Instance, err error) {
	dev, err := m.handle(gpuUUID)
	if err != nil {
		return inst, err
	}
	if dev, err = m.ensureMIGMode(logger, dev, gpuUUID); err != nil {
		return inst, err
	}
	g, err := m.discover(logger, dev, gpuUUID)
	if err != nil {
		return inst, err
	}
	p, ok := g.byName(profile)
	if !ok {
		var names []string
		for _, q := range g.profiles {
			names = append(names, q.Name)
		}
		return inst, fmt.Errorf("%w: %q (published: %s)", ErrUnknownProfile, profile, strings.Join(names, ", "))
	}
	possible, ret := dev.GetGpuInstancePossiblePlacements(&p.info)
	if ret != nvml.SUCCESS {
		return inst, fmt.Errorf("get possible placements of %s: %w", profile, ret)
	}
	want := nvml.GpuInstancePlacement{Start: placement.Start, Size: placement.Size}
	if !slices.Contains(possible, want) {
		return inst, fmt.Errorf("%w: %d+%d", ErrPlacementNotPossible, placement.Start, placement.Size)
	}
	gi, ret := dev.CreateGpuInstanceWithPlacement(&p.info, &want)
	if ret == nvml.ERROR_INSUFFICIENT_RESOURCES || ret == nvml.ERROR_IN_USE {
		return inst, m.taken(logger, dev, gpuUUID, placement, ret)
	}
	if ret != nvml.SUCCESS {
		return inst, fmt.Errorf("create GPU instance: %w", ret)
	}
	var ci nvml.ComputeInstance
	defer func() {
		if err == nil {
			return
		}
		if ci != nil {
			if ret := ci.Destroy(); ret != nvml.SUCCESS {
				err = errors.Join(err, fmt.Errorf("destroy the compute instance created: %w", ret))
			}
		}
		if ret := gi.Destroy(); ret != nvml.SUCCESS {
			err = errors.Join(err, fmt.Errorf("destroy the GPU instance created: %w", ret))
		}
	}()
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return inst, fmt.Errorf("get info of the GPU instance created: %w", ret)
	}
	ciEnum, ok := computeProfile(p.info.SliceCount)
	if !ok {
		return inst, fmt.Errorf("no compute instance profile of %d slices: %w", p.info.SliceCount, nvml.ERROR_NOT_SUPPORTED)
	}
	ciProfile, ret := gi.GetComputeInstanceProfileInfo(ciEnum, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		return inst, fmt.Errorf("get compute instance profile of %d slices: %w", p.info.SliceCount, ret)
	}
	if ci, ret = gi.CreateComputeInstance(&ciProfile); ret != nvml.SUCCESS {
		ci = nil
		return inst, fmt.Errorf("create compute instance: %w", ret)
	}
	ciInfo, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		return inst, fmt.Errorf("get info of the compute instance created: %w", ret)
	}
	migUUID, err := migDeviceUUID(dev, giInfo.Id, ciInfo.Id)
	if err != nil {
		return inst, err
	}
	inst = mig.Instance{
		GPUUUID:   gpuUUID,
		Profile:   profile,
		ProfileID: giInfo.ProfileId,
		Placement: mig.Placement{Start: giInfo.Placement.Start, Size: giInfo.Placement.Size},
		Runtime:   mig.Runtime{MigUUID: migUUID, GPUInstanceID: giInfo.Id, ComputeInstanceID: ciInfo.Id},
	}
	logger.V(2).Info("Created MIG instance", "gpuUUID", gpuUUID, "profile", profile, "profileID", inst.ProfileID,
		"placement", fmt.Sprintf("%d+%d", placement.Start, placement.Size), "migUUID", migUUID,
		"gpuInstanceID", giInfo.Id, "computeInstanceID", ciInfo.Id)
	return inst, nil
}

// taken is the error of a placement NVML refused as occupied, naming the instance in the way
// when one is found.
func (m *MIGManager) taken(logger klog.Logger, dev nvml.Device, uuid string, placement mig.Placement, ret nvml.Return) error {
	insts, err := m.instances(logger, dev, uuid)
	if err != nil {
		logger.V(2).Info("Could not list the MIG instances in the way", "gpuUUID", uuid, "err", err)
	}
	var in []string
	for _, inst := range insts {
		if mig.Overlaps(inst.Placement, placement) {
			in = append(in, fmt.Sprintf("%s at %d+%d (MIG device %s, GPU instance %d)", inst.Profile,
				inst.Placement.Start, inst.Placement.Size, inst.MigUUID, inst.GPUInstanceID))
		}
	}
	if len(in) == 0 {
		return fmt.Errorf("%w: %w", ErrPlacementTaken, ret)
	}
	return fmt.Errorf("%w by %s: %w", ErrPlacementTaken, strings.Join(in, ", "), ret)
}

// migDeviceUUID finds the UUID of the MIG device of GPU instance gi and compute instance ci.
func migDeviceUUID(dev nvml.Device, gi, ci uint32) (string, error) {
	count, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return "", fmt.Errorf("get MIG device count: %w", ret)
	}
	for i := range count {
		md, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		giID, ret := md.GetGpuInstanceId()
		if ret != nvml.SUCCESS || giID < 0 || uint32(giID) != gi {
			continue
		}
		ciID, ret := md.GetComputeInstanceId()
		if ret != nvml.SUCCESS || ciID < 0 || uint32(ciID) != ci {
			continue
		}
		uuid, ret := md.GetUUID()
		if ret != nvml.SUCCESS {
			return "", fmt.Errorf("get UUID of the MIG device created: %w", ret)
		}
		return uuid, nil
	}
	return "", fmt.Errorf("find the MIG device of GPU instance %d, compute instance %d: %w", gi, ci, nvml.ERROR_NOT_FOUND)
}

// Destroy removes the MIG device: its compute instance, then its GPU instance, found by the
// ids of inst.Runtime on the GPU inst.GPUUUID. An instance already gone is not an error
// (Destroy is idempotent), and neither is a GPU instance id that now belongs to another
// instance (another profile or placement than inst's): that one is left alone.
func (m *MIGManager) Destroy(ctx context.Context, inst mig.Instance) error {
	unlock, err := m.lock("destroy MIG instance")
	if err != nil {
		return err
	}
	defer unlock()
	if err := m.destroy(klog.FromContext(ctx), inst); err != nil {
		return fmt.Errorf("destroy MIG instance %s (GPU instance %d, compute instance %d) on GPU %s: %w",
			inst.MigUUID, inst.GPUInstanceID, inst.ComputeInstanceID, inst.GPUUUID, err)
	}
	return nil
}

func gone(ret nvml.Return) bool {
	return ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT
}

func (m *MIGManager) destroy(logger klog.Logger, inst mig.Instance) error {
	dev, err := m.handle(inst.GPUUUID)
	if err != nil {
		return err
	}
	gi, ret := dev.GetGpuInstanceById(int(inst.GPUInstanceID))
	if gone(ret) {
		logger.V(4).Info("MIG instance already gone", "gpuUUID", inst.GPUUUID, "gpuInstanceID", inst.GPUInstanceID)
		return nil
	}
	if ret != nvml.SUCCESS {
		return fmt.Errorf("get GPU instance: %w", ret)
	}
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("get info of the GPU instance: %w", ret)
	}
	if (inst.Placement.Size != 0 && (info.Placement.Start != inst.Placement.Start || info.Placement.Size != inst.Placement.Size)) ||
		(inst.ProfileID != 0 && info.ProfileId != inst.ProfileID) {
		logger.V(2).Info("GPU instance id now belongs to another MIG instance, left alone", "gpuUUID", inst.GPUUUID,
			"gpuInstanceID", inst.GPUInstanceID, "profileID", info.ProfileId,
			"placement", fmt.Sprintf("%d+%d", info.Placement.Start, info.Placement.Size))
		return nil
	}
	ci, ret := gi.GetComputeInstanceById(int(inst.ComputeInstanceID))
	switch {
	case ret == nvml.SUCCESS:
		if ret := ci.Destroy(); ret != nvml.SUCCESS && !gone(ret) {
			return fmt.Errorf("destroy compute instance: %w", ret)
		}
	case !gone(ret):
		return fmt.Errorf("get compute instance: %w", ret)
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS && !gone(ret) {
		return fmt.Errorf("destroy GPU instance: %w", ret)
	}
	logger.V(2).Info("Destroyed MIG instance", "gpuUUID", inst.GPUUUID, "migUUID", inst.MigUUID,
		"gpuInstanceID", inst.GPUInstanceID, "computeInstanceID", inst.ComputeInstanceID)
	return nil
}
