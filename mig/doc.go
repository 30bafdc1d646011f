// Package mig is the pure side of NVIDIA MIG as HAMi master (v2.10) runs it: the reservation
// annotation hami.io/vgpu-mig-allocations ([Allocation], [DecodeAllocations],
// [EncodeAllocations]), the migProfileAllowlist ([Allowlist]), the placement packer that
// chooses a profile and a placement for a request ([Select]), the MIG instances a node realises
// ([Instance]), and v2.9.0's "[template-position]" UUID suffix ([ParseLegacyUUID]).
//
// It imports no client and no NVML: the node agent, the scheduler side and the NVML scanner
// all build on it. Everything here is a pure function of its arguments: no I/O, no logging,
// no global state, safe for concurrent use.
//
// # Reservations
//
// HAMi master's scheduler records, for every MIG device it chose, the container and device
// index, the GPU, the profile name and the placement in the pod annotation [KeyAllocations];
// the device plugin adds the runtime identity (MIG UUID, GPU-instance and compute-instance
// ids) of the instance it created. [DecodeAllocations] applies HAMi's rejection rules (negative
// index, empty GPU UUID or profile, placement size 0, a partial runtime identity, a duplicate
// container/device pair; every error is [ErrMalformed]) and [EncodeAllocations] writes the value
// byte for byte as HAMi does. An empty list encodes to "": HAMi writes no annotation then.
// [Find] gives one container's reservations in device order, [WithRuntime] records a realised
// instance, [Allocation.Realized] tells whether it was.
//
// # Allowlist
//
// Which profiles a node publishes for a GPU is policy: the first [Allowlist] entry whose model
// matches the GPU's NVML name gives the profile names, NVML gives their memory, cores and
// placements. [ParseAllowlist] reads nvidia.migProfileAllowlist from HAMi's device ConfigMap
// (the list, or the whole document) and [Allowlist.Validate] applies HAMi's loader rules
// ([ErrInvalidAllowlist]). [ChartAllowlist] is HAMi's chart default verbatim; [SliceKey] and
// [SliceCount] read a profile name's "<N>g" prefix.
//
// # Legacy v2.9.0
//
// HAMi v2.9.0 records a MIG device as "GPU-<uuid>[<template>-<position>]" in
// hami.io/vgpu-devices-allocated; [ParseLegacyUUID] and [FormatLegacyUUID] read and write it,
// so that a v2.9.0 pod's MIG usage can be counted.
//
// # Deliberate differences from HAMi
//
// Wire compatibility is kept: what this package encodes is what HAMi's components read. Where
// HAMi is wrong, the SDK follows a rule, each asserted in a test:
//
//   - Word-bounded model match ([MatchWord], the zero [MatchRule]): an allowlist model matches
//     a GPU when it occurs in the NVML name with no ASCII letter or digit right before or after
//     it. HAMi's substring match ([MatchSubstring], kept for conformance) gives an H200 (NVML
//     name "NVIDIA H200") the chart's H20 profiles, because "H20" comes first in the chart.
//     [Allowlist.Match] also returns the other entries that match, so a caller can warn about
//     an ambiguous allowlist, and -1 when none matches, so a caller can say why a MIG GPU is
//     not published (HAMi drops it silently).
//   - Extra real NVML names in [DefaultAllowlist], the SDK's default: "NVIDIA A100 80GB PCIe",
//     "NVIDIA H100 80GB HBM3" and "NVIDIA H200" match no chart entry (or the wrong one) and
//     would not be published; DefaultAllowlist adds them to their entries.
//   - Bound-checked legacy positions: [ParseLegacyUUID] accepts decimal template and position
//     numbers up to 65536 only and reports anything else as [ErrMalformed]; HAMi v2.9.0's
//     scheduler indexes its geometry with whatever the suffix says and panics on an
//     out-of-range position. Callers still check the numbers against the geometry.
//
// Usage (the node side: realise each device of a container, record the runtime identity, and
// pick a GPU's profiles):
//
//	allocs, err := mig.DecodeAllocations(annotations[mig.KeyAllocations])
//	if err != nil {
//		return "", nil, err // errors.Is(err, mig.ErrMalformed)
//	}
//	for _, a := range mig.Find(allocs, containerIndex) {
//		if !a.Realized() {
//			// Create the instance of a.Profile at a.Placement on a.GPUUUID, then:
//			allocs, _ = mig.WithRuntime(allocs, a.ContainerIndex, a.DeviceIndex, runtime)
//		}
//	}
//	value := mig.EncodeAllocations(allocs) // merge-patch it under mig.KeyAllocations
//
//	profiles, entry, others := mig.DefaultAllowlist().Match(nvmlName, mig.MatchWord)
//	if entry < 0 || len(others) > 0 { // no entry, or an ambiguous allowlist
//		return value, nil, fmt.Errorf("%q matches entry %d and also %v", nvmlName, entry, others)
//	}
package mig
