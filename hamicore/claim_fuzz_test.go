package hamicore_test

import (
	"fmt"
	"path"
	"strconv"
	"strings"
	"testing"

	"github.com/hamireg/hamireg/hamicore"
)

// FuzzClaimResponse builds responses for random claims: ClaimResponse never panics, and a
// response keeps the claim's state inside <HookPath>/vgpu/claims, lists each GPU once and
// has one memory and one SM limit per listed GPU.
func FuzzClaimResponse(f *testing.F) {
	f.Add("5f0c5e1a-7c2d-4b7e-9f0e-1d2c3b4a5968", "GPU-a", uint8(0), int64(10240), int64(30), "GPU-b", uint8(1), int64(0), int64(0), "", uint8(0))
	f.Add("../x", "GPU-a", uint8(0), int64(1), int64(1), "GPU-a", uint8(0), int64(9223372036854775807), int64(5), "/opt/hami", uint8(3))
	f.Add("a/b", "", uint8(3), int64(-1), int64(-1), "x,y", uint8(2), int64(1), int64(1), "relative", uint8(1))
	f.Fuzz(func(t *testing.T, uid, uuid1 string, index1 uint8, mem1, cores1 int64, uuid2 string, index2 uint8, mem2, cores2 int64, hook string, strategy uint8) {
		devs := []hamicore.ClaimDevice{{UUID: uuid1, Index: uint(index1), MemoryMiB: mem1, Cores: cores1}}
		if uuid2 != "" {
			devs = append(devs, hamicore.ClaimDevice{UUID: uuid2, Index: uint(index2), MemoryMiB: mem2, Cores: cores2})
		}
		opts := hamicore.EnvOptions{HookPath: hook}
		if strategy&1 != 0 {
			opts.DeviceIDStrategy = hamicore.DeviceIDIndex
		}
		if strategy&2 != 0 {
			opts.DeviceListStrategy = hamicore.DeviceListVolumeMounts
		}
		r, err := hamicore.ClaimResponse(uid, devs, opts)
		if err != nil {
			return
		}
		if uid == "" || uid == "." || uid == ".." || strings.ContainsAny(uid, "/\\") {
			t.Fatalf("claim UID %q accepted", uid)
		}
		claims := path.Join(hook, "vgpu", "claims")
		if hook == "" {
			claims = path.Join(hamicore.DefaultHookPath, "vgpu", "claims")
		}
		if path.Dir(r.StateDir) != claims || path.Base(r.StateDir) != uid {
			t.Fatalf("StateDir %q is not %s/%s", r.StateDir, claims, uid)
		}
		n := 1
		if uuid2 != "" && uuid2 != uuid1 {
			n = 2
		}
		limits := 0
		for k := range r.Envs {
			if strings.HasPrefix(k, "CUDA_DEVICE_MEMORY_LIMIT_") || strings.HasPrefix(k, "CUDA_DEVICE_SM_LIMIT_") {
				limits++
			}
		}
		if limits != 2*n {
			t.Fatalf("%d limits for %d GPUs: %v", limits, n, r.Envs)
		}
		for i := range n {
			mem := strings.TrimSuffix(r.Envs[fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d", i)], "m")
			if v, err := strconv.ParseInt(mem, 10, 64); err != nil || v < 0 {
				t.Fatalf("memory limit %d: %q", i, mem)
			}
			if v, err := strconv.ParseInt(r.Envs[fmt.Sprintf("CUDA_DEVICE_SM_LIMIT_%d", i)], 10, 64); err != nil || v < 0 {
				t.Fatalf("SM limit %d: %q", i, r.Envs[fmt.Sprintf("CUDA_DEVICE_SM_LIMIT_%d", i)])
			}
		}
		if opts.DeviceListStrategy == "" {
			if got := len(strings.Split(r.Envs["NVIDIA_VISIBLE_DEVICES"], ",")); got != n {
				t.Fatalf("NVIDIA_VISIBLE_DEVICES %q lists %d GPUs, want %d", r.Envs["NVIDIA_VISIBLE_DEVICES"], got, n)
			}
		}
	})
}
