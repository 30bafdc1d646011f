package nvmlsim

import (
	"crypto/rand"
	"errors"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/hamireg/hamireg/mig"
)

// ErrMIGOverlap is returned by [Node.MIGOverlaps] when two live GPU instances of a GPU share a
// memory slice.
var ErrMIGOverlap = errors.New("simulated MIG instances overlap")

// MIGInstance is a live GPU instance of a simulated GPU and one of its compute instances, as
// [Node.MIGInstances] reports it.
type MIGInstance struct {
	// Profile is the GPU instance's nvidia-smi profile name ("1g.5gb").
	Profile string `json:"profile"`
	// ProfileID is its nvidia-smi profile id (19 for an A100's 1g.5gb).
	ProfileID uint32 `json:"profileId"`
	// Placement is where it lies on the GPU's memory slices.
	Placement mig.Placement `json:"placement"`
	// GPUInstanceID is the GPU instance's id (handed out from 1 per GPU).
	GPUInstanceID uint32 `json:"gpuInstanceId"`
	// ComputeInstanceID is the compute instance's id (from 0 per GPU instance).
	ComputeInstanceID uint32 `json:"computeInstanceId"`
	// MigUUID is the MIG device's UUID ("MIG-…"); empty for a GPU instance that has no
	// compute instance (it is then listed once, with ComputeInstanceID 0).
	MigUUID string `json:"migUUID,omitempty"`
}

// migGPU is the MIG state of one GPU. Every field is guarded by Node.migMu.
type migGPU struct {
	index int
	dev   *server.Device
	// current and pending are the MIG modes GetMigMode answers.
	current, pending int
	// activation is what SetMigMode reports as the activation status; anything but SUCCESS
	// leaves the new mode pending.
	activation nvml.Return
	profiles   []migProfile
	// gis are the live GPU instances, by id.
	gis    []*gpuInstance
	nextGI uint32
}

type gpuInstance struct {
	mock.GpuInstance
	gpu     *migGPU
	profile *migProfile
	info    nvml.GpuInstanceInfo
	// cis are the live compute instances, by id.
	cis    []*computeInstance
	nextCI uint32
	live   bool
}

type computeInstance struct {
	mock.ComputeInstance
	gi      *gpuInstance
	profile nvml.ComputeInstanceProfileInfo
	info    nvml.ComputeInstanceInfo
	device  *migDevice
	live    bool
}

// migDevice is the MIG device handle of a compute instance.
type migDevice struct {
	mock.Device
	ci   *computeInstance
	uuid string
}

// EnableMIG turns MIG mode on (current and pending) on every GPU of the node, as
// nvidia-smi -mig 1 on idle GPUs does. [Wire] leaves it off, as go-nvml's servers do; a
// program can also turn it on per GPU through NVML (SetMigMode).
func (n *Node) EnableMIG() {
	n.migMu.Lock()
	defer n.migMu.Unlock()
	for _, g := range n.mig {
		g.setMode(nvml.DEVICE_MIG_ENABLE)
	}
}

// SetMIGActivation makes SetMigMode on GPU i report ret as its activation status and leave
// the mode it sets pending, as a GPU whose MIG change needs a reset does; SUCCESS (the
// default) applies the mode at once.
func (n *Node) SetMIGActivation(i int, ret nvml.Return) {
	n.migMu.Lock()
	defer n.migMu.Unlock()
	n.mig[i].activation = ret
}

// MIGInstances returns the live MIG instances of GPU i: one entry per compute instance, by
// GPU-instance id then compute-instance id, and one per GPU instance that has none.
func (n *Node) MIGInstances(i int) []MIGInstance {
	n.migMu.Lock()
	defer n.migMu.Unlock()
	return n.mig[i].instances()
}

func (g *migGPU) instances() []MIGInstance {
	out := []MIGInstance{}
	for _, gi := range g.gis {
		base := MIGInstance{Profile: gi.profile.name, ProfileID: gi.profile.info.Id, GPUInstanceID: gi.info.Id,
			Placement: mig.Placement{Start: gi.info.Placement.Start, Size: gi.info.Placement.Size}}
		if len(gi.cis) == 0 {
			out = append(out, base)
		}
		for _, ci := range gi.cis {
			e := base
			e.ComputeInstanceID = ci.info.Id
			e.MigUUID = ci.device.uuid
			out = append(out, e)
		}
	}
	return out
}

// MIGOverlaps returns nil when no two live GPU instances of any GPU of the node share a
// memory slice, else an error (errors.Is [ErrMIGOverlap]) naming the first pair found. The
// simulation refuses to create such instances, so a non-nil answer means a bug in the
// simulation itself; end-to-end tests ask it after each step.
func (n *Node) MIGOverlaps() error {
	n.migMu.Lock()
	defer n.migMu.Unlock()
	return n.overlaps()
}

func (n *Node) overlaps() error {
	for _, g := range n.mig {
		for a, x := range g.gis {
			for _, y := range g.gis[a+1:] {
				if placementsOverlap(x.info.Placement, y.info.Placement) {
					return fmt.Errorf("%w: GPU %d: GPU instance %d (%s at %d+%d) and %d (%s at %d+%d)", ErrMIGOverlap, g.index,
						x.info.Id, x.profile.name, x.info.Placement.Start, x.info.Placement.Size,
						y.info.Id, y.profile.name, y.info.Placement.Start, y.info.Placement.Size)
				}
			}
		}
	}
	return nil
}

func placementsOverlap(a, b nvml.GpuInstancePlacement) bool {
	return mig.Overlaps(mig.Placement{Start: a.Start, Size: a.Size}, mig.Placement{Start: b.Start, Size: b.Size})
}

// setMode sets the mode at once.
func (g *migGPU) setMode(mode int) {
	g.current, g.pending = mode, mode
	g.dev.Lock()
	g.dev.MigMode = mode
	g.dev.Unlock()
}

func (g *migGPU) enabled() bool { return g.current == nvml.DEVICE_MIG_ENABLE }

// profileByID returns the profile whose nvidia-smi id is id.
func (g *migGPU) profileByID(id uint32) *migProfile {
	for i := range g.profiles {
		if g.profiles[i].info.Id == id {
			return &g.profiles[i]
		}
	}
	return nil
}

// free reports whether placement p overlaps no live GPU instance.
func (g *migGPU) free(p nvml.GpuInstancePlacement) bool {
	for _, gi := range g.gis {
		if placementsOverlap(gi.info.Placement, p) {
			return false
		}
	}
	return true
}

// count returns how many live GPU instances have the profile id.
func (g *migGPU) count(id uint32) int {
	c := 0
	for _, gi := range g.gis {
		if gi.info.ProfileId == id {
			c++
		}
	}
	return c
}

// migDevices lists the GPU's MIG devices in NVML's index order.
func (g *migGPU) migDevices() []*migDevice {
	var out []*migDevice
	for _, gi := range g.gis {
		for _, ci := range gi.cis {
			out = append(out, ci.device)
		}
	}
	return out
}

// maxMigDevices is the most MIG devices the GPU can hold: the largest instance count.
func (g *migGPU) maxMigDevices() int {
	m := 0
	for _, p := range g.profiles {
		m = max(m, int(p.info.InstanceCount))
	}
	return m
}

// wireMIG sets the MIG calls of every GPU and the library's MIG handle lookups.
func (n *Node) wireMIG() {
	n.mig = make([]*migGPU, len(n.Server.Devices))
	for i := range n.Server.Devices {
		d := n.Device(i)
		g := &migGPU{index: i, dev: d, current: d.MigMode, pending: d.MigMode, activation: nvml.SUCCESS,
			profiles: migProfiles(d.Config), nextGI: 1}
		n.mig[i] = g
		n.wireMIGDevice(g)
	}
	byUUID := n.Server.DeviceGetHandleByUUIDFunc
	n.Server.DeviceGetHandleByUUIDFunc = func(uuid string) (nvml.Device, nvml.Return) {
		n.migMu.Lock()
		for _, g := range n.mig {
			for _, md := range g.migDevices() {
				if md.uuid == uuid {
					n.migMu.Unlock()
					return md, nvml.SUCCESS
				}
			}
		}
		n.migMu.Unlock()
		return byUUID(uuid)
	}
	n.wireMIGLibrary()
}

func (n *Node) wireMIGDevice(g *migGPU) {
	d := g.dev
	d.GetMigModeFunc = func() (int, int, nvml.Return) {
		n.migMu.Lock()
		defer n.migMu.Unlock()
		return g.current, g.pending, nvml.SUCCESS
	}
	d.SetMigModeFunc = func(mode int) (nvml.Return, nvml.Return) {
		n.migMu.Lock()
		defer n.migMu.Unlock()
		switch {
		case mode != nvml.DEVICE_MIG_ENABLE && mode != nvml.DEVICE_MIG_DISABLE:
			return nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_INVALID_ARGUMENT
		case mode == nvml.DEVICE_MIG_DISABLE && len(g.gis) > 0:
			return nvml.ERROR_IN_USE, nvml.ERROR_IN_USE
		case g.activation != nvml.SUCCESS:
			g.pending = mode
			return g.activation, nvml.SUCCESS
		}
		g.setMode(mode)
		return nvml.SUCCESS, nvml.SUCCESS
	}
	d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
	d.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) { return nil, nvml.ERROR_INVALID_ARGUMENT }
	d.GetGpuInstanceIdFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	d.GetComputeInstanceIdFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	// GetComputeRunningProcesses is the usage's (wireUsage).
	d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
	d.GetGpuInstanceProfileInfoFunc = func(enum int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
		if enum < 0 || enum >= nvml.GPU_INSTANCE_PROFILE_COUNT {
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		for _, p := range g.profiles {
			if p.enum == enum {
				return p.info, nvml.SUCCESS
			}
		}
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	d.GetGpuInstancePossiblePlacementsFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
		if info == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		p := g.profileByID(info.Id)
		if p == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return slices.Clone(p.placements), nvml.SUCCESS
	}
	d.GetGpuInstanceRemainingCapacityFunc = func(info *nvml.GpuInstanceProfileInfo) (int, nvml.Return) {
		n.migMu.Lock()
		defer n.migMu.Unlock()
		p, ret := g.creatable(info)
		switch {
		case ret == nvml.ERROR_INSUFFICIENT_RESOURCES:
			return 0, nvml.SUCCESS
		case ret != nvml.SUCCESS:
			return 0, ret
		}
		taken := make([]nvml.GpuInstancePlacement, 0, len(g.gis))
		for _, gi := range g.gis {
			taken = append(taken, gi.info.Placement)
		}
		c := 0
		for _, pl := range p.placements {
			if !slices.ContainsFunc(taken, func(t nvml.GpuInstancePlacement) bool { return placementsOverlap(t, pl) }) {
				taken = append(taken, pl)
				c++
			}
		}
		return min(c, int(p.info.InstanceCount)-g.count(p.info.Id)), nvml.SUCCESS
	}
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, placement *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		n.migMu.Lock()
		defer n.migMu.Unlock()
		if placement == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		p, ret := g.creatable(info)
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		if !slices.Contains(p.placements, *placement) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return n.createGI(g, p, *placement)
	}
	d.CreateGpuInstanceFunc = func(info *nvml.GpuInstanceProfileInfo) (nvml.GpuInstance, nvml.Return) {
		n.migMu.Lock()
		defer n.migMu.Unlock()
		p, ret := g.creatable(info)
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		for _, pl := range p.placements {
			if g.free(pl) {
				return n.createGI(g, p, pl)
			}
		}
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	d.GetGpuInstancesFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
		n.migMu.Lock()
		defer n.migMu.Unlock()
		if info == nil || g.profileByID(info.Id) == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		if !g.enabled() {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		var out []nvml.GpuInstance
		for _, gi := range g.gis {
			if gi.info.ProfileId == info.Id {
				out = append(out, gi)
			}
		}
		return out, nvml.SUCCESS
	}
	d.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		n.migMu.Lock()
		defer n.migMu.Unlock()
		if !g.enabled() {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		for _, gi := range g.gis {
			if int(gi.info.Id) == id {
				return gi, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) {
		n.migMu.Lock()
		defer n.migMu.Unlock()
		if !g.enabled() {
			return 0, nvml.SUCCESS
		}
		return g.maxMigDevices(), nvml.SUCCESS
	}
	d.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		n.migMu.Lock()
		defer n.migMu.Unlock()
		if i < 0 {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		devs := g.migDevices()
		if !g.enabled() || i >= len(devs) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return devs[i], nvml.SUCCESS
	}
}

// creatable checks that a GPU instance of the profile info names may be created: MIG mode on
// (ERROR_NOT_SUPPORTED), a known profile id (ERROR_INVALID_ARGUMENT), fewer than its instance
// count live (ERROR_INSUFFICIENT_RESOURCES).
func (g *migGPU) creatable(info *nvml.GpuInstanceProfileInfo) (*migProfile, nvml.Return) {
	if info == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if !g.enabled() {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	p := g.profileByID(info.Id)
	if p == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if g.count(p.info.Id) >= int(p.info.InstanceCount) {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	return p, nvml.SUCCESS
}

// createGI makes a GPU instance of p at pl on g, refusing an occupied placement.
func (n *Node) createGI(g *migGPU, p *migProfile, pl nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
	if !g.free(pl) {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	gi := &gpuInstance{gpu: g, profile: p, live: true,
		info: nvml.GpuInstanceInfo{Device: g.dev, Id: g.nextGI, ProfileId: p.info.Id, Placement: pl}}
	g.nextGI++
	g.gis = append(g.gis, gi)
	n.wireGPUInstance(gi)
	return gi, nvml.SUCCESS
}

func (n *Node) wireGPUInstance(gi *gpuInstance) {
	g := gi.gpu
	gi.GetInfoFunc = func() (nvml.GpuInstanceInfo, nvml.Return) {
		n.migMu.Lock()
		defer n.migMu.Unlock()
		if !gi.live {
			return nvml.GpuInstanceInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		return gi.info, nvml.SUCCESS
	}
	ciProfile := func(ciEnum, engine int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
		if ciEnum < 0 || ciEnum >= nvml.COMPUTE_INSTANCE_PROFILE_COUNT || engine < 0 || engine >= nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT {
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		info, ok := g.dev.Config.MIGProfiles.ComputeInstanceProfiles[gi.profile.enum][ciEnum]
		if !ok || engine != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		return info, nvml.SUCCESS
	}
	gi.GetComputeInstanceProfileInfoFunc = func(ciEnum, engine int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
		n.migMu.Lock()
		defer n.migMu.Unlock()
		if !gi.live {
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		return ciProfile(ciEnum, engine)
	}
	known := func(info *nvml.ComputeInstanceProfileInfo) bool {
		if info == nil {
			return false
		}
		for _, p := range g.dev.Config.MIGProfiles.ComputeInstanceProfiles[gi.profile.enum] {
			if p.Id == info.Id {
				return true
			}
		}
		return false
	}
	gi.CreateComputeInstanceFunc = func(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
		n.migMu.Lock()
		defer n.migMu.Unlock()
		if !gi.live || !known(info) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		used, same := uint32(0), uint32(0)
		for _, ci := range gi.cis {
			used += ci.profile.SliceCount
			if ci.profile.Id == info.Id {
				same++
			}
		}
		if used+info.SliceCount > gi.profile.info.SliceCount || same >= info.InstanceCount {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		ci := &computeInstance{gi: gi, profile: *info, live: true, info: nvml.ComputeInstanceInfo{Device: g.dev, Id: gi.nextCI,
			ProfileId: info.Id, Placement: nvml.ComputeInstancePlacement{Start: used, Size: info.SliceCount}}}
		ci.info.GpuInstance = gi
		ci.device = &migDevice{ci: ci, uuid: newMIGUUID()}
		gi.nextCI++
		gi.cis = append(gi.cis, ci)
		n.wireComputeInstance(ci)
		n.wireMIGHandle(ci.device)
		return ci, nvml.SUCCESS
	}
	gi.GetComputeInstancesFunc = func(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
		n.migMu.Lock()
		defer n.migMu.Unlock()
		if !gi.live || !known(info) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		var out []nvml.ComputeInstance
		for _, ci := range gi.cis {
			if ci.info.ProfileId == info.Id {
				out = append(out, ci)
			}
		}
		return out, nvml.SUCCESS
	}
	gi.GetComputeInstanceByIdFunc = func(id int) (nvml.ComputeInstance, nvml.Return) {
		n.migMu.Lock()
		defer n.migMu.Unlock()
		if !gi.live {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		for _, ci := range gi.cis {
			if int(ci.info.Id) == id {
				return ci, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	gi.DestroyFunc = func() nvml.Return {
		n.migMu.Lock()
		defer n.migMu.Unlock()
		switch {
		case !gi.live:
			return nvml.ERROR_INVALID_ARGUMENT
		case len(gi.cis) > 0:
			return nvml.ERROR_IN_USE
		}
		gi.live = false
		g.gis = slices.DeleteFunc(g.gis, func(x *gpuInstance) bool { return x == gi })
		return nvml.SUCCESS
	}
}

func (n *Node) wireComputeInstance(ci *computeInstance) {
	ci.GetInfoFunc = func() (nvml.ComputeInstanceInfo, nvml.Return) {
		n.migMu.Lock()
		defer n.migMu.Unlock()
		if !ci.live {
			return nvml.ComputeInstanceInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		return ci.info, nvml.SUCCESS
	}
	ci.DestroyFunc = func() nvml.Return {
		n.migMu.Lock()
		defer n.migMu.Unlock()
		if !ci.live {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		ci.live = false
		ci.gi.cis = slices.DeleteFunc(ci.gi.cis, func(x *computeInstance) bool { return x == ci })
		return nvml.SUCCESS
	}
}

// wireMIGHandle sets the calls of a MIG device handle; every call on the handle of a
// destroyed compute instance answers ERROR_INVALID_ARGUMENT.
func (n *Node) wireMIGHandle(md *migDevice) {
	ci := md.ci
	gi := ci.gi
	parent := gi.gpu.dev
	live := func() bool {
		n.migMu.Lock()
		defer n.migMu.Unlock()
		return ci.live
	}
	md.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return true, nvml.SUCCESS }
	md.GetUUIDFunc = func() (string, nvml.Return) {
		if !live() {
			return "", nvml.ERROR_INVALID_ARGUMENT
		}
		return md.uuid, nvml.SUCCESS
	}
	md.GetNameFunc = func() (string, nvml.Return) {
		if !live() {
			return "", nvml.ERROR_INVALID_ARGUMENT
		}
		return parent.Config.Name + " MIG " + gi.profile.name, nvml.SUCCESS
	}
	md.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) {
		if !live() {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return parent, nvml.SUCCESS
	}
	md.GetGpuInstanceIdFunc = func() (int, nvml.Return) {
		if !live() {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		return int(gi.info.Id), nvml.SUCCESS
	}
	md.GetComputeInstanceIdFunc = func() (int, nvml.Return) {
		if !live() {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		return int(ci.info.Id), nvml.SUCCESS
	}
	md.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		if !live() {
			return nvml.Memory{}, nvml.ERROR_INVALID_ARGUMENT
		}
		total := gi.profile.info.MemorySizeMB << 20
		return nvml.Memory{Total: total, Free: total}, nvml.SUCCESS
	}
	md.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		if !live() {
			return nvml.DeviceAttributes{}, nvml.ERROR_INVALID_ARGUMENT
		}
		p := ci.profile
		return nvml.DeviceAttributes{MultiprocessorCount: p.MultiprocessorCount, SharedCopyEngineCount: p.SharedCopyEngineCount,
			SharedDecoderCount: p.SharedDecoderCount, SharedEncoderCount: p.SharedEncoderCount, SharedJpegCount: p.SharedJpegCount,
			SharedOfaCount: p.SharedOfaCount, GpuInstanceSliceCount: gi.profile.info.SliceCount,
			ComputeInstanceSliceCount: p.SliceCount, MemorySizeMB: gi.profile.info.MemorySizeMB}, nvml.SUCCESS
	}
	md.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
	md.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
}

// newMIGUUID draws a MIG device UUID as the driver writes it: "MIG-" and a random UUID.
func newMIGUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("MIG-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// wireMIGLibrary sets the library-level forms of the MIG calls (nvml.Interface's
// DeviceGetMigMode(dev) and so on), which the simulated servers leave unwired, to the
// handles' own calls.
func (n *Node) wireMIGLibrary() {
	s := n.Server
	s.DeviceGetMigModeFunc = func(d nvml.Device) (int, int, nvml.Return) { return d.GetMigMode() }
	s.DeviceSetMigModeFunc = func(d nvml.Device, mode int) (nvml.Return, nvml.Return) { return d.SetMigMode(mode) }
	s.DeviceGetMaxMigDeviceCountFunc = func(d nvml.Device) (int, nvml.Return) { return d.GetMaxMigDeviceCount() }
	s.DeviceGetMigDeviceHandleByIndexFunc = func(d nvml.Device, i int) (nvml.Device, nvml.Return) {
		return d.GetMigDeviceHandleByIndex(i)
	}
	s.DeviceIsMigDeviceHandleFunc = func(d nvml.Device) (bool, nvml.Return) { return d.IsMigDeviceHandle() }
	s.DeviceGetDeviceHandleFromMigDeviceHandleFunc = func(d nvml.Device) (nvml.Device, nvml.Return) {
		return d.GetDeviceHandleFromMigDeviceHandle()
	}
	s.DeviceGetGpuInstanceIdFunc = func(d nvml.Device) (int, nvml.Return) { return d.GetGpuInstanceId() }
	s.DeviceGetComputeInstanceIdFunc = func(d nvml.Device) (int, nvml.Return) { return d.GetComputeInstanceId() }
	s.DeviceGetGpuInstanceProfileInfoFunc = func(d nvml.Device, enum int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
		return d.GetGpuInstanceProfileInfo(enum)
	}
	s.DeviceGetGpuInstancePossiblePlacementsFunc = func(d nvml.Device, info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
		return d.GetGpuInstancePossiblePlacements(info)
	}
	s.DeviceCreateGpuInstanceWithPlacementFunc = func(d nvml.Device, info *nvml.GpuInstanceProfileInfo, p *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		return d.CreateGpuInstanceWithPlacement(info, p)
	}
	s.DeviceGetGpuInstancesFunc = func(d nvml.Device, info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
		return d.GetGpuInstances(info)
	}
	s.DeviceGetGpuInstanceByIdFunc = func(d nvml.Device, id int) (nvml.GpuInstance, nvml.Return) { return d.GetGpuInstanceById(id) }
	s.GpuInstanceGetInfoFunc = func(gi nvml.GpuInstance) (nvml.GpuInstanceInfo, nvml.Return) { return gi.GetInfo() }
	s.GpuInstanceDestroyFunc = func(gi nvml.GpuInstance) nvml.Return { return gi.Destroy() }
	s.GpuInstanceGetComputeInstanceProfileInfoFunc = func(gi nvml.GpuInstance, p, e int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
		return gi.GetComputeInstanceProfileInfo(p, e)
	}
	s.GpuInstanceCreateComputeInstanceFunc = func(gi nvml.GpuInstance, info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
		return gi.CreateComputeInstance(info)
	}
	s.GpuInstanceGetComputeInstancesFunc = func(gi nvml.GpuInstance, info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
		return gi.GetComputeInstances(info)
	}
	s.GpuInstanceGetComputeInstanceByIdFunc = func(gi nvml.GpuInstance, id int) (nvml.ComputeInstance, nvml.Return) {
		return gi.GetComputeInstanceById(id)
	}
	s.ComputeInstanceGetInfoFunc = func(ci nvml.ComputeInstance) (nvml.ComputeInstanceInfo, nvml.Return) { return ci.GetInfo() }
	s.ComputeInstanceDestroyFunc = func(ci nvml.ComputeInstance) nvml.Return { return ci.Destroy() }
}

// MIGState is a snapshot of a node's MIG state, as a program's debug endpoint serves it in
// JSON (examples/deviceplugin's /debug/nvmlsim/mig).
type MIGState struct {
	// GPUs lists every GPU of the node, by index.
	GPUs []MIGGPUState `json:"gpus"`
	// Overlaps is the error [Node.MIGOverlaps] returns, "" when no two live instances
	// overlap.
	Overlaps string `json:"overlaps,omitempty"`
}

// MIGGPUState is one GPU of a [MIGState].
type MIGGPUState struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	// MIGMode is the current MIG mode: 1 on, 0 off.
	MIGMode int `json:"migMode"`
	// Instances are the GPU's live instances, as [Node.MIGInstances] lists them.
	Instances []MIGInstance `json:"instances"`
}

// MIGState returns a consistent snapshot of the node's MIG state: every GPU's mode and live
// instances, and whether any two overlap.
func (n *Node) MIGState() MIGState {
	n.migMu.Lock()
	defer n.migMu.Unlock()
	var s MIGState
	for i, g := range n.mig {
		s.GPUs = append(s.GPUs, MIGGPUState{Index: i, UUID: n.UUID(i), MIGMode: g.current, Instances: g.instances()})
	}
	if err := n.overlaps(); err != nil {
		s.Overlaps = err.Error()
	}
	return s
}
