package dra_test

import (
	"fmt"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// validateDevices checks devs against the rules kube-apiserver v1.37 applies to a
// ResourceSlice's devices (pkg/apis/resource/validation, validateDevice and the request
// policy checks), as far as they are cheap to restate: it returns every violation.
func validateDevices(devs []resourcev1.Device) []string {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if len(devs) > resourcev1.ResourceSliceMaxDevicesWithAdvancedFeatures {
		bad("%d devices with taints, more than %d", len(devs), resourcev1.ResourceSliceMaxDevicesWithAdvancedFeatures)
	}
	names := map[string]bool{}
	for _, d := range devs {
		if e := validation.IsDNS1123Label(d.Name); len(e) > 0 {
			bad("device name %q: %v", d.Name, e)
		}
		if names[d.Name] {
			bad("device name %q twice", d.Name)
		}
		names[d.Name] = true
		if n := len(d.Attributes) + len(d.Capacity); n > resourcev1.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
			bad("%s: %d attributes and capacities", d.Name, n)
		}
		for k, a := range d.Attributes {
			errs = append(errs, qualifiedName(d.Name, k)...)
			set := 0
			for _, on := range []bool{a.IntValue != nil, a.BoolValue != nil, a.StringValue != nil, a.VersionValue != nil,
				a.IntValues != nil, a.BoolValues != nil, a.StringValues != nil, a.VersionValues != nil} {
				if on {
					set++
				}
			}
			if set != 1 {
				bad("%s: attribute %s has %d values set", d.Name, k, set)
			}
			if a.StringValue != nil && len(*a.StringValue) > resourcev1.DeviceAttributeMaxValueLength {
				bad("%s: attribute %s longer than %d", d.Name, k, resourcev1.DeviceAttributeMaxValueLength)
			}
			if a.IntValues != nil || a.BoolValues != nil || a.StringValues != nil || a.VersionValues != nil {
				bad("%s: attribute %s is a list (alpha DRAListTypeAttributes)", d.Name, k)
			}
		}
		multi := d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations
		for k, c := range d.Capacity {
			errs = append(errs, qualifiedName(d.Name, k)...)
			if c.Value.Sign() < 0 {
				bad("%s: capacity %s negative", d.Name, k)
			}
			if c.RequestPolicy == nil {
				continue
			}
			if !multi {
				bad("%s: capacity %s has a request policy without allowMultipleAllocations", d.Name, k)
			}
			for _, e := range requestPolicy(c.Value, *c.RequestPolicy) {
				bad("%s: capacity %s: %s", d.Name, k, e)
			}
		}
		if len(d.Taints) > resourcev1.DeviceTaintsMaxLength {
			bad("%s: %d taints", d.Name, len(d.Taints))
		}
		for _, t := range d.Taints {
			if e := validation.IsQualifiedName(t.Key); len(e) > 0 {
				bad("%s: taint key %q: %v", d.Name, t.Key, e)
			}
			if e := validation.IsValidLabelValue(t.Value); len(e) > 0 {
				bad("%s: taint value %q: %v", d.Name, t.Value, e)
			}
			switch t.Effect {
			case resourcev1.DeviceTaintEffectNone, resourcev1.DeviceTaintEffectNoSchedule, resourcev1.DeviceTaintEffectNoExecute:
			default:
				bad("%s: taint effect %q", d.Name, t.Effect)
			}
		}
		if len(d.ConsumesCounters) > 0 || d.NodeName != nil || d.NodeSelector != nil || d.AllNodes != nil || len(d.BindingConditions) > 0 {
			bad("%s: sets fields this package does not use", d.Name)
		}
	}
	return errs
}

// qualifiedName is the API's check of an attribute or capacity name: a C identifier of at
// most 32 characters, optionally after "<DNS subdomain>/".
func qualifiedName(dev string, name resourcev1.QualifiedName) []string {
	domain, id, qualified := strings.Cut(string(name), "/")
	if !qualified {
		id, domain = domain, ""
	}
	var errs []string
	if qualified {
		if e := validation.IsDNS1123Subdomain(domain); len(e) > 0 || len(domain) > resourcev1.DeviceMaxDomainLength {
			errs = append(errs, fmt.Sprintf("%s: name %q: bad domain %v", dev, name, e))
		}
	}
	if e := validation.IsCIdentifier(id); len(e) > 0 || len(id) > resourcev1.DeviceMaxIDLength {
		errs = append(errs, fmt.Sprintf("%s: name %q: bad identifier %v", dev, name, e))
	}
	return errs
}

// requestPolicy restates validateRequestPolicy for integer quantities.
func requestPolicy(value resource.Quantity, p resourcev1.CapacityRequestPolicy) []string {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if len(p.ValidValues) > 0 && p.ValidRange != nil {
		return []string{"both validValues and validRange"}
	}
	if (len(p.ValidValues) > 0 || p.ValidRange != nil) && p.Default == nil {
		return []string{"no default"}
	}
	if len(p.ValidValues) > 0 {
		found := false
		for i, v := range p.ValidValues {
			if i > 0 && p.ValidValues[i-1].Cmp(v) >= 0 {
				bad("validValues not ascending")
			}
			if v.Cmp(value) > 0 {
				bad("valid value %s above the value %s", v.String(), value.String())
			}
			found = found || v.Cmp(*p.Default) == 0
		}
		if !found {
			bad("default %s not a valid value", p.Default.String())
		}
	}
	if r := p.ValidRange; r != nil {
		if r.Min == nil {
			return append(errs, "validRange without min")
		}
		if r.Min.Cmp(value) > 0 {
			bad("min %s above the value %s", r.Min.String(), value.String())
		}
		if p.Default.Cmp(*r.Min) < 0 {
			bad("default %s below min %s", p.Default.String(), r.Min.String())
		}
		if r.Max != nil {
			if r.Min.Cmp(*r.Max) > 0 || r.Max.Cmp(value) > 0 || p.Default.Cmp(*r.Max) > 0 {
				bad("max %s: min %s, value %s, default %s", r.Max.String(), r.Min.String(), value.String(), p.Default.String())
			}
		}
		if r.Step != nil {
			step := r.Step.Value()
			if step <= 0 {
				return append(errs, "step not positive")
			}
			if r.Min.Value()+step > value.Value() {
				bad("min %s + step %s above the value %s", r.Min.String(), r.Step.String(), value.String())
			}
			if (p.Default.Value()-r.Min.Value())%step != 0 {
				bad("default %s not on a step", p.Default.String())
			}
			if r.Max != nil && (r.Max.Value()-r.Min.Value())%step != 0 {
				bad("max %s not on a step", r.Max.String())
			}
		}
	}
	return errs
}
