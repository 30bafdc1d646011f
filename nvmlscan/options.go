package nvmlscan

import (
	"cmp"
	"fmt"
	"io/fs"
	"math"
	"os"
	"time"

	"k8s.io/utils/clock"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/mig"
)

// Operating modes of a node, written as the devices' "mode" (HAMi's per-node
// "operatingmode").
const (
	ModeHAMiCore = "hami-core"
	ModeMIG      = "mig"
	ModeMPS      = "mps"
)

// Defaults of [Options] and [HealthOptions], the values of HAMi's chart where it has one.
const (
	DefaultSplitCount    int32 = 10
	DefaultQuietPeriod         = 5 * time.Minute
	DefaultProbeInterval       = 30 * time.Second
	DefaultWaitTimeout         = time.Second
)

// DefaultIgnoredXIDs returns the XIDs that NVIDIA's device plugin always treats as application
// errors and never as a GPU fault: 13 (graphics engine exception), 31 (GPU memory page
// fault), 43 (GPU stopped processing), 45 (preemptive cleanup), 68 (video processor
// exception) and 109 (context switch timeout). The slice is new on every call.
func DefaultIgnoredXIDs() []uint64 {
	return []uint64{13, 31, 43, 45, 68, 109}
}

// Options configures a [Scanner]. The zero value means HAMi's chart defaults; each field
// names its default. The fields mirror the chart's device configuration (deviceSplitCount,
// deviceMemoryScaling, deviceCoreScaling, preConfiguredDeviceMemory, and the per-node
// operatingmode and filterdevices).
type Options struct {
	// SplitCount is the number of tasks that may share one GPU, published as "count"
	// (deviceSplitCount). 0 means [DefaultSplitCount] (10). Must not be negative.
	SplitCount int32
	// MemoryScaling multiplies each GPU's memory in MiB; the product is truncated
	// (deviceMemoryScaling; 81559 MiB × 1.8 = 146806). Not applied in [ModeMIG]. nil means 1.
	// Must be positive and finite.
	MemoryScaling *float64
	// CoreScaling gives "devcore" = truncate(CoreScaling × 100) (deviceCoreScaling; 0.29 gives
	// 28, as in HAMi). Not applied in [ModeMIG], where devcore is 100. nil means 1. Must be
	// positive and finite, and CoreScaling × 100 must fit an int32.
	CoreScaling *float64
	// PreConfiguredMemory is the memory in MiB to assume for a GPU whose memory query returns
	// ERROR_NOT_SUPPORTED (preConfiguredDeviceMemory; unified-memory parts such as GB10).
	// Memory scaling applies to it. 0 (the default) skips such a GPU with
	// [ErrMemoryNotSupported]. Must be within [0, 2^31-1].
	PreConfiguredMemory int64
	// Mode is the node's operating mode, published as "mode": [ModeHAMiCore], [ModeMIG] or
	// [ModeMPS]. "" means [ModeHAMiCore]. In [ModeMIG] each GPU also publishes its MIG
	// profiles (MIGVersion, MIGAllowlist, MIGModelMatch, MIGProfileDiscovery).
	Mode string
	// ExcludeUUIDs lists GPUs, by UUID, that are not registered (filterdevices.uuid). Default
	// none.
	ExcludeUUIDs []string
	// ExcludeIndexes lists GPUs, by NVML index, that are not registered
	// (filterdevices.index). Default none.
	ExcludeIndexes []uint
	// Sysfs is the root of sysfs, where a GPU's NUMA node is read from
	// bus/pci/devices/<bus id>/numa_node. nil means os.DirFS("/sys").
	Sysfs fs.FS
	// Clock is the time source of the health watch. nil means the real clock.
	Clock clock.WithTicker
	// Health configures the XID health watch of [Scanner.Run].
	Health HealthOptions
	// TopologyVersion selects whose rules [Scanner.PairScores] follows:
	// annotation.VersionMaster (the default) counts NVLinks to the peer GPU and, failing
	// those, NVSwitch links (HAMi master); annotation.VersionV290 counts direct NVLinks only,
	// so NVSwitch systems score from PCIe alone (HAMi v2.9.0).
	TopologyVersion annotation.Version
	// MIGVersion selects what a scan publishes in [ModeMIG] (see the package doc, "MIG"):
	// annotation.VersionMaster (the default) discovers each GPU's MIG profiles through NVML
	// and publishes them as "migProfiles", with count = the largest instance count (HAMi
	// master); annotation.VersionV290 publishes mode "mig" and count = SplitCount only, and
	// makes no MIG query (HAMi v2.9.0, whose scheduler brings its own geometries).
	MIGVersion annotation.Version
	// MIGAllowlist is the migProfileAllowlist: which profile names to publish for which
	// GPU models, in [ModeMIG] with MIGVersion master. nil means mig.DefaultAllowlist(); an
	// empty non-nil list publishes no profile, so every MIG GPU is skipped (as HAMi). It is
	// validated by [New] (errors.Is [ErrInvalidOptions] and mig.ErrInvalidAllowlist).
	MIGAllowlist mig.Allowlist
	// MIGModelMatch is how an allowlist model is matched against a GPU's NVML name: the
	// zero value mig.MatchWord matches it at word boundaries ("H20" does not match
	// "NVIDIA H200"); mig.MatchSubstring is HAMi's strings.Contains. The first matching
	// entry is used either way. A log line at V(2) says when other entries match too, and
	// when the substring rule would have chosen another entry.
	MIGModelMatch mig.MatchRule
	// MIGProfileDiscovery is how an allowlisted profile name is resolved to an NVML GPU
	// instance profile: [MIGDiscoveryBaseSlices] (the default, HAMi's) or
	// [MIGDiscoveryAllProfiles] (REV profiles with their own memory and placements). The
	// MIG manager ([Scanner.MIG]) resolves names by the same rule.
	MIGProfileDiscovery MIGDiscovery
}

// MIGDiscovery says how a MIG profile name of the allowlist is resolved to one of NVML's
// GPU instance profiles (see the package doc, "MIG").
type MIGDiscovery int

const (
	// MIGDiscoveryBaseSlices maps the name's slice prefix ("1g" of "1g.10gb+me") to the
	// base profile of that many slices (GPU_INSTANCE_PROFILE_1_SLICE), as HAMi master does:
	// wire compatible with HAMi, but a REV profile name (1g.10gb on an A100-40GB,
	// 1g.5gb+me) is published with the base profile's memory and placements. The default.
	MIGDiscoveryBaseSlices MIGDiscovery = iota
	// MIGDiscoveryAllProfiles asks NVML for every GPU instance profile
	// (0 … GPU_INSTANCE_PROFILE_COUNT-1), names each as nvidia-smi does
	// ("<slices>g.<GB>gb" plus "+me", "+me.all", "+gfx" or "-me") and publishes an
	// allowlisted name with the memory, SMs and placements of the profile of that name. A
	// name no profile of the GPU has is not published (logged at V(2)).
	MIGDiscoveryAllProfiles
)

// String returns "base" or "all".
func (d MIGDiscovery) String() string {
	switch d {
	case MIGDiscoveryBaseSlices:
		return "base"
	case MIGDiscoveryAllProfiles:
		return "all"
	default:
		return fmt.Sprintf("MIGDiscovery(%d)", int(d))
	}
}

// MarshalText writes the discovery's name ("base" or "all"), so that it can be a flag
// (flag.TextVar) or a configuration field.
func (d MIGDiscovery) MarshalText() ([]byte, error) {
	switch d {
	case MIGDiscoveryBaseSlices, MIGDiscoveryAllProfiles:
		return []byte(d.String()), nil
	}
	return nil, invalid("unknown MIG profile discovery %d", int(d))
}

// UnmarshalText reads "base" or "all"; anything else is an error that errors.Is
// [ErrInvalidOptions] and names both.
func (d *MIGDiscovery) UnmarshalText(text []byte) error {
	switch string(text) {
	case "base":
		*d = MIGDiscoveryBaseSlices
	case "all":
		*d = MIGDiscoveryAllProfiles
	default:
		return invalid("MIG profile discovery %q is neither base nor all", text)
	}
	return nil
}

// HealthOptions configures the XID health watch and its recovery rule (see [Scanner.Run]).
type HealthOptions struct {
	// Disabled turns the XID watch off: every GPU stays healthy and Run only waits for its
	// context. Default false.
	Disabled bool
	// IgnoredXIDs are XIDs that never mark a GPU unhealthy. nil means [DefaultIgnoredXIDs];
	// an empty non-nil slice acts on every XID.
	IgnoredXIDs []uint64
	// PersistentXIDs are XIDs after which a GPU stays unhealthy until the scanner is
	// recreated (for example 79, "GPU has fallen off the bus", or 95, "uncontained ECC
	// error", if an operator wants those to need a restart). Default none.
	PersistentXIDs []uint64
	// QuietPeriod is how long a GPU must go without a critical XID before it may be healthy
	// again. 0 means [DefaultQuietPeriod] (5 min). Must not be negative.
	QuietPeriod time.Duration
	// ProbeInterval is how often Run probes unhealthy GPUs whose quiet period is over.
	// 0 means [DefaultProbeInterval] (30 s). Must not be negative.
	ProbeInterval time.Duration
	// WaitTimeout bounds one wait for NVML events, and so how long Run takes to return after
	// its context ends. 0 means [DefaultWaitTimeout] (1 s). Must be within [1 ms, 1 h].
	WaitTimeout time.Duration
}

// config is the validated form of Options with defaults applied.
type config struct {
	splitCount     int32
	memoryScaling  float64
	coreScaling    float64
	preConfigured  int64
	mode           string
	excludeUUIDs   map[string]bool
	excludeIndexes map[uint]bool
	sysfs          fs.FS
	clock          clock.WithTicker

	topologyVersion annotation.Version

	migVersion   annotation.Version
	migAllowlist mig.Allowlist
	migMatch     mig.MatchRule
	migDiscovery MIGDiscovery

	healthDisabled bool
	ignored        map[uint64]bool
	persistent     map[uint64]bool
	quietPeriod    time.Duration
	probeInterval  time.Duration
	waitTimeout    time.Duration
}

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, ErrInvalidOptions)...)
}

func (o Options) config() (*config, error) {
	c := &config{
		splitCount:    DefaultSplitCount,
		memoryScaling: 1,
		coreScaling:   1,
		mode:          ModeHAMiCore,
		sysfs:         o.Sysfs,
		clock:         o.Clock,
		quietPeriod:   DefaultQuietPeriod,
		probeInterval: DefaultProbeInterval,
		waitTimeout:   DefaultWaitTimeout,
	}
	if o.SplitCount < 0 {
		return nil, invalid("split count %d is negative", o.SplitCount)
	}
	c.splitCount = cmp.Or(o.SplitCount, c.splitCount)
	if o.MemoryScaling != nil {
		v := *o.MemoryScaling
		if !(v > 0) || math.IsInf(v, 0) {
			return nil, invalid("memory scaling %v is not a positive finite number", v)
		}
		c.memoryScaling = v
	}
	if o.CoreScaling != nil {
		v := *o.CoreScaling
		if !(v > 0) || math.IsInf(v, 0) || v*100 >= math.MaxInt32+1 {
			return nil, invalid("core scaling %v is not a positive number with scaling × 100 within int32", v)
		}
		c.coreScaling = v
	}
	if o.PreConfiguredMemory < 0 || o.PreConfiguredMemory > math.MaxInt32 {
		return nil, invalid("pre-configured memory %d MiB is not within [0, %d]", o.PreConfiguredMemory, math.MaxInt32)
	}
	c.preConfigured = o.PreConfiguredMemory
	switch o.Mode {
	case "":
	case ModeHAMiCore, ModeMIG, ModeMPS:
		c.mode = o.Mode
	default:
		return nil, invalid("operating mode %q is not one of %q, %q, %q", o.Mode, ModeHAMiCore, ModeMIG, ModeMPS)
	}
	c.excludeUUIDs = make(map[string]bool, len(o.ExcludeUUIDs))
	for _, u := range o.ExcludeUUIDs {
		c.excludeUUIDs[u] = true
	}
	c.excludeIndexes = make(map[uint]bool, len(o.ExcludeIndexes))
	for _, i := range o.ExcludeIndexes {
		c.excludeIndexes[i] = true
	}
	switch o.TopologyVersion {
	case annotation.VersionMaster, annotation.VersionV290:
		c.topologyVersion = o.TopologyVersion
	default:
		return nil, invalid("unknown topology version %d", int(o.TopologyVersion))
	}
	switch o.MIGVersion {
	case annotation.VersionMaster, annotation.VersionV290:
		c.migVersion = o.MIGVersion
	default:
		return nil, invalid("unknown MIG version %d", int(o.MIGVersion))
	}
	c.migAllowlist = o.MIGAllowlist
	if c.migAllowlist == nil {
		c.migAllowlist = mig.DefaultAllowlist()
	}
	if err := c.migAllowlist.Validate(); err != nil {
		return nil, fmt.Errorf("MIG allowlist: %w: %w", err, ErrInvalidOptions)
	}
	switch o.MIGModelMatch {
	case mig.MatchWord, mig.MatchSubstring:
		c.migMatch = o.MIGModelMatch
	default:
		return nil, invalid("unknown MIG model match rule %d", int(o.MIGModelMatch))
	}
	switch o.MIGProfileDiscovery {
	case MIGDiscoveryBaseSlices, MIGDiscoveryAllProfiles:
		c.migDiscovery = o.MIGProfileDiscovery
	default:
		return nil, invalid("unknown MIG profile discovery %d", int(o.MIGProfileDiscovery))
	}
	if c.sysfs == nil {
		c.sysfs = os.DirFS("/sys")
	}
	if c.clock == nil {
		c.clock = clock.RealClock{}
	}

	h := o.Health
	c.healthDisabled = h.Disabled
	ignored := h.IgnoredXIDs
	if ignored == nil {
		ignored = DefaultIgnoredXIDs()
	}
	c.ignored = setOf(ignored)
	c.persistent = setOf(h.PersistentXIDs)
	for _, d := range []struct {
		name  string
		value time.Duration
		dst   *time.Duration
	}{
		{"quiet period", h.QuietPeriod, &c.quietPeriod},
		{"probe interval", h.ProbeInterval, &c.probeInterval},
		{"wait timeout", h.WaitTimeout, &c.waitTimeout},
	} {
		if d.value < 0 {
			return nil, invalid("%s %v is negative", d.name, d.value)
		}
		*d.dst = cmp.Or(d.value, *d.dst)
	}
	if c.waitTimeout < time.Millisecond || c.waitTimeout > time.Hour {
		return nil, invalid("wait timeout %v is not within [1ms, 1h]", c.waitTimeout)
	}
	return c, nil
}

func setOf(xids []uint64) map[uint64]bool {
	m := make(map[uint64]bool, len(xids))
	for _, x := range xids {
		m[x] = true
	}
	return m
}
