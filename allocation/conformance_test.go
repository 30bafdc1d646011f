package allocation

import (
	"encoding/json"
	"errors"
	"maps"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/internal/vectors"
)

// decodeRaw decodes a vector field whose shape depends on the vector; null decodes to nothing.
func decodeRaw(t *testing.T, raw json.RawMessage, v any) {
	t.Helper()
	if err := json.Unmarshal(raw, v); len(raw) > 0 && err != nil {
		t.Fatal(err)
	}
}

// vectorContainerDevice is a ContainerDevice as the vector files spell it.
type vectorContainerDevice struct {
	UUID      string `json:"uuid"`
	Type      string `json:"type"`
	Usedmem   int32  `json:"usedmem"`
	Usedcores int32  `json:"usedcores"`
}

func podDevices(in [][]vectorContainerDevice) PodDevices {
	pd := make(PodDevices, len(in))
	for i, c := range in {
		pd[i] = ContainerDevices{}
		for _, d := range c {
			pd[i] = append(pd[i], ContainerDevice{UUID: d.UUID, Type: d.Type, Usedmem: d.Usedmem, Usedcores: d.Usedcores})
		}
	}
	return pd
}

type podDevicesFile struct {
	Vectors []struct {
		Name     string `json:"name"`
		Function string `json:"function"`
		// Input is [][]device for EncodePodSingleDevice and an object for the others.
		Input     json.RawMessage `json:"input"`
		Reencoded *string         `json:"reencoded"`
		WantError *string         `json:"want_error"`
		// WantOutput is a string, a key→value map or a vendor→containers map.
		WantOutput json.RawMessage `json:"want_output"`
	} `json:"vectors"`
}

// TestConformancePodDevices replays poddevices.json: HAMi's pod device encoder byte for byte,
// and its decoder's decisions and values, with the deliberate differences of the package doc.
func TestConformancePodDevices(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		dir, version := folder.Dir, vectors.Pick(folder, VersionMaster, VersionV290)
		var f podDevicesFile
		if !folder.Read(t, "poddevices.json", &f) {
			continue
		}
		base := filepath.Base(dir)
		n := 0
		for _, v := range f.Vectors {
			n++
			switch v.Function {
			case "EncodePodSingleDevice":
				var in [][]vectorContainerDevice
				var want string
				decodeRaw(t, v.Input, &in)
				decodeRaw(t, v.WantOutput, &want)
				if got := EncodePodDevices(podDevices(in)); got != want {
					t.Errorf("%s %s: Encode = %q, want %q", base, v.Name, got, want)
				}
			case "EncodePodDevices":
				var in struct {
					Checklist  map[string]string                    `json:"checklist"`
					PodDevices map[string][][]vectorContainerDevice `json:"pod_devices"`
				}
				var want map[string]string
				decodeRaw(t, v.Input, &in)
				decodeRaw(t, v.WantOutput, &want)
				for vendor, devs := range in.PodDevices {
					if got := EncodePodDevices(podDevices(devs)); got != want[in.Checklist[vendor]] {
						t.Errorf("%s %s: %s = %q, want %q", base, v.Name, vendor, got, want[in.Checklist[vendor]])
					}
				}
			case "DecodePodDevices":
				checkDecodeVector(t, base, v.Name, version, v.Input, v.WantOutput, v.WantError, v.Reencoded)
			default:
				t.Errorf("%s %s: unknown function %s", base, v.Name, v.Function)
			}
		}
		t.Logf("checked %d vectors from %s (poddevices.json, %v)", n, dir, version)
	}
}

func checkDecodeVector(t *testing.T, base, name string, version Version, input, output json.RawMessage, wantErr, reencoded *string) {
	t.Helper()
	var in struct {
		Annotations map[string]string `json:"annotations"`
		Checklist   map[string]string `json:"checklist"`
	}
	var want map[string][][]vectorContainerDevice
	decodeRaw(t, input, &in)
	decodeRaw(t, output, &want)
	for vendor, key := range in.Checklist {
		value, present := in.Annotations[key]
		got, err := DecodePodDevices(value, version)
		switch {
		case !present:
			if _, ok := want[vendor]; ok {
				t.Errorf("%s %s: HAMi decodes absent %s", base, name, key)
			}
		case wantErr != nil:
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("%s %s: Decode = %v, %v; HAMi fails with %q", base, name, got, err, *wantErr)
			}
		case want[vendor] == nil:
			// HAMi v2.9.0 swallows a device with missing fields and returns no devices at all;
			// this package says so (a deliberate difference; every caller ends with no devices).
			if version != VersionV290 || !errors.Is(err, ErrMalformed) {
				t.Errorf("%s %s: Decode = %v, %v; HAMi returns nothing without an error", base, name, got, err)
			}
		case err != nil:
			t.Errorf("%s %s: Decode: %v", base, name, err)
		default:
			// HAMi turns the empty piece after the last ';' into an entry; this package does
			// not, so that a decoded value encodes back to itself.
			hami := podDevices(want[vendor])
			phantom := value == "" || strings.HasSuffix(value, ";")
			if phantom {
				hami = hami[:len(hami)-1]
			}
			if diff := cmp.Diff(hami, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("%s %s: Decode (-HAMi without its trailing entry +got):\n%s", base, name, diff)
			}
			if reencoded != nil {
				enc := EncodePodDevices(got)
				if phantom {
					enc += ";"
				}
				if enc != *reencoded {
					t.Errorf("%s %s: re-encoded %q, HAMi %q (one ';' more)", base, name, EncodePodDevices(got), *reencoded)
				}
			}
		}
	}
}

type vectorPod struct {
	Name           string            `json:"name"`
	Namespace      string            `json:"namespace"`
	Annotations    map[string]string `json:"annotations"`
	Phase          corev1.PodPhase   `json:"phase"`
	Containers     []vectorContainer `json:"containers"`
	InitContainers []vectorContainer `json:"init_containers"`
}

type vectorContainer struct {
	Name     string            `json:"name"`
	Limits   map[string]string `json:"limits"`
	Requests map[string]string `json:"requests"`
}

func (c vectorContainer) container(t *testing.T) corev1.Container {
	t.Helper()
	list := func(m map[string]string) corev1.ResourceList {
		if m == nil {
			return nil
		}
		out := corev1.ResourceList{}
		for k, v := range m {
			q, err := resource.ParseQuantity(v)
			if err != nil {
				t.Fatalf("quantity %s=%s: %v", k, v, err)
			}
			out[corev1.ResourceName(k)] = q
		}
		return out
	}
	return corev1.Container{Name: c.Name, Resources: corev1.ResourceRequirements{Limits: list(c.Limits), Requests: list(c.Requests)}}
}

func (p vectorPod) pod(t *testing.T) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, Annotations: p.Annotations}, Status: corev1.PodStatus{Phase: p.Phase}}
	for _, c := range p.InitContainers {
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, c.container(t))
	}
	for _, c := range p.Containers {
		pod.Spec.Containers = append(pod.Spec.Containers, c.container(t))
	}
	return pod
}

type vectorNodeDevice struct {
	ID      string `json:"id"`
	Index   uint   `json:"index"`
	Count   int32  `json:"count"`
	Devmem  int32  `json:"devmem"`
	Devcore int32  `json:"devcore"`
	Type    string `json:"type"`
	Numa    int    `json:"numa"`
	Mode    string `json:"mode"`
	Health  bool   `json:"health"`
}

type fitFile struct {
	Vectors []struct {
		Name  string `json:"name"`
		Input struct {
			Config struct {
				GPUPolicy     Policy `json:"gpu_scheduler_policy"`
				NodePolicy    Policy `json:"node_scheduler_policy"`
				DefaultMemory int32  `json:"default_memory"`
				DefaultCores  int32  `json:"default_cores"`
			} `json:"config"`
			Nodes []struct {
				Name        string             `json:"name"`
				Annotations map[string]string  `json:"annotations"`
				Devices     []vectorNodeDevice `json:"devices"`
			} `json:"nodes"`
			ExistingPods []vectorPod `json:"existing_pods"`
			Pod          vectorPod   `json:"pod"`
			NodeNames    []string    `json:"node_names"`
		} `json:"input"`
		WantRequests []map[string]struct {
			Nums             int32  `json:"nums"`
			Type             string `json:"type"`
			Memreq           int32  `json:"memreq"`
			MemPercentagereq int32  `json:"mempercentagereq"`
			Coresreq         int32  `json:"coresreq"`
		} `json:"want_requests"`
		WantFitReason   map[string]string `json:"want_fit_reason"`
		WantNodeNames   []string          `json:"want_node_names"`
		WantFailedNodes map[string]string `json:"want_failed_nodes"`
		WantError       *string           `json:"want_error"`
		WantPatches     []struct {
			Body struct {
				Metadata struct {
					Annotations map[string]string `json:"annotations"`
				} `json:"metadata"`
			} `json:"body"`
		} `json:"want_patches"`
	} `json:"vectors"`
}

// TestConformanceFit replays fit.json: the requests read from the pod, usage from the existing
// pods, and the chosen node, devices and reasons of HAMi's Filter.
func TestConformanceFit(t *testing.T) {
	t.Parallel()
	nv := annotation.NVIDIA()
	for _, folder := range vectors.Folders(t) {
		dir, version := folder.Dir, vectors.Pick(folder, VersionMaster, VersionV290)
		var f fitFile
		if !folder.Read(t, "fit.json", &f) {
			continue
		}
		base := filepath.Base(dir)
		n := 0
		for _, v := range f.Vectors {
			n++
			in := v.Input
			cfg := Config{GPUSchedulerPolicy: in.Config.GPUPolicy, NodeSchedulerPolicy: in.Config.NodePolicy,
				DefaultMemory: in.Config.DefaultMemory, DefaultCores: in.Config.DefaultCores, Version: version}
			pod := in.Pod.pod(t)

			// The requests, container by container.
			req := Requests(pod, cfg)
			var want []Request
			for _, w := range v.WantRequests {
				r, ok := w[annotation.VendorNVIDIA]
				if !ok {
					want = append(want, Request{})
					continue
				}
				want = append(want, Request{Count: r.Nums, Type: r.Type, Memory: r.Memreq, MemoryPercentage: r.MemPercentagereq, Cores: r.Coresreq})
			}
			if diff := cmp.Diff(want, req.Containers, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("%s %s: requests (-HAMi +got):\n%s", base, v.Name, diff)
			}
			if !req.Any() {
				if len(v.WantPatches) != 0 || !slices.Equal(v.WantNodeNames, in.NodeNames) {
					t.Errorf("%s %s: a pod without a request, but HAMi chose %v", base, v.Name, v.WantNodeNames)
				}
				continue
			}

			// Usage from the pods already placed.
			used := map[string]map[string]Usage{}
			for _, ep := range in.ExistingPods {
				p := ep.pod(t)
				node, ok := PodNode(p)
				if !ok {
					continue
				}
				pd, ok, err := Allocated(p, nv, version)
				if err != nil || !ok {
					t.Fatalf("%s %s: existing pod %s: %v, %v", base, v.Name, ep.Name, ok, err)
				}
				if used[node] == nil {
					used[node] = map[string]Usage{}
				}
				for gpu, u := range pd.Usage() {
					used[node][gpu] = used[node][gpu].Add(u)
				}
			}
			registered := map[string]bool{}
			var nodes []Node
			for _, nd := range in.Nodes {
				registered[nd.Name] = true
				if !slices.Contains(in.NodeNames, nd.Name) {
					continue
				}
				devs := make([]annotation.Device, len(nd.Devices))
				for i, d := range nd.Devices {
					devs[i] = annotation.Device{ID: d.ID, Index: d.Index, Count: d.Count, Devmem: d.Devmem, Devcore: d.Devcore,
						Type: d.Type, Numa: d.Numa, Mode: d.Mode, Health: d.Health}
				}
				nodes = append(nodes, Node{Name: nd.Name, Devices: WithUsage(devs, used[nd.Name]), Annotations: nd.Annotations})
			}

			d := Schedule(nodes, req, pod.Annotations, cfg)
			wantNode := ""
			if len(v.WantNodeNames) == 1 {
				wantNode = v.WantNodeNames[0]
			}
			if d.Node != wantNode {
				t.Errorf("%s %s: chose %q, HAMi %q (failed %v)", base, v.Name, d.Node, wantNode, d.Failed)
			}
			if diff := cmp.Diff(v.WantFitReason, d.Failed, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("%s %s: fit reasons (-HAMi +got):\n%s", base, v.Name, diff)
			}
			if wantNode == "" {
				for node, reason := range v.WantFailedNodes {
					if registered[node] && version == VersionMaster && reason != d.Failed[node] {
						t.Errorf("%s %s: %s failed with %q, HAMi %q", base, v.Name, node, d.Failed[node], reason)
					}
				}
				continue
			}
			if len(v.WantPatches) != 1 {
				t.Fatalf("%s %s: %d patches", base, v.Name, len(v.WantPatches))
			}
			annos := v.WantPatches[0].Body.Metadata.Annotations
			got := EncodePodDevices(d.Devices)
			// Deliberate difference, by rule: every container keeps its entry (empty for a
			// container without a GPU), where HAMi master drops some and its device plugin then
			// hands a container another's devices. HAMi's list is compared after that rule.
			gpu := make([]bool, len(req.Containers))
			for i, c := range req.Containers {
				gpu[i] = c.Count > 0
			}
			hami, ok := vectors.OneEntryPerContainer(annos[nv.ToAllocateKey], gpu)
			if !ok {
				t.Errorf("%s %s: HAMi's list %q has not one entry per GPU container %v", base, v.Name, annos[nv.ToAllocateKey], gpu)
			}
			if got != hami || annos[nv.AllocatedKey] != annos[nv.ToAllocateKey] {
				t.Errorf("%s %s: devices %q, HAMi writes %q and %q (%q by the one-entry-per-container rule)", base, v.Name, got, annos[nv.ToAllocateKey], annos[nv.AllocatedKey], hami)
			}
			if len(d.Devices) != len(req.Containers) {
				t.Errorf("%s %s: %d entries for %d containers, want one per container", base, v.Name, len(d.Devices), len(req.Containers))
			}
			for i, e := range d.Devices {
				if (len(e) > 0) != gpu[i] {
					t.Errorf("%s %s: container %d asks for GPUs %v, has entry %v", base, v.Name, i, gpu[i], e)
				}
			}
		}
		t.Logf("checked %d vectors from %s (fit.json, %v)", n, dir, version)
	}
}

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
		dir, version := folder.Dir, vectors.Pick(folder, VersionMaster, VersionV290)
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
			pd, err := DecodePodDevices(p.Annotations[annotation.KeyNVIDIAToAllocate], version)
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
				var wantMounts []Mount
				for _, m := range w.Mounts {
					wantMounts = append(wantMounts, Mount{ContainerPath: placeholders.Replace(m.ContainerPath), HostPath: placeholders.Replace(m.HostPath), ReadOnly: m.ReadOnly})
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
		dir, version := folder.Dir, vectors.Pick(folder, VersionMaster, VersionV290)
		var f migAllocateFile
		if !folder.Read(t, "mig-allocate.json", &f) {
			continue
		}
		base := filepath.Base(dir)
		exact, shape, other := 0, 0, 0
		for _, v := range f.Vectors {
			in := v.Input
			if in.Config.OperatingMode != ModeMIG {
				t.Fatalf("%s %s: operating mode %q", base, v.Name, in.Config.OperatingMode)
			}
			var gpus []annotation.Device
			for _, d := range in.NVML.Devices {
				gpus = append(gpus, annotation.Device{ID: d.UUID, Index: d.Index, Count: 10, Mode: ModeMIG})
			}
			// The pod HAMi's plugin serves: the one the lock names, else the first listed.
			lock := in.NodeLockBefore
			entries := map[string]PodDevices{}
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
					if pd, err = DecodePodDevices(p.Annotations[annotation.KeyNVIDIAToAllocate], version); err != nil {
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
				if reserved || slices.ContainsFunc(entry, func(d ContainerDevice) bool { return d.UUID != d.GPU() }) {
					shape++ // a MIG instance named: HAMi lists its UUID (the MIG issue)
					continue
				}
				exact++
				var wantMounts []Mount
				for _, m := range w.Mounts {
					wantMounts = append(wantMounts, Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath})
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
