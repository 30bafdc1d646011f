package allocation

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hamireg/hamireg/annotation"
)

// ErrVendorRules is wrapped by [ConfigFor] for a vendor that HAMi fits with rules of its own
// (Ascend's vNPU templates, Cambricon's, Hygon's, …) which this package does not implement: a
// generic fit must never quietly stand in for a vendor-specific one.
var ErrVendorRules = errors.New("vendor has fit rules of its own that the SDK does not implement")

// ConfigFor returns the Config that fits vendor v's devices, with base's policies and HAMi
// version.
//
// For NVIDIA it is base itself (its resource names, defaults and the NVIDIA specifics: memory
// percentage and factor, modes and MIG, type and UUID selectors, NUMA binding, topology). For
// another vendor it is the generic fit, the rules HAMi applies to every vendor's devices: a
// container asks for v.ResourceName devices (its count), v.ResourceMemoryName MiB and
// v.ResourceCoreName percent on each (when the vendor has those resources; no memory means the
// whole device, no cores mean 0), and a device fits when it is healthy, not cordoned
// ([KeyDeviceCordon]), has a free slot, the memory and the cores, and is not held exclusively
// (cores 100); devices are ordered by the device policy and nodes by the node policy as for
// NVIDIA. The request's Type is v.Name, which the devices of v's register annotation carry.
//
// A vendor that HAMi schedules with rules of its own, one of [annotation.Vendors] (or an
// Ascend or Iluvatar chip), is refused with an error wrapping [ErrVendorRules] that names it; so
// is a vendor without a ResourceName ([ErrInvalidConfig]).
func ConfigFor(v annotation.Vendor, base Config) (Config, error) {
	if v.Name == "" || v.Name == annotation.VendorNVIDIA {
		base.Vendor = annotation.VendorNVIDIA
		return base.WithDefaults()
	}
	if own, ok := hamiVendor(v); ok {
		return Config{}, fmt.Errorf("allocation config: vendor %s: HAMi schedules %s devices with rules of its own (its %s fit), which the SDK does not implement; schedule them with HAMi's scheduler: %w",
			v.Name, own, own, ErrVendorRules)
	}
	if v.ResourceName == "" {
		return Config{}, fmt.Errorf("allocation config: vendor %s has no ResourceName (the extended resource its pods ask for): %w", v.Name, ErrInvalidConfig)
	}
	c := Config{Vendor: v.Name, ResourceCount: v.ResourceName, ResourceMemory: v.ResourceMemoryName, ResourceCores: v.ResourceCoreName,
		GPUSchedulerPolicy: base.GPUSchedulerPolicy, NodeSchedulerPolicy: base.NodeSchedulerPolicy, Version: base.Version, Accounting: base.Accounting}
	return c.WithDefaults()
}

// genericDefaults completes the Config of a vendor other than NVIDIA (see [ConfigFor]).
func (c Config) genericDefaults() (Config, error) {
	c.DefaultGPUNum = cmp.Or(c.DefaultGPUNum, 1)
	c.MemoryFactor = cmp.Or(c.MemoryFactor, 1)
	c.GPUSchedulerPolicy = cmp.Or(c.GPUSchedulerPolicy, DefaultGPUSchedulerPolicy)
	c.NodeSchedulerPolicy = cmp.Or(c.NodeSchedulerPolicy, DefaultNodeSchedulerPolicy)
	switch {
	case c.ResourceCount == "":
		return c, fmt.Errorf("allocation config: vendor %s: no count resource name: %w", c.Vendor, ErrInvalidConfig)
	case c.ResourceMemoryPercentage != "" || c.MemoryFactor != 1 || c.DefaultMemory != 0 || c.DefaultCores != 0:
		return c, fmt.Errorf("allocation config: vendor %s: memory percentage, memory factor and default memory or cores are NVIDIA's settings: %w", c.Vendor, ErrInvalidConfig)
	case c.Version != VersionMaster && c.Version != VersionV290:
		return c, fmt.Errorf("allocation config: unknown HAMi version %d: %w", c.Version, ErrInvalidConfig)
	}
	return c, c.validAccounting()
}

// hamiVendor reports whether v is one of the vendors HAMi fits with its own rules, by name,
// register annotation or resource domain, and names it.
func hamiVendor(v annotation.Vendor) (string, bool) {
	domain := func(resource string) string { d, _, _ := strings.Cut(resource, "/"); return d }
	switch {
	case strings.HasPrefix(strings.ToLower(v.Name), "ascend") || strings.HasPrefix(v.RegisterKey, "hami.io/node-register-") || domain(v.ResourceName) == "huawei.com":
		return "Ascend", true
	case domain(v.ResourceName) == "iluvatar.ai":
		return "Iluvatar", true
	}
	i := slices.IndexFunc(annotation.Vendors(), func(t annotation.Vendor) bool {
		return t.Name != annotation.VendorNVIDIA && (strings.EqualFold(t.Name, v.Name) ||
			(v.RegisterKey != "" && t.RegisterKey == v.RegisterKey) || (v.ResourceName != "" && domain(t.ResourceName) == domain(v.ResourceName)))
	})
	if i < 0 {
		return "", false
	}
	return annotation.Vendors()[i].Name, true
}
