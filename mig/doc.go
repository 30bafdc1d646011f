// Package mig is the pure side of NVIDIA MIG as HAMi master (v2.10) runs it: the reservation
// annotation hami.io/vgpu-mig-allocations ([Allocation], [DecodeAllocations],
// [EncodeAllocations]), the migProfileAllowlist ([Allowlist]), the placement packer that
// chooses a profile and a placement for a request ([Select]), the MIG instances a node realises
// ([Instance]), and v2.9.0's "[template-position]" UUID suffix ([ParseLegacyUUID]).
//
// It imports no client and no NVML: the node agent, the scheduler side and the NVML scanner
// all build on it.
package mig
