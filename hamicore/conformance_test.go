package hamicore

import (
	"encoding/json"
	"maps"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/internal/vectors"
)

type allocatePod struct {
	Name           string            `json:"name"`
	Annotations    map[string]string `json:"annotations"`
	Containers     []string          `json:"containers"`
	InitContainers []string          `json:"init_containers"`
	ContainerEnv   map[string]string `json:"container_env"`
}

type allocateFile struct {
	Vectors []struct {
		Name  string `json:"name"`
		Input struct {
			Config struct {
				DeviceIDStrategy    string  `json:"device_id_strategy"`
				DeviceListStrategy  string  `json:"device_list_strategy"`
				DeviceMemoryScaling float64 `json:"device_memory_scaling"`
				LibCudaLogLevel     string  `json:"libcuda_log_level"`
				DisableCoreLimit    bool    `json:"disable_core_limit"`
				PreferredAllocation bool    `json:"enable_get_preferred_allocation"`
				OperatingMode       string  `json:"operating_mode"`
			} `json:"config"`
			NodeLockBefore string        `json:"node_lock_before"`
			Pods           []allocatePod `json:"pods"`
		} `json:"input"`
		Calls []struct {
			RequestDeviceIDs []string `json:"request_device_ids"`
			WantError        *string  `json:"want_error"`
			WantResponses    []struct {
				Envs   map[string]string `json:"envs"`
				Mounts []struct {
					ContainerPath string `json:"container_path"`
					HostPath      string `json:"host_path"`
					ReadOnly      bool   `json:"read_only"`
				} `json:"mounts"`
			} `json:"want_container_responses"`
		} `json:"calls"`
	} `json:"vectors"`
}

// The two GPUs of the generator's mock resource manager.
var allocateGPUs = []annotation.Device{
	{ID: "GPU-0a1b2c3d-0000-1111-2222-333344445555", Index: 0, Count: 10},
	{ID: "GPU-1a1b2c3d-0000-1111-2222-333344445555", Index: 1, Count: 10},
}

// TestConformanceAllocateEnv replays the container responses of allocate.json: for the pod
// HAMi's plugin serves and its next entry, the environment and mounts it returns.
func TestConformanceAllocateEnv(t *testing.T) {
	t.Parallel()
	const hook, cacheID = "/usr/local", "0f5e5d3c-8f0e-4c1b-9b6a-5f7c2d1e0a9b"
	placeholders := strings.NewReplacer("{HOOK_PATH}", hook, "{uuid}", cacheID)
	for _, folder := range vectors.Folders(t) {
		dir, version := folder.Dir, vectors.Pick(folder, allocation.VersionMaster, allocation.VersionV290)
		var f allocateFile
		if !folder.Read(t, "allocate.json", &f) {
			continue
		}
		base := filepath.Base(dir)
		n := 0
		for _, v := range f.Vectors {
			in := v.Input
			// The pod HAMi's plugin serves: the one the lock names, else the first listed.
			served := 0
			if parts := strings.Split(in.NodeLockBefore, ","); len(parts) == 3 {
				served = slices.IndexFunc(in.Pods, func(p allocatePod) bool { return p.Name == parts[2] })
			}
			p := in.Pods[max(served, 0)]
			pd, err := allocation.DecodePodDevices(p.Annotations[annotation.KeyNVIDIAToAllocate], version)
			if err != nil {
				t.Fatalf("%s %s: %v", base, v.Name, err)
			}
			level := in.Config.LibCudaLogLevel
			opts := EnvOptions{HookPath: hook, DeviceListStrategy: in.Config.DeviceListStrategy, DeviceIDStrategy: in.Config.DeviceIDStrategy,
				DeviceMemoryScaling: in.Config.DeviceMemoryScaling, LibCudaLogLevel: &level, DisableCoreLimit: in.Config.DisableCoreLimit}
			names := append(slices.Clone(p.InitContainers), p.Containers...)
			var env []corev1.EnvVar
			for k, val := range p.ContainerEnv {
				env = append(env, corev1.EnvVar{Name: k, Value: val})
			}
			for _, call := range v.Calls {
				if len(call.WantResponses) == 0 {
					continue
				}
				n++
				i, ok := pd.Next()
				if !ok {
					t.Fatalf("%s %s: no entry left", base, v.Name)
				}
				entry := slices.Clone(pd[i])
				if in.Config.PreferredAllocation {
					// The kubelet's replica <uuid>-<n> names the physical GPU the container gets.
					for j, id := range call.RequestDeviceIDs {
						entry[j].UUID = id[:strings.LastIndexByte(id, '-')]
					}
				}
				// The generator's pods have UID "uid-<name>" (its recorded mount paths show it).
				c := Container{PodUID: "uid-" + p.Name, Name: names[i], Env: env, CacheID: cacheID}
				gpus := slices.Clone(allocateGPUs)
				for j := range gpus {
					gpus[j].Mode = "hami-core"
					if in.Config.OperatingMode != "" {
						gpus[j].Mode = in.Config.OperatingMode // the plugin's mode is its GPUs'
					}
				}
				got, err := ContainerResponse(entry, c, gpus, opts)
				if err != nil {
					t.Fatalf("%s %s: %v", base, v.Name, err)
				}
				w := call.WantResponses[0]
				wantEnv := map[string]string{}
				for k, val := range w.Envs {
					wantEnv[k] = placeholders.Replace(val)
				}
				var wantMounts []allocation.Mount
				for _, m := range w.Mounts {
					wantMounts = append(wantMounts, allocation.Mount{ContainerPath: placeholders.Replace(m.ContainerPath), HostPath: placeholders.Replace(m.HostPath), ReadOnly: m.ReadOnly})
				}
				if diff := cmp.Diff(wantEnv, got.Envs); diff != "" {
					t.Errorf("%s %s: env (-HAMi +got):\n%s", base, v.Name, diff)
				}
				if diff := cmp.Diff(wantMounts, got.Mounts); diff != "" {
					t.Errorf("%s %s: mounts (-HAMi +got):\n%s", base, v.Name, diff)
				}
				pd = pd.Consume(i)
			}
		}
		t.Logf("checked %d vectors from %s (allocate.json container responses, %v)", n, dir, version)
	}
}

type migAllocateFile struct {
	Vectors []struct {
		Name  string `json:"name"`
		Input struct {
			Config struct {
				DeviceIDStrategy   string `json:"device_id_strategy"`
				DeviceListStrategy string `json:"device_list_strategy"`
				OperatingMode      string `json:"operating_mode"`
			} `json:"config"`
			NodeLockBefore string `json:"node_lock_before"`
			// AllocateCalls are lists of device IDs (v2.9.0) or objects, which may name the
			// node lock before the call (master): the pod served then.
			AllocateCalls []json.RawMessage `json:"allocate_calls"`
			NVML          struct {
				Devices []struct {
					UUID  string `json:"uuid"`
					Index uint   `json:"index"`
				} `json:"devices"`
			} `json:"nvml"`
			Pods []allocatePod `json:"pods"`
		} `json:"input"`
		Calls []struct {
			WantError     *string `json:"want_error"`
			WantPanic     *string `json:"want_panic"`
			WantResponses []struct {
				Envs   map[string]string `json:"envs"`
				Mounts []struct {
					ContainerPath string `json:"container_path"`
					HostPath      string `json:"host_path"`
				} `json:"mounts"`
			} `json:"want_container_responses"`
		} `json:"calls"`
	} `json:"vectors"`
}

// TestConformanceMIGAllocateEnv replays the container responses of mig-allocate.json (HAMi's
// plugin in mig mode) through ContainerResponse with the node's GPUs in mig mode, by the rule
// that HAMi's answers in mig mode follow and the SDK keeps: the answer is the device list alone
// (NVIDIA_VISIBLE_DEVICES, or the volume-mounts entries to /dev/null), no HAMi-core limit,
// mount or preload. The rule is asserted on HAMi's answers and on ours. The values are
// compared too where the entry names no MIG instance (no "[template-position]" suffix, no
// hami.io/vgpu-mig-allocations reservation): HAMi then lists the whole GPU. Where it names one,
// HAMi lists the MIG instance's UUID, which the MIG issue resolves; and calls where HAMi's MIG
// instance management fails (errors, panics) are not this rule's: both are counted apart.
func TestConformanceMIGAllocateEnv(t *testing.T) {
	t.Parallel()
	const migReservations = "hami.io/vgpu-mig-allocations"
	for _, folder := range vectors.Folders(t) {
		dir, version := folder.Dir, vectors.Pick(folder, allocation.VersionMaster, allocation.VersionV290)
		var f migAllocateFile
		if !folder.Read(t, "mig-allocate.json", &f) {
			continue
		}
		base := filepath.Base(dir)
		exact, shape, other := 0, 0, 0
		for _, v := range f.Vectors {
			in := v.Input
			if in.Config.OperatingMode != allocation.ModeMIG {
				t.Fatalf("%s %s: operating mode %q", base, v.Name, in.Config.OperatingMode)
			}
			var gpus []annotation.Device
			for _, d := range in.NVML.Devices {
				gpus = append(gpus, annotation.Device{ID: d.UUID, Index: d.Index, Count: 10, Mode: allocation.ModeMIG})
			}
			// The pod HAMi's plugin serves: the one the lock names, else the first listed.
			lock := in.NodeLockBefore
			entries := map[string]allocation.PodDevices{}
			opts := EnvOptions{DeviceListStrategy: in.Config.DeviceListStrategy, DeviceIDStrategy: in.Config.DeviceIDStrategy}
			for k, call := range v.Calls {
				var before struct {
					NodeLock string `json:"node_lock"`
				}
				if k < len(in.AllocateCalls) && json.Unmarshal(in.AllocateCalls[k], &before) == nil && before.NodeLock != "" {
					lock = before.NodeLock
				}
				served := 0
				if parts := strings.Split(lock, ","); len(parts) == 3 {
					served = slices.IndexFunc(in.Pods, func(p allocatePod) bool { return p.Name == parts[2] })
				}
				p := in.Pods[max(served, 0)]
				pd, seen := entries[p.Name]
				if !seen {
					var err error
					if pd, err = allocation.DecodePodDevices(p.Annotations[annotation.KeyNVIDIAToAllocate], version); err != nil {
						t.Fatalf("%s %s: %v", base, v.Name, err)
					}
				}
				_, reserved := p.Annotations[migReservations]
				if call.WantError != nil || call.WantPanic != nil || len(call.WantResponses) == 0 {
					other++
					break // HAMi's MIG instance management failed: the MIG issue's
				}
				w := call.WantResponses[0]
				// The rule, on HAMi's answer.
				if keys := slices.Sorted(maps.Keys(w.Envs)); !slices.Equal(keys, []string{"NVIDIA_VISIBLE_DEVICES"}) {
					t.Errorf("%s %s: HAMi's mig answer has env %v, not the device list alone", base, v.Name, keys)
				}
				for _, m := range w.Mounts {
					if path.Dir(m.ContainerPath) != ContainerDevicesDir || m.HostPath != "/dev/null" {
						t.Errorf("%s %s: HAMi's mig answer mounts %+v, not a device list entry", base, v.Name, m)
					}
				}
				i, ok := pd.Next()
				if !ok {
					t.Fatalf("%s %s: no entry left", base, v.Name)
				}
				entry := pd[i]
				got, err := ContainerResponse(entry, Container{PodUID: "uid-" + p.Name, Name: "c", CacheID: "x"}, gpus, opts)
				if err != nil {
					t.Fatalf("%s %s: %v", base, v.Name, err)
				}
				entries[p.Name] = pd.Consume(i)
				// The rule, on ours.
				if got.StateDir != "" || len(got.Mounts) != len(w.Mounts) || !slices.Equal(slices.Sorted(maps.Keys(got.Envs)), slices.Sorted(maps.Keys(w.Envs))) {
					t.Errorf("%s %s: answer %+v, HAMi's has env %v and %d mounts", base, v.Name, got, w.Envs, len(w.Mounts))
				}
				for _, m := range got.Mounts {
					if path.Dir(m.ContainerPath) != ContainerDevicesDir || m.HostPath != "/dev/null" {
						t.Errorf("%s %s: mount %+v, not a device list entry", base, v.Name, m)
					}
				}
				if reserved || slices.ContainsFunc(entry, func(d allocation.ContainerDevice) bool { return d.UUID != d.GPU() }) {
					shape++ // a MIG instance named: HAMi lists its UUID (the MIG issue)
					continue
				}
				exact++
				var wantMounts []allocation.Mount
				for _, m := range w.Mounts {
					wantMounts = append(wantMounts, allocation.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath})
				}
				if diff := cmp.Diff(w.Envs, got.Envs); diff != "" {
					t.Errorf("%s %s: env (-HAMi +got):\n%s", base, v.Name, diff)
				}
				if diff := cmp.Diff(wantMounts, got.Mounts, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("%s %s: mounts (-HAMi +got):\n%s", base, v.Name, diff)
				}
			}
		}
		t.Logf("checked %d vectors from %s (mig-allocate.json: %d calls equal, %d calls by the rule only (a MIG instance named), %d vectors where HAMi's MIG instance management fails, %v)",
			len(f.Vectors), dir, exact, shape, other, version)
	}
}
