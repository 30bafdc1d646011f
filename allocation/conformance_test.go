package allocation

import (
	"encoding/json"
	"errors"
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
