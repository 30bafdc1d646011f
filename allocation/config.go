package allocation

import (
	"cmp"
	"fmt"

	"github.com/hamireg/hamireg/annotation"
)

// Chart defaults of HAMi's NVIDIA device configuration.
const (
	DefaultResourceCount            = "nvidia.com/gpu"
	DefaultResourceMemory           = "nvidia.com/gpumem"
	DefaultResourceMemoryPercentage = "nvidia.com/gpumem-percentage"
	DefaultResourceCores            = "nvidia.com/gpucores"
	DefaultResourcePriority         = "nvidia.com/priority"
	// DefaultGPUSchedulerPolicy and DefaultNodeSchedulerPolicy are the chart's
	// --gpu-scheduler-policy and --node-scheduler-policy.
	DefaultGPUSchedulerPolicy  = PolicySpread
	DefaultNodeSchedulerPolicy = PolicyBinpack
)

// Policy orders GPUs within a node or nodes within a cluster.
type Policy string

// The policies HAMi knows. Anything else orders as [PolicySpread].
const (
	// PolicyBinpack fills the busiest GPU (or node) that fits first.
	PolicyBinpack Policy = "binpack"
	// PolicySpread takes the least used GPU (or node) that fits.
	PolicySpread Policy = "spread"
	// PolicyTopologyAware is HAMi's pair-score placement: GPUs are ordered as spread and
	// chosen by their topology scores (see [Fit]).
	PolicyTopologyAware Policy = "topology-aware"
)

// Config is HAMi's NVIDIA device configuration on the scheduler side: the resource names a pod
// asks with, the defaults filled into a request, and the policies. The zero value is HAMi's
// chart: nvidia.com/gpu, gpumem, gpumem-percentage, gpucores, priority; default memory and
// cores 0, default GPU number 1, memory factor 1; device policy spread, node policy binpack;
// HAMi master's behaviour.
type Config struct {
	// ResourceCount, ResourceMemory, ResourceMemoryPercentage, ResourceCores and
	// ResourcePriority are the resource names (the chart's resourceName, resourceMem,
	// resourceMemPercentage, resourceCores, resourcePriority).
	ResourceCount, ResourceMemory, ResourceMemoryPercentage, ResourceCores, ResourcePriority string
	// DefaultMemory is the memory in MiB given to a container that asks for neither memory
	// nor a percentage; 0 means the whole GPU (percentage 100).
	DefaultMemory int32
	// DefaultCores is the core percentage of a container that asks for none.
	DefaultCores int32
	// DefaultGPUNum is the GPU count the admission webhook adds to a container that asks for
	// memory or cores but no count. Default 1.
	DefaultGPUNum int32
	// MemoryFactor multiplies the memory a container asks for. Default 1.
	MemoryFactor int32
	// GPUSchedulerPolicy and NodeSchedulerPolicy apply when the pod's annotations do not
	// choose ([KeyGPUSchedulerPolicy], [KeyNodeSchedulerPolicy]).
	GPUSchedulerPolicy, NodeSchedulerPolicy Policy
	// Version selects HAMi v2.9.0's or master's rules where they differ.
	Version Version
	// Accounting selects how init containers and native sidecars count in the fit, the
	// stored usage, the quota and at admission. Empty means [AccountingKubernetes] with
	// [VersionMaster] and [AccountingHAMi] (HAMi v2.9.0's plain sum) with [VersionV290];
	// see [Config.EffectiveAccounting].
	Accounting Accounting
	// Vendor is the vendor word of the devices fitted (the request's and the devices' Type,
	// HAMi's CommonWord). Empty means [annotation.VendorNVIDIA]. Another vendor gets the generic
	// fit (see [ConfigFor]); build its Config with ConfigFor.
	Vendor string
}

// WithDefaults returns c with every unset field at its chart default, or an error for a
// setting HAMi cannot work with.
func (c Config) WithDefaults() (Config, error) {
	c.Vendor = cmp.Or(c.Vendor, annotation.VendorNVIDIA)
	if c.Vendor != annotation.VendorNVIDIA {
		return c.genericDefaults()
	}
	c.ResourceCount = cmp.Or(c.ResourceCount, DefaultResourceCount)
	c.ResourceMemory = cmp.Or(c.ResourceMemory, DefaultResourceMemory)
	c.ResourceMemoryPercentage = cmp.Or(c.ResourceMemoryPercentage, DefaultResourceMemoryPercentage)
	c.ResourceCores = cmp.Or(c.ResourceCores, DefaultResourceCores)
	c.ResourcePriority = cmp.Or(c.ResourcePriority, DefaultResourcePriority)
	c.DefaultGPUNum = cmp.Or(c.DefaultGPUNum, 1)
	c.MemoryFactor = cmp.Or(c.MemoryFactor, 1)
	c.GPUSchedulerPolicy = cmp.Or(c.GPUSchedulerPolicy, DefaultGPUSchedulerPolicy)
	c.NodeSchedulerPolicy = cmp.Or(c.NodeSchedulerPolicy, DefaultNodeSchedulerPolicy)
	switch {
	case c.DefaultMemory < 0 || c.DefaultCores < 0 || c.DefaultCores > 100:
		return c, fmt.Errorf("allocation config: default memory %d MiB and cores %d%% must be >= 0 (cores <= 100): %w", c.DefaultMemory, c.DefaultCores, ErrInvalidConfig)
	case c.DefaultGPUNum < 0 || c.MemoryFactor < 0:
		return c, fmt.Errorf("allocation config: default GPU number %d and memory factor %d must be >= 1: %w", c.DefaultGPUNum, c.MemoryFactor, ErrInvalidConfig)
	case c.Version != VersionMaster && c.Version != VersionV290:
		return c, fmt.Errorf("allocation config: unknown HAMi version %d: %w", c.Version, ErrInvalidConfig)
	}
	return c, c.validAccounting()
}
