package nvmlscan

import (
	"fmt"
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/mig"
)

// MIG discovery: which profiles a GPU in MIG mode publishes (HAMi master's
// discoverMigProfiles, register.go), and the GPU instance profile behind each published name,
// which the MIG manager realises.

// baseSliceCounts are the slice counts of NVML's base GPU instance profiles, in the fixed
// order in which they are queried (HAMi ranges over a map, in random order).
func baseSliceCounts() [7]int { return [7]int{1, 2, 3, 4, 6, 7, 8} }

// baseProfile is the GPU_INSTANCE_PROFILE_* enum of the base profile of slices slices.
func baseProfile(slices int) (int, bool) {
	switch slices {
	case 1:
		return nvml.GPU_INSTANCE_PROFILE_1_SLICE, true
	case 2:
		return nvml.GPU_INSTANCE_PROFILE_2_SLICE, true
	case 3:
		return nvml.GPU_INSTANCE_PROFILE_3_SLICE, true
	case 4:
		return nvml.GPU_INSTANCE_PROFILE_4_SLICE, true
	case 6:
		return nvml.GPU_INSTANCE_PROFILE_6_SLICE, true
	case 7:
		return nvml.GPU_INSTANCE_PROFILE_7_SLICE, true
	case 8:
		return nvml.GPU_INSTANCE_PROFILE_8_SLICE, true
	default:
		return 0, false
	}
}

// computeProfile is the COMPUTE_INSTANCE_PROFILE_* enum of the compute instance that fills a
// GPU instance of slices slices.
func computeProfile(slices uint32) (int, bool) {
	switch slices {
	case 1:
		return nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, true
	case 2:
		return nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, true
	case 3:
		return nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, true
	case 4:
		return nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, true
	case 6:
		return nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE, true
	case 7:
		return nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE, true
	case 8:
		return nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE, true
	default:
		return 0, false
	}
}

// profileSuffix is the attribute suffix nvidia-smi appends to the name of a GPU instance
// profile: "+me" (media extensions), "+me.all", "+gfx", "-me" (no media extensions), "".
func profileSuffix(enum int) string {
	switch enum {
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:
		return "+me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME:
		return "+me.all"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX,
		nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX:
		return "+gfx"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:
		return "-me"
	default:
		return ""
	}
}

// profileName is a GPU instance profile's name as nvidia-smi and NVIDIA's tools print it:
// "<slices>g.<GB>gb" and the suffix, where GB is the profile's share of the GPU's memory
// rounded up to eighths, times the GPU's memory in whole GiB rounded up, rounded to the
// nearest GiB (1g.5gb for 4864 of 40960 MiB, 7g.141gb for 143104 of 143771 MiB). "" when the
// total memory is unknown.
func profileName(enum int, info nvml.GpuInstanceProfileInfo, totalBytes uint64) string {
	if totalBytes == 0 || info.SliceCount == 0 {
		return ""
	}
	const gib = 1 << 30
	share := math.Ceil(float64(info.MemorySizeMB)*(1<<20)/float64(totalBytes)*8) / 8
	totalGiB := float64((totalBytes + gib - 1) / gib)
	gb := uint64(math.Round(share * totalGiB))
	return fmt.Sprintf("%dg.%dgb%s", info.SliceCount, gb, profileSuffix(enum))
}

// migProfile is a profile a GPU publishes, with the NVML profile behind it.
type migProfile struct {
	annotation.MigProfile
	// enum is the GPU_INSTANCE_PROFILE_* value it was queried with.
	enum int
	// info is NVML's answer for enum; info.Id is the nvidia-smi profile id.
	info nvml.GpuInstanceProfileInfo
}

// nvmlProfile is one answered GPU instance profile of a GPU.
type nvmlProfile struct {
	enum int
	info nvml.GpuInstanceProfileInfo
	name string
}

// migGPU is what discovery found on one GPU.
type migGPU struct {
	// profiles are the published profiles, in allowlist order.
	profiles []migProfile
	// all are the GPU's answered profiles of every enum, in enum order; filled with
	// MIGDiscoveryAllProfiles, or on demand by the MIG manager to name unknown profile ids.
	all []nvmlProfile
	// entry is the allowlist entry used, -1 when none matched.
	entry int
}

// count is the published "count": the largest instance count of the published profiles.
func (g migGPU) count() int32 {
	var n uint32
	for _, p := range g.profiles {
		n = max(n, p.info.InstanceCount)
	}
	return int32(min(n, math.MaxInt32))
}

// published returns the profiles in the annotation's form.
func (g migGPU) published() []annotation.MigProfile {
	out := make([]annotation.MigProfile, len(g.profiles))
	for i, p := range g.profiles {
		out[i] = p.MigProfile
	}
	return out
}

// byName returns the published profile of that name.
func (g migGPU) byName(name string) (migProfile, bool) {
	for _, p := range g.profiles {
		if p.Name == name {
			return p, true
		}
	}
	return migProfile{}, false
}

// nameOf returns the published name of NVML profile id (the first published profile with
// that id), else the derived name of the GPU's profile with that id, else "".
func (g migGPU) nameOf(id uint32) string {
	for _, p := range g.profiles {
		if p.info.Id == id {
			return p.Name
		}
	}
	for _, p := range g.all {
		if p.info.Id == id {
			return p.name
		}
	}
	return ""
}

// allProfiles queries every GPU instance profile enum of dev and names the answered ones.
func allProfiles(dev nvml.Device, totalBytes uint64) []nvmlProfile {
	var out []nvmlProfile
	for enum := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(enum)
		if ret != nvml.SUCCESS {
			continue
		}
		out = append(out, nvmlProfile{enum: enum, info: info, name: profileName(enum, info, totalBytes)})
	}
	return out
}

// discoverMIG discovers the profiles GPU dev publishes: HAMi master's rules (see the package
// doc), with the scanner's allowlist, model match rule and profile discovery.
func (s *Scanner) discoverMIG(logger klog.Logger, dev nvml.Device, uuid, name string, totalBytes uint64) migGPU {
	logger = klog.LoggerWithValues(logger, "gpuUUID", uuid, "name", name)
	names, entry, others := s.cfg.migAllowlist.Match(name, s.cfg.migMatch)
	g := migGPU{entry: entry}
	if len(others) > 0 {
		logger.V(2).Info("Several MIG allowlist entries match the GPU, the first one is used", "entry", entry, "others", others)
	}
	if s.cfg.migMatch != mig.MatchSubstring {
		if _, hami, _ := s.cfg.migAllowlist.Match(name, mig.MatchSubstring); hami != entry {
			logger.V(2).Info("HAMi's substring model match would use another MIG allowlist entry for this GPU",
				"entry", entry, "hamiEntry", hami)
		}
	}
	if len(names) == 0 {
		return g
	}

	// The 100 % reference: the largest base profile's SMs (98 on an A100, not its 108).
	var full uint32
	for _, slices := range baseSliceCounts() {
		enum, _ := baseProfile(slices)
		if info, ret := dev.GetGpuInstanceProfileInfo(enum); ret == nvml.SUCCESS {
			full = max(full, info.MultiprocessorCount)
		}
	}
	if full == 0 {
		logger.V(2).Info("GPU answers no base MIG profile, so no MIG profile is discovered")
		return g
	}
	if s.cfg.migDiscovery == MIGDiscoveryAllProfiles {
		g.all = allProfiles(dev, totalBytes)
	}
	skip := func(profile, step string, err error) {
		logger.Info("skip MIG profile placement discovery", "profile", profile, "step", step, "err", err)
	}
	for _, pname := range names {
		var enum int
		var info nvml.GpuInstanceProfileInfo
		switch s.cfg.migDiscovery {
		case MIGDiscoveryAllProfiles:
			found := false
			for _, p := range g.all {
				if p.name == pname {
					enum, info, found = p.enum, p.info, true
					break
				}
			}
			if !found {
				logger.V(2).Info("Allowlisted MIG profile matches no profile of the GPU, not published", "profile", pname)
				continue
			}
		default:
			slices, err := mig.SliceCount(pname)
			if err != nil {
				skip(pname, "profile-id", err)
				continue
			}
			var ok bool
			if enum, ok = baseProfile(slices); !ok {
				skip(pname, "profile-id", fmt.Errorf("no GPU instance profile of %d slices", slices))
				continue
			}
			var ret nvml.Return
			if info, ret = dev.GetGpuInstanceProfileInfo(enum); ret != nvml.SUCCESS {
				skip(pname, "profile-info", ret)
				continue
			}
		}
		placements, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			skip(pname, "possible-placements", ret)
			continue
		}
		if info.MemorySizeMB > math.MaxInt32 {
			skip(pname, "profile-info", fmt.Errorf("%w: %d MiB of memory", ErrOutOfRange, info.MemorySizeMB))
			continue
		}
		p := migProfile{enum: enum, info: info, MigProfile: annotation.MigProfile{
			Name:       pname,
			MemoryMB:   int32(info.MemorySizeMB),
			Core:       int32(min((uint64(info.MultiprocessorCount)*100+uint64(full)-1)/uint64(full), math.MaxInt32)),
			SliceCount: info.SliceCount,
		}}
		for _, pl := range placements {
			p.Placements = append(p.Placements, annotation.MigPlacement{Start: pl.Start, Size: pl.Size})
		}
		g.profiles = append(g.profiles, p)
	}
	return g
}
