package allocation

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/internal/vectors"
	"github.com/hamireg/hamireg/mig"
)

type migFitFile struct {
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
				Name        string              `json:"name"`
				Annotations map[string]string   `json:"annotations"`
				Devices     []annotation.Device `json:"decoded_devices"`
			} `json:"nodes"`
			ExistingPods   []vectorPod `json:"existing_pods"`
			FilteredBefore []struct {
				NodeNames []string  `json:"node_names"`
				Pod       vectorPod `json:"pod"`
			} `json:"filtered_before"`
			Pod       vectorPod `json:"pod"`
			NodeNames []string  `json:"node_names"`
		} `json:"input"`
		WantFitReason map[string]string `json:"want_fit_reason"`
		WantNodeNames []string          `json:"want_node_names"`
		WantPatches   []struct {
			Body struct {
				Metadata struct {
					Annotations map[string]string `json:"annotations"`
				} `json:"metadata"`
			} `json:"body"`
		} `json:"want_patches"`
	} `json:"vectors"`
}

// migNodeUsage is what the pods on one node hold, as the usage tracker reads it: per GPU
// the usage and the MIG placements of the devices whose reservation is known.
type migNodeUsage struct {
	used map[string]Usage
	mig  map[string][]mig.Placement
	// unknown are the GPUs holding a device whose reservation did not apply (rule c).
	unknown map[string]bool
}

func (u *migNodeUsage) add(pd PodDevices) {
	for gpu, x := range pd.Usage() {
		u.used[gpu] = u.used[gpu].Add(x)
	}
	for gpu, ps := range pd.MIGUsage() {
		u.mig[gpu] = append(u.mig[gpu], ps...)
	}
}

// TestConformanceMIGFit replays mig-fit.json. Master: HAMi's choice, devices and reservation
// (hami.io/vgpu-mig-allocations), after the package doc's rules, each asserted where it
// applies: one entry per container (the reservation's containerIndex follows its entry),
// cores (a: where HAMi refuses a MIG GPU with CardInsufficientCore the SDK refuses it too,
// with CardMigTopologyInfeasible, and no profile with the memory and cores has a free
// placement), no informer race and no unhealthy GPU from a reservation (b, c, d: where HAMi
// reports CardNotHealth for a GPU registered healthy, the GPU is healthy here; a device of
// unknown placement occupies the whole GPU, else the pod fits on a free placement).
// v2.9.0: its geometry fit is not implemented (a MIG GPU never fits,
// CardNotFoundCustomFilterRule); its pods' "[t-p]" entries decode and count on the
// physical GPU, out-of-range positions included.
func TestConformanceMIGFit(t *testing.T) {
	t.Parallel()
	nv := annotation.NVIDIA()
	for _, folder := range vectors.Folders(t) {
		version := vectors.Pick(folder, VersionMaster, VersionV290)
		var f migFitFile
		if !folder.Read(t, "mig-fit.json", &f) {
			continue
		}
		for _, v := range f.Vectors {
			in := v.Input
			cfg := Config{GPUSchedulerPolicy: in.Config.GPUPolicy, NodeSchedulerPolicy: in.Config.NodePolicy,
				DefaultMemory: in.Config.DefaultMemory, DefaultCores: in.Config.DefaultCores, Version: version}
			name := folder.Name() + " " + v.Name
			usage := map[string]*migNodeUsage{}
			nodeUsage := func(n string) *migNodeUsage {
				if usage[n] == nil {
					usage[n] = &migNodeUsage{used: map[string]Usage{}, mig: map[string][]mig.Placement{}, unknown: map[string]bool{}}
				}
				return usage[n]
			}
			for _, ep := range in.ExistingPods {
				p := ep.pod(t)
				node, ok := PodNode(p)
				if !ok {
					continue
				}
				pd, ok, err := Allocated(p, nv, version)
				if err != nil || !ok {
					t.Fatalf("%s: existing pod %s: %v, %v", name, ep.Name, ok, err)
				}
				u := nodeUsage(node)
				withSlots := pd
				if value, has := p.Annotations[mig.KeyAllocations]; has {
					allocs, err := mig.DecodeAllocations(value)
					if err == nil {
						withSlots, err = WithMIG(pd, allocs)
					}
					if err != nil {
						withSlots = pd
						if !errors.Is(err, mig.ErrMalformed) {
							t.Errorf("%s: %s: %v, not ErrMalformed", name, ep.Name, err)
						}
					}
				}
				for gpu, x := range pd.Usage() {
					if x.Used > int64(len(withSlots.MIGUsage()[gpu])) {
						u.unknown[gpu] = true
					}
				}
				u.add(withSlots)
			}
			nodesFor := func(names []string) []Node {
				var out []Node
				for _, nd := range in.Nodes {
					if !slices.Contains(names, nd.Name) {
						continue
					}
					u := nodeUsage(nd.Name)
					devs := SetMIGUsage(WithUsage(nd.Devices, u.used), u.mig)
					out = append(out, Node{Name: nd.Name, Devices: devs, Annotations: nd.Annotations})
				}
				return out
			}
			// Rule b: what the filter chose counts at once, with its placements.
			for _, fb := range in.FilteredBefore {
				p := fb.Pod.pod(t)
				d := Schedule(nodesFor(fb.NodeNames), Requests(p, cfg), p.Annotations, cfg)
				if d.Node != "" {
					nodeUsage(d.Node).add(d.Devices)
				}
			}
			pod := in.Pod.pod(t)
			req := Requests(pod, cfg)
			nodes := nodesFor(in.NodeNames)
			d := Schedule(nodes, req, pod.Annotations, cfg)
			gpu := make([]bool, len(req.Containers))
			for i, c := range req.Containers {
				gpu[i] = c.Count > 0
			}
			if version == VersionV290 {
				checkV290MIG(t, name, nodes, d, v.WantFitReason, v.WantNodeNames)
				continue
			}

			wantNode := ""
			if len(v.WantNodeNames) == 1 {
				wantNode = v.WantNodeNames[0]
			}
			for _, n := range nodes {
				hami, ours := v.WantFitReason[n.Name], d.Failed[n.Name]
				switch {
				case strings.Contains(hami, ReasonCardNotHealth) && allHealthy(n.Devices):
					// Rules b, c, d: HAMi marked a GPU unhealthy from the pods' usage.
					if strings.Contains(ours, ReasonCardNotHealth) {
						t.Errorf("%s: %s: %q, a reservation must not make a GPU unhealthy", name, n.Name, ours)
					}
					if unknownOn(n, usage[n.Name]) {
						if ours != strings.ReplaceAll(hami, ReasonCardNotHealth, ReasonCardMigTopologyInfeasible) {
							t.Errorf("%s: %s: %q, want the GPU of unknown placements fully occupied (HAMi %q)", name, n.Name, ours, hami)
						}
						continue
					}
					if ours != "" {
						t.Errorf("%s: %s: %q, want a fit on a free placement (HAMi %q)", name, n.Name, ours, hami)
					}
					checkFreePlacements(t, name, n, d)
					wantNode = d.Node
				case strings.Contains(hami, ReasonCardInsufficientCore) && hasMIG(n.Devices):
					// Rule a: the placement decides, not the rounded-up core sum.
					if want := strings.ReplaceAll(hami, ReasonCardInsufficientCore, ReasonCardMigTopologyInfeasible); ours != want {
						t.Errorf("%s: %s: %q, want %q by the core rule (HAMi %q)", name, n.Name, ours, want, hami)
					}
					checkNoProfileFree(t, name, n, req)
				case ours != hami:
					t.Errorf("%s: %s: fit reason %q, HAMi %q", name, n.Name, ours, hami)
				}
			}
			if d.Node != wantNode {
				t.Errorf("%s: chose %q, HAMi %q (failed %v)", name, d.Node, wantNode, d.Failed)
			}
			if d.Node == "" || len(v.WantPatches) == 0 {
				continue
			}
			annos := v.WantPatches[0].Body.Metadata.Annotations
			hami, ok := vectors.OneEntryPerContainer(annos[nv.ToAllocateKey], gpu)
			if !ok {
				t.Errorf("%s: HAMi's list %q has not one entry per GPU container", name, annos[nv.ToAllocateKey])
			}
			if got := EncodePodDevices(d.Devices); got != hami {
				t.Errorf("%s: devices %q, HAMi %q (%q by the one-entry-per-container rule)", name, got, annos[nv.ToAllocateKey], hami)
			}
			var want []mig.Allocation
			if value, ok := annos[mig.KeyAllocations]; ok {
				var err error
				if want, err = mig.DecodeAllocations(value); err != nil {
					t.Fatalf("%s: HAMi's reservation: %v", name, err)
				}
				for i := range want {
					// The one-entry-per-container rule moves the entry, and with it the index.
					ci, ok := vectors.ContainerOfEntry(annos[nv.ToAllocateKey], want[i].ContainerIndex, gpu)
					if !ok {
						t.Errorf("%s: HAMi's reservation names entry %d of %v", name, want[i].ContainerIndex, gpu)
					}
					want[i].ContainerIndex = ci
				}
			}
			if diff := cmp.Diff(want, MIGAllocations(d.Devices), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("%s: reservation (-HAMi +got):\n%s", name, diff)
			}
		}
		t.Logf("checked %d vectors from %s (mig-fit.json, %v)", len(f.Vectors), folder.Dir, version)
	}
}

func allHealthy(devs []DeviceUsage) bool {
	return !slices.ContainsFunc(devs, func(d DeviceUsage) bool { return !d.Health })
}

func hasMIG(devs []DeviceUsage) bool {
	return slices.ContainsFunc(devs, func(d DeviceUsage) bool { return d.Mode == ModeMIG })
}

// unknownOn reports whether a MIG GPU of n holds a device of unknown placement.
func unknownOn(n Node, u *migNodeUsage) bool {
	return u != nil && slices.ContainsFunc(n.Devices, func(d DeviceUsage) bool { return d.Mode == ModeMIG && u.unknown[d.ID] })
}

// checkFreePlacements asserts that the pod's MIG devices on n overlap nothing held there.
func checkFreePlacements(t *testing.T, name string, n Node, d Decision) {
	t.Helper()
	if d.Node != n.Name {
		return
	}
	for _, dev := range n.Devices {
		held := slices.Clone(dev.MIG)
		for _, a := range MIGAllocations(d.Devices) {
			if a.GPUUUID != dev.ID {
				continue
			}
			for _, h := range held {
				if mig.Overlaps(a.Placement, h) {
					t.Errorf("%s: %v overlaps %v held on %s", name, a.Placement, h, dev.ID)
				}
			}
			held = append(held, a.Placement)
		}
	}
}

// checkNoProfileFree asserts the core rule's refusal: on every MIG GPU of n, no profile with
// the request's memory and cores has a free placement.
func checkNoProfileFree(t *testing.T, name string, n Node, req PodRequest) {
	t.Helper()
	for _, r := range req.Containers {
		for _, dev := range n.Devices {
			if dev.Mode != ModeMIG || r.Count == 0 {
				continue
			}
			if p, at, ok := mig.Select(dev.MIGProfiles, dev.MIG, r.Memory, min(r.Cores, 100)); ok {
				t.Errorf("%s: %s refused, but %s at %v is free", name, dev.ID, p.Name, at)
			}
		}
	}
}

// checkV290MIG asserts the v2.9.0 choice: no device on a MIG GPU; where HAMi refuses, the
// same reason; where HAMi places on a MIG GPU and the SDK places nowhere, every MIG GPU
// counts CardNotFoundCustomFilterRule.
func checkV290MIG(t *testing.T, name string, nodes []Node, d Decision, want map[string]string, wantNodes []string) {
	t.Helper()
	for _, n := range nodes {
		mode := map[string]string{}
		migs := 0
		for _, dev := range n.Devices {
			mode[dev.ID] = dev.Mode
			if dev.Mode == ModeMIG {
				migs++
			}
		}
		if d.Node == n.Name {
			for _, c := range d.Devices {
				for _, dev := range c {
					if mode[dev.GPU()] == ModeMIG {
						t.Errorf("%s: placed on the v2.9.0 MIG GPU %s", name, dev.UUID)
					}
				}
			}
			continue
		}
		hami, ours := want[n.Name], d.Failed[n.Name]
		if hami != "" {
			if ours != hami {
				t.Errorf("%s: %s: %q, HAMi %q", name, n.Name, ours, hami)
			}
			continue
		}
		if !slices.Contains(wantNodes, n.Name) {
			continue
		}
		if part := fmt.Sprintf("%d/%d %s", migs, len(n.Devices), ReasonCardNotFoundCustomFilterRule); !strings.Contains(ours, part) {
			t.Errorf("%s: %s: %q, want %q (v2.9.0 MIG GPUs are not fitted)", name, n.Name, ours, part)
		}
	}
}

// migGPU is an idle A100-40GB in MIG mode as HAMi master publishes it.
func migGPU(id string) annotation.Device {
	ones := make([]mig.Placement, 7)
	for i := range ones {
		ones[i] = mig.Placement{Start: uint32(i), Size: 1}
	}
	return annotation.Device{ID: id, Count: 7, Devmem: 40960, Devcore: 100, Type: "NVIDIA A100-SXM4-40GB", Mode: ModeMIG, Health: true,
		MIGProfiles: []mig.Profile{
			{Name: "1g.5gb", MemoryMB: 4864, Core: 15, SliceCount: 1, Placements: ones},
			{Name: "2g.10gb", MemoryMB: 9856, Core: 29, SliceCount: 2, Placements: []mig.Placement{{Start: 0, Size: 2}, {Start: 2, Size: 2}, {Start: 4, Size: 2}}},
			{Name: "3g.20gb", MemoryMB: 19968, Core: 43, SliceCount: 3, Placements: []mig.Placement{{Start: 0, Size: 4}, {Start: 4, Size: 4}}},
			{Name: "7g.40gb", MemoryMB: 40192, Core: 100, SliceCount: 7, Placements: []mig.Placement{{Start: 0, Size: 8}}},
		}}
}

func migDev(gpu, profile string, start, size uint32, mem, cores int32) ContainerDevice {
	return ContainerDevice{UUID: gpu, Type: "NVIDIA", Usedmem: mem, Usedcores: cores, MIG: MIGSlot{Profile: profile, Placement: mig.Placement{Start: start, Size: size}}}
}

func TestMIGAllocations(t *testing.T) {
	t.Parallel()
	pd := PodDevices{{}, {migDev("GPU-a", "1g.5gb", 6, 1, 4864, 15), {UUID: "GPU-b", Type: "NVIDIA", Usedmem: 100}, migDev("GPU-a", "1g.5gb", 5, 1, 4864, 15)}}
	want := []mig.Allocation{
		{ContainerIndex: 1, DeviceIndex: 0, GPUUUID: "GPU-a", Profile: "1g.5gb", Placement: mig.Placement{Start: 6, Size: 1}},
		{ContainerIndex: 1, DeviceIndex: 2, GPUUUID: "GPU-a", Profile: "1g.5gb", Placement: mig.Placement{Start: 5, Size: 1}},
	}
	got := MIGAllocations(pd)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("MIGAllocations (-want +got):\n%s", diff)
	}
	if got := MIGAllocations(PodDevices{{{UUID: "GPU-b"}}}); got != nil {
		t.Errorf("no MIG device: %v, want nil", got)
	}
	// Decoded again, the device list has no slots; WithMIG gives them back.
	plain, err := DecodePodDevices(EncodePodDevices(pd), VersionMaster)
	if err != nil {
		t.Fatal(err)
	}
	back, err := WithMIG(plain, want)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(pd, back, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("WithMIG (-want +got):\n%s", diff)
	}
	if !plain[1][0].MIG.IsZero() {
		t.Error("WithMIG modified its argument")
	}
	if diff := cmp.Diff(map[string][]mig.Placement{"GPU-a": {{Start: 6, Size: 1}, {Start: 5, Size: 1}}}, back.MIGUsage()); diff != "" {
		t.Errorf("MIGUsage (-want +got):\n%s", diff)
	}
}

func TestWithMIGErrors(t *testing.T) {
	t.Parallel()
	pd := PodDevices{{{UUID: "GPU-a", Type: "NVIDIA"}}}
	tests := map[string]mig.Allocation{
		"no such container": {ContainerIndex: 1, GPUUUID: "GPU-a", Profile: "1g.5gb", Placement: mig.Placement{Size: 1}},
		"no such device":    {DeviceIndex: 1, GPUUUID: "GPU-a", Profile: "1g.5gb", Placement: mig.Placement{Size: 1}},
		"negative":          {ContainerIndex: -1, GPUUUID: "GPU-a", Profile: "1g.5gb", Placement: mig.Placement{Size: 1}},
		"another GPU":       {GPUUUID: "GPU-b", Profile: "1g.5gb", Placement: mig.Placement{Size: 1}},
	}
	for name, a := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := WithMIG(pd, []mig.Allocation{a})
			if !errors.Is(err, mig.ErrMalformed) {
				t.Errorf("err = %v, want ErrMalformed", err)
			}
			if len(got.MIGUsage()) != 0 {
				t.Errorf("slots after an error: %v", got)
			}
		})
	}
}

// TestFitMIGRules asserts the package doc's MIG rules on Fit directly.
func TestFitMIGRules(t *testing.T) {
	t.Parallel()
	gpu := migGPU("GPU-m")
	req := func(count, mem, pct, cores int32) PodRequest {
		return PodRequest{Containers: []Request{{Count: count, Type: "NVIDIA", Memory: mem, MemoryPercentage: pct, Cores: cores}}}
	}
	held := func(pd PodDevices) []DeviceUsage {
		return SetMIGUsage(WithUsage([]annotation.Device{gpu}, pd.Usage()), pd.MIGUsage())
	}
	threeTwoOne := PodDevices{{migDev("GPU-m", "2g.10gb", 0, 2, 9856, 29)}, {migDev("GPU-m", "2g.10gb", 2, 2, 9856, 29)},
		{migDev("GPU-m", "2g.10gb", 4, 2, 9856, 29)}, {migDev("GPU-m", "1g.5gb", 6, 1, 4864, 15)}}
	sixOnes := PodDevices{}
	for i := range 6 {
		sixOnes = append(sixOnes, ContainerDevices{migDev("GPU-m", "1g.5gb", uint32(i+1), 1, 4864, 15)})
	}
	unknown := PodDevices{{{UUID: "GPU-m", Type: "NVIDIA", Usedmem: 4864, Usedcores: 15}}} // no reservation
	tests := map[string]struct {
		devices    []DeviceUsage
		req        PodRequest
		wantReason string
		want       []mig.Allocation
	}{
		"a: cores sum 102, no slice free: the placement's reason": {devices: held(threeTwoOne), req: req(1, 4000, PercentageUnset, 0),
			wantReason: "1/1 " + ReasonCardMigTopologyInfeasible},
		"a: cores pick the profile":                {devices: held(nil), req: req(1, 4000, PercentageUnset, 20), want: []mig.Allocation{{GPUUUID: "GPU-m", Profile: "2g.10gb", Placement: mig.Placement{Start: 0, Size: 2}}}},
		"a: a free 1g but 20 cores asked":          {devices: held(sixOnes), req: req(1, 4000, PercentageUnset, 20), wantReason: "1/1 " + ReasonCardMigTopologyInfeasible},
		"a: the last 1g with 0 cores, sum 105":     {devices: held(sixOnes), req: req(1, 4000, PercentageUnset, 0), want: []mig.Allocation{{GPUUUID: "GPU-m", Profile: "1g.5gb", Placement: mig.Placement{Start: 0, Size: 1}}}},
		"memory is checked first":                  {devices: held(sixOnes), req: req(1, 12000, PercentageUnset, 0), wantReason: "1/1 " + ReasonCardInsufficientMemory},
		"c: a device of unknown placement":         {devices: held(unknown), req: req(1, 1000, PercentageUnset, 0), wantReason: "1/1 " + ReasonCardMigTopologyInfeasible},
		"c: no MIG usage given: unknown placement": {devices: WithUsage([]annotation.Device{gpu}, unknown.Usage()), req: req(1, 1000, PercentageUnset, 0), wantReason: "1/1 " + ReasonCardMigTopologyInfeasible},
		"e: a whole GPU":                           {devices: held(nil), req: req(1, 0, 100, 100), wantReason: "1/1 " + ReasonCardMigTopologyInfeasible},
		"three devices stack on one GPU": {devices: held(nil), req: req(3, 4000, PercentageUnset, 0), want: []mig.Allocation{
			{GPUUUID: "GPU-m", Profile: "1g.5gb", Placement: mig.Placement{Start: 6, Size: 1}},
			{DeviceIndex: 1, GPUUUID: "GPU-m", Profile: "1g.5gb", Placement: mig.Placement{Start: 5, Size: 1}},
			{DeviceIndex: 2, GPUUUID: "GPU-m", Profile: "1g.5gb", Placement: mig.Placement{Start: 4, Size: 1}}}},
		// HAMi master counts the devices collected (7) against the GPUs (1).
		"eight devices do not": {devices: held(nil), req: req(8, 4000, PercentageUnset, 0), wantReason: "1/1 " + ReasonCardMigTopologyInfeasible + ", 7/1 " + ReasonAllocatedCardsInsufficientRequest},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pd, reason, ok := Fit(tc.devices, tc.req, nil, nil, Config{})
			if reason != tc.wantReason || ok != (tc.wantReason == "") {
				t.Fatalf("Fit = %v, %q; want %q", ok, reason, tc.wantReason)
			}
			if diff := cmp.Diff(tc.want, MIGAllocations(pd), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("reservation (-want +got):\n%s", diff)
			}
		})
	}
}

// TestFitMIGHAMiCoreGPU: rule d. A reservation naming a hami-core GPU does not change how the
// GPU counts (its device entry counts as usual) and does not make it unhealthy.
func TestFitMIGHAMiCoreGPU(t *testing.T) {
	t.Parallel()
	a10 := annotation.Device{ID: "GPU-c", Count: 10, Devmem: 23028, Devcore: 100, Type: "NVIDIA A10", Mode: "hami-core", Health: true}
	pd := PodDevices{{migDev("GPU-c", "1g.5gb", 6, 1, 4864, 15)}}
	devs := SetMIGUsage(WithUsage([]annotation.Device{a10}, pd.Usage()), pd.MIGUsage())
	got, reason, ok := Fit(devs, PodRequest{Containers: []Request{{Count: 1, Type: "NVIDIA", Memory: 18000, MemoryPercentage: PercentageUnset}}}, nil, nil, Config{})
	if !ok || got[0][0].UUID != "GPU-c" || !got[0][0].MIG.IsZero() {
		t.Errorf("Fit = %v, %v, %q", got, ok, reason)
	}
	_, reason, ok = Fit(devs, PodRequest{Containers: []Request{{Count: 1, Type: "NVIDIA", Memory: 19000, MemoryPercentage: PercentageUnset}}}, nil, nil, Config{})
	if ok || reason != "1/1 "+ReasonCardInsufficientMemory {
		t.Errorf("the entry's memory counts: %v, %q", ok, reason)
	}
}

func TestProbeNodeMIG(t *testing.T) {
	t.Parallel()
	var n ProbeNode
	n.Set([]annotation.Device{{ID: "a", Mode: "hami-core"}}, nil)
	if n.MIG() {
		t.Error("a hami-core node has MIG")
	}
	n.Set([]annotation.Device{{ID: "a", Mode: "hami-core"}, migGPU("m")}, nil)
	if !n.MIG() {
		t.Error("a node with a MIG GPU has none")
	}
}
