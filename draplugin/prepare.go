package draplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/hamicore"
	"github.com/hamireg/hamireg/internal/statedir"
	"github.com/hamireg/hamireg/mig"
)

// cdiSpecFile is the file name of a claim's transient CDI spec (the CDI library's
// GenerateTransientSpecName shape: <vendor>-<class>_<transient ID>.json).
func cdiSpecFile(uid types.UID) string {
	return CDIVendor + "-" + CDIClass + "_" + string(uid) + ".json"
}

// cdiDeviceName is the CDI device of one result of a claim: unique per claim, so that a
// runtime's cached spec of an earlier claim never matches.
func cdiDeviceName(uid types.UID, device string) string { return string(uid) + "-" + device }

// cdiDeviceID is the fully qualified CDI device name the kubelet hands the runtime.
func cdiDeviceID(uid types.UID, device string) string {
	return CDIVendor + "/" + CDIClass + "=" + cdiDeviceName(uid, device)
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin. For each claim it reads the
// allocation results of its driver, in result order: the device's GPU and the consumed
// memory and cores (dra.ConsumedFromResult). It refuses ([ErrRefused]) a device that is not
// one of the published GPUs, an unhealthy one, one whose prepared claims would exceed its
// memory or cores, and what Options.Refuse refuses. It writes the claim's transient CDI spec
// (HAMi-core's edits of hamicore.ClaimResponse, one CDI device per result), with
// Options.PrepareStateDir the claim's state folder, then the checkpoint, and answers one
// device per result with its CDI device ID and share ID. A claim prepared already gets the
// same answer again, with nothing rewritten (unless its CDI spec is gone: a reboot empties
// /var/run); a claim with no result of this driver gets no devices. A result that names a
// MIG placement creates that MIG device through Options.MIG instead (see the package
// documentation, "MIG devices").
func (p *Plugin) PrepareResourceClaims(ctx context.Context, claims []*resourcev1.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	unlock, err := p.lock(ctx)
	if err != nil {
		return nil, fmt.Errorf("prepare claims: %w", err)
	}
	defer unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		devs, err := p.prepareClaim(ctx, claim)
		if err != nil {
			if errors.Is(err, ErrRefused) {
				p.refused.Add(1)
			}
			klog.FromContext(ctx).Error(err, "Claim not prepared", "claim", klog.KObj(claim), "claimUID", claim.UID)
			out[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		p.prepared.Add(1)
		out[claim.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

func (p *Plugin) prepareClaim(ctx context.Context, claim *resourcev1.ResourceClaim) ([]kubeletplugin.Device, error) {
	logger := klog.FromContext(ctx)
	uid := claim.UID
	if !safeName(string(uid)) {
		return nil, fmt.Errorf("prepare claim %s: UID %q is not a file name", klog.KObj(claim), uid)
	}
	p.mu.Lock()
	done, ok := p.claims[uid]
	gpus := p.gpus
	published := p.devices
	others := make([]preparedClaim, 0, len(p.claims))
	for u, c := range p.claims {
		if u != uid {
			others = append(others, c)
		}
	}
	p.mu.Unlock()
	if ok {
		if _, err := os.Stat(done.CDISpec); err == nil {
			logger.V(4).Info("Claim prepared already", "claim", klog.KObj(claim), "claimUID", uid)
			return answer(done), nil
		}
		logger.V(2).Info("CDI spec of a prepared claim is gone, writing it again", "claim", klog.KObj(claim), "claimUID", uid, "cdiSpec", done.CDISpec)
	}

	var results []resourcev1.DeviceRequestAllocationResult
	if claim.Status.Allocation != nil {
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver == p.opts.Profile.Driver {
				results = append(results, r)
			}
		}
	}
	if len(results) == 0 {
		return []kubeletplugin.Device{}, nil
	}

	pc := preparedClaim{Namespace: claim.Namespace, Name: claim.Name, CDISpec: filepath.Join(p.opts.CDIDir, cdiSpecFile(uid))}
	devs := make([]hamicore.ClaimDevice, 0, len(results))
	named := make([]annotation.Device, 0, len(results))
	nMIG := 0
	for _, r := range results {
		if p.opts.Profile.IsMIGDeviceName(r.Device) {
			gpu, d, err := p.migResult(r, gpus, published, others, pc.Devices)
			if err != nil {
				return nil, fmt.Errorf("prepare claim %s: %w", klog.KObj(claim), err)
			}
			d.CDIDeviceID = cdiDeviceID(uid, r.Device)
			pc.Devices = append(pc.Devices, d)
			if !slices.ContainsFunc(named, func(g annotation.Device) bool { return g.ID == gpu.ID }) {
				named = append(named, gpu)
			}
			nMIG++
			continue
		}
		c, err := dra.ConsumedFromResult(p.opts.Profile, r, gpus)
		if err != nil {
			return nil, fmt.Errorf("prepare claim %s: %w: %w", klog.KObj(claim), ErrRefused, err)
		}
		gi := slices.IndexFunc(gpus, func(g annotation.Device) bool { return g.Index == c.Index })
		if gi < 0 || !slices.ContainsFunc(published, func(d resourcev1.Device) bool { return d.Name == r.Device }) {
			return nil, fmt.Errorf("prepare claim %s: %w: device %s is not one of the GPUs this node publishes", klog.KObj(claim), ErrRefused, r.Device)
		}
		gpu := gpus[gi]
		if !gpu.Health {
			return nil, fmt.Errorf("prepare claim %s: %w: device %s (GPU %s) is unhealthy", klog.KObj(claim), ErrRefused, r.Device, gpu.ID)
		}
		if err := fits(gpu, c, others, pc.Devices); err != nil {
			return nil, fmt.Errorf("prepare claim %s: %w: device %s (GPU %s): %w", klog.KObj(claim), ErrRefused, r.Device, gpu.ID, err)
		}
		devs = append(devs, hamicore.ClaimDevice{UUID: gpu.ID, Index: gpu.Index, MemoryMiB: c.MemoryMiB, Cores: c.Cores})
		if !slices.ContainsFunc(named, func(g annotation.Device) bool { return g.ID == gpu.ID }) {
			named = append(named, gpu)
		}
		pc.Devices = append(pc.Devices, preparedDevice{
			Request: r.Request, Pool: r.Pool, Device: r.Device, ShareID: r.ShareID,
			CDIDeviceID: cdiDeviceID(uid, r.Device), UUID: gpu.ID, MemoryMiB: c.MemoryMiB, Cores: c.Cores,
		})
	}
	if nMIG > 0 && len(devs) > 0 {
		return nil, fmt.Errorf("prepare claim %s: %w: %d of its %d devices are MIG devices and the others shares of GPUs, which one container cannot get together (HAMi-core does not run on MIG devices): ask for them in two claims",
			klog.KObj(claim), ErrRefused, nMIG, len(pc.Devices))
	}
	if p.opts.Refuse != nil {
		if err := p.opts.Refuse(ctx, named); err != nil {
			return nil, fmt.Errorf("prepare claim %s: %w: %w", klog.KObj(claim), ErrRefused, err)
		}
	}
	var (
		resp    allocation.Response
		created []mig.Instance
		err     error
	)
	if nMIG > 0 {
		var before *preparedClaim
		if ok {
			before = &done
		}
		if created, err = p.realiseMIG(ctx, pc.Devices, before, others); err != nil {
			return nil, fmt.Errorf("prepare claim %s: %w", klog.KObj(claim), err)
		}
		uuids := make([]string, len(pc.Devices))
		for i, d := range pc.Devices {
			uuids[i] = d.MIG.MigUUID
		}
		resp, err = hamicore.MIGResponse(uuids, p.opts.Env)
	} else {
		resp, err = hamicore.ClaimResponse(string(uid), devs, p.opts.Env)
	}
	if err != nil {
		p.destroyMIG(ctx, created)
		return nil, fmt.Errorf("prepare claim %s: %w", klog.KObj(claim), err)
	}
	if p.opts.PrepareStateDir && resp.StateDir != "" {
		pc.StateDir = filepath.Clean(resp.StateDir) // in the spec's record: written first
	}
	if err := p.writeCDISpec(uid, pc, resp); err != nil {
		p.destroyMIG(ctx, created)
		return nil, fmt.Errorf("prepare claim %s: %w", klog.KObj(claim), err)
	}
	if pc.StateDir != "" {
		if err := statedir.Recreate(pc.StateDir); err != nil {
			_ = os.Remove(pc.CDISpec)
			return nil, fmt.Errorf("prepare claim %s: HAMi-core state folder: %w", klog.KObj(claim), err)
		}
	}
	if p.opts.AfterCDISpec != nil {
		p.opts.AfterCDISpec(ctx, uid)
	}

	p.mu.Lock()
	next := maps.Clone(p.claims)
	p.mu.Unlock()
	next[uid] = pc
	if err := p.writeCheckpoint(next); err != nil {
		_ = os.Remove(pc.CDISpec)
		if pc.StateDir != "" {
			_ = os.RemoveAll(pc.StateDir)
		}
		p.destroyMIG(ctx, created)
		return nil, fmt.Errorf("prepare claim %s: %w", klog.KObj(claim), err)
	}
	p.mu.Lock()
	p.claims = next
	p.mu.Unlock()
	logger.V(2).Info("Prepared claim", "claim", klog.KObj(claim), "claimUID", uid, "devices", len(pc.Devices), "cdiSpec", pc.CDISpec)
	return answer(pc), nil
}

// fits checks that the prepared claims others, plus the devices of this claim prepared so
// far (mine), leave room on gpu for c: defence in depth, the scheduler's allocator keeps
// consumable capacity within the device's.
func fits(gpu annotation.Device, c dra.Consumed, others []preparedClaim, mine []preparedDevice) error {
	mem, cores := c.MemoryMiB, c.Cores
	add := func(ds []preparedDevice) {
		for _, d := range ds {
			if d.UUID == gpu.ID {
				mem += d.MemoryMiB
				cores += d.Cores
			}
		}
	}
	for _, o := range others {
		add(o.Devices)
	}
	add(mine)
	if mem > int64(gpu.Devmem) {
		return fmt.Errorf("prepared claims would hold %d MiB of its %d MiB", mem, gpu.Devmem)
	}
	if cores > int64(gpu.Devcore) {
		return fmt.Errorf("prepared claims would hold %d%% of its %d%% cores", cores, gpu.Devcore)
	}
	return nil
}

// answer is the helper's result for a prepared claim, one device per allocation result.
func answer(c preparedClaim) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, len(c.Devices))
	for i, d := range c.Devices {
		out[i] = kubeletplugin.Device{
			Requests:     []string{d.Request},
			PoolName:     d.Pool,
			DeviceName:   d.Device,
			CDIDeviceIDs: []string{d.CDIDeviceID},
			ShareID:      d.ShareID,
		}
	}
	return out
}

// cdiSpec is a claim's transient CDI spec: the claim's edits at spec level (applied once
// when any of its devices is injected) and one device per result with
// HAMIREG_DRA_DEVICE_<i>=<uuid>.
func cdiSpec(c preparedClaim, uid types.UID, r allocation.Response) (*cdispec.Spec, error) {
	spec := &cdispec.Spec{Kind: CDIVendor + "/" + CDIClass}
	for _, k := range slices.Sorted(maps.Keys(r.Envs)) {
		spec.ContainerEdits.Env = append(spec.ContainerEdits.Env, k+"="+r.Envs[k])
	}
	for _, m := range r.Mounts {
		opt := "rw"
		if m.ReadOnly {
			opt = "ro"
		}
		spec.ContainerEdits.Mounts = append(spec.ContainerEdits.Mounts, &cdispec.Mount{
			HostPath: m.HostPath, ContainerPath: m.ContainerPath, Type: "bind",
			Options: []string{opt, "nosuid", "nodev", "bind"},
		})
	}
	for _, d := range r.DeviceNodes {
		perm := d.Permissions
		if perm == "" {
			perm = allocation.DefaultDeviceNodePermissions
		}
		spec.ContainerEdits.DeviceNodes = append(spec.ContainerEdits.DeviceNodes, &cdispec.DeviceNode{
			Path: d.ContainerPath, HostPath: d.HostPath, Permissions: perm,
		})
	}
	for i, d := range c.Devices {
		id := d.UUID
		if d.MIG != nil {
			id = d.MIG.MigUUID
		}
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name:           cdiDeviceName(uid, d.Device),
			ContainerEdits: cdispec.ContainerEdits{Env: []string{"HAMIREG_DRA_DEVICE_" + strconv.Itoa(i) + "=" + id}},
		})
	}
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, err
	}
	spec.Version = v
	return spec, nil
}

// writeCDISpec writes the claim's CDI spec atomically, mode 0644 (the runtime reads it).
func (p *Plugin) writeCDISpec(uid types.UID, c preparedClaim, r allocation.Response) error {
	spec, err := cdiSpec(c, uid, r)
	if err != nil {
		return fmt.Errorf("%w %s: %w", ErrCDI, c.CDISpec, err)
	}
	if err := p.annotateSpec(spec, uid, c); err != nil { // record.go
		return fmt.Errorf("%w %s: %w", ErrCDI, c.CDISpec, err)
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fmt.Errorf("%w %s: encode: %w", ErrCDI, c.CDISpec, err)
	}
	data = append(data, '\n')
	if err := os.MkdirAll(p.opts.CDIDir, 0o755); err != nil {
		return fmt.Errorf("%w %s: %w", ErrCDI, c.CDISpec, err)
	}
	if err := writeFileAtomic(c.CDISpec, data, 0o644); err != nil {
		return fmt.Errorf("%w %s: %w", ErrCDI, c.CDISpec, err)
	}
	return nil
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin: for each claim prepared (by
// UID, from the checkpoint, so also after a restart) it destroys its MIG devices, removes the
// CDI spec and the state folder and drops the claim from the checkpoint. A claim not prepared is a success.
func (p *Plugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	unlock, err := p.lock(ctx)
	if err != nil {
		return nil, fmt.Errorf("unprepare claims: %w", err)
	}
	defer unlock()
	logger := klog.FromContext(ctx)
	out := make(map[types.UID]error, len(claims))
	for _, ref := range claims {
		p.mu.Lock()
		c, ok := p.claims[ref.UID]
		p.mu.Unlock()
		if !ok {
			logger.V(4).Info("Claim not prepared, nothing to unprepare", "claim", ref.NamespacedName, "claimUID", ref.UID)
			p.unprepared.Add(1)
			out[ref.UID] = nil
			continue
		}
		if err := p.unprepareMIG(ctx, c); err != nil {
			out[ref.UID] = fmt.Errorf("unprepare claim %s: %w", ref.NamespacedName, err)
			continue
		}
		if err := os.Remove(c.CDISpec); err != nil && !errors.Is(err, fs.ErrNotExist) {
			out[ref.UID] = fmt.Errorf("unprepare claim %s: %w %s: %w", ref.NamespacedName, ErrCDI, c.CDISpec, err)
			continue
		}
		if c.StateDir != "" {
			if err := os.RemoveAll(c.StateDir); err != nil {
				out[ref.UID] = fmt.Errorf("unprepare claim %s: HAMi-core state folder: %w", ref.NamespacedName, err)
				continue
			}
		}
		p.mu.Lock()
		next := maps.Clone(p.claims)
		p.mu.Unlock()
		delete(next, ref.UID)
		if err := p.writeCheckpoint(next); err != nil {
			out[ref.UID] = fmt.Errorf("unprepare claim %s: %w", ref.NamespacedName, err)
			continue
		}
		p.mu.Lock()
		p.claims = next
		p.mu.Unlock()
		p.unprepared.Add(1)
		logger.V(2).Info("Unprepared claim", "claim", ref.NamespacedName, "claimUID", ref.UID)
		out[ref.UID] = nil
	}
	return out, nil
}
