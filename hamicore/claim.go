package hamicore

import (
	"cmp"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/hamireg/hamireg/allocation"
)

// ClaimDevice is one GPU of a DRA claim as the node's plugin prepares it: the GPU and what
// the claim's allocation result consumed of it.
type ClaimDevice struct {
	// UUID and Index are the GPU's.
	UUID  string
	Index uint
	// MemoryMiB is the memory limit in MiB; Cores the compute share in percent (0: no limit).
	MemoryMiB, Cores int64
}

// ClaimResponse builds HAMi-core's container edits for a DRA claim whose devices are devs,
// in result order (the container's CUDA device order): NVIDIA_VISIBLE_DEVICES (UUIDs, or
// indexes with [DeviceIDIndex]), CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m and
// CUDA_DEVICE_SM_LIMIT_<i>=<cores> per device, CUDA_DEVICE_MEMORY_SHARED_CACHE=
// <HookPath>/vgpu/<claimUID>.cache, the optional variables of opts, and the mounts
// libvgpu.so (ro), the claim's state folder StateDir = <HookPath>/vgpu/claims/<claimUID>
// at <HookPath>/vgpu, /tmp/vgpulock and /etc/ld.so.preload (ro, always: the claim does not
// carry the container's CUDA_DISABLE_CONTROL). It fails for no devices, an empty claim UID
// or one that is not a safe path element, and negative limits.
//
// The optional variables and mounts are those of [ContainerResponse]: CUDA_OVERSUBSCRIBE,
// LIBCUDA_LOG_LEVEL, GPU_CORE_UTILIZATION_POLICY, NVIDIA_GDRCOPY, NVIDIA_GDS, NVIDIA_MOFED,
// the license files, and with [DeviceListVolumeMounts] NVIDIA_VISIBLE_DEVICES=
// [ContainerDevicesDir] with one /dev/null mount per device under it. A safe claim UID has
// only letters, digits, '-', '_' and '.' and is not "." or ".." (Kubernetes UIDs are UUIDs).
// A GPU listed twice (two requests of the claim on one shared GPU) is one CUDA device of the
// container: its limits are the sums of the two (cores: no limit if either has none). A device
// with an empty UUID, or one with a ',' (which would split NVIDIA_VISIBLE_DEVICES), is an
// error too, and so are options [EnvOptions.Validate] refuses and a CDI device list strategy
// ([ErrCDIUnsupported]).
func ClaimResponse(claimUID string, devs []ClaimDevice, opts EnvOptions) (allocation.Response, error) {
	if err := opts.Validate(); err != nil {
		return allocation.Response{}, fmt.Errorf("claim response: %w", err)
	}
	if s, _ := ParseDeviceListStrategies(opts.DeviceListStrategy); s.AnyCDI() {
		return allocation.Response{}, fmt.Errorf("claim response: device list strategy %q: %w: a DRA claim's devices are listed in the claim's own CDI spec, which cannot name other CDI devices: use envvar or volume-mounts for DRA",
			opts.DeviceListStrategy, ErrCDIUnsupported)
	}
	if err := checkClaimUID(claimUID); err != nil {
		return allocation.Response{}, fmt.Errorf("claim response: %w", err)
	}
	if len(devs) == 0 {
		return allocation.Response{}, fmt.Errorf("claim response for claim %s: no devices", claimUID)
	}
	var merged []ClaimDevice
	for _, d := range devs {
		switch {
		case d.UUID == "" || strings.Contains(d.UUID, ","):
			return allocation.Response{}, fmt.Errorf("claim response for claim %s: GPU %d has UUID %q: want a GPU UUID", claimUID, d.Index, d.UUID)
		case d.MemoryMiB < 0 || d.Cores < 0:
			return allocation.Response{}, fmt.Errorf("claim response for claim %s: GPU %s has negative limits (memory %d MiB, cores %d)", claimUID, d.UUID, d.MemoryMiB, d.Cores)
		}
		seen := false
		for i := range merged {
			if m := &merged[i]; m.UUID == d.UUID {
				if m.Index != d.Index {
					return allocation.Response{}, fmt.Errorf("claim response for claim %s: GPU %s listed with indexes %d and %d", claimUID, d.UUID, m.Index, d.Index)
				}
				m.MemoryMiB = saturatingAdd(m.MemoryMiB, d.MemoryMiB)
				if m.Cores == 0 || d.Cores == 0 {
					m.Cores = 0
				} else {
					m.Cores = saturatingAdd(m.Cores, d.Cores)
				}
				seen = true
			}
		}
		if !seen {
			merged = append(merged, d)
		}
	}

	vgpu := path.Join(cmp.Or(opts.HookPath, DefaultHookPath), "vgpu")
	r := allocation.Response{Envs: map[string]string{}, StateDir: path.Join(vgpu, "claims", claimUID)}
	ids := make([]string, 0, len(merged))
	for i, d := range merged {
		id := d.UUID
		if opts.DeviceIDStrategy == DeviceIDIndex {
			id = strconv.FormatUint(uint64(d.Index), 10)
		}
		ids = append(ids, id)
		r.Envs[fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d", i)] = fmt.Sprintf("%dm", d.MemoryMiB)
		r.Envs[fmt.Sprintf("CUDA_DEVICE_SM_LIMIT_%d", i)] = strconv.FormatInt(d.Cores, 10)
	}
	if err := deviceList(&r, ids, opts, "", false); err != nil {
		return allocation.Response{}, fmt.Errorf("claim response for claim %s: %w", claimUID, err)
	}
	r.Envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = path.Join(vgpu, claimUID+".cache")
	coreEdits(&r, vgpu, opts, true) // the claim does not carry the container's CUDA_DISABLE_CONTROL
	return r, nil
}

// checkClaimUID accepts a claim UID that is safe as one path element: letters, digits, '-',
// '_' and '.', not "." or "..".
func checkClaimUID(uid string) error {
	if uid == "" {
		return errors.New("empty claim UID")
	}
	if uid == "." || uid == ".." {
		return fmt.Errorf("claim UID %q is not a safe path element", uid)
	}
	for _, c := range uid {
		if !safeUIDChar(c) {
			return fmt.Errorf("claim UID %q is not a safe path element: %q is not a letter, digit, '-', '_' or '.'", uid, c)
		}
	}
	return nil
}

// safeUIDChar reports whether c may be in a claim UID.
func safeUIDChar(c rune) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return c == '-' || c == '_' || c == '.'
}

// saturatingAdd adds two non-negative limits without wrapping around.
func saturatingAdd(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return 1<<63 - 1
}
