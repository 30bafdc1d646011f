package extender

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/internal/vectors"
	"github.com/hamireg/hamireg/mig"
)

type migFitFile struct {
	Vectors []struct {
		Name  string `json:"name"`
		Input struct {
			Config vectorConfig `json:"config"`
			Nodes  []struct {
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
		WantFitReason   map[string]string `json:"want_fit_reason"`
		WantNodeNames   []string          `json:"want_node_names"`
		WantFailedNodes map[string]string `json:"want_failed_nodes"`
		WantPatches     []vectorPatch     `json:"want_patches"`
	} `json:"vectors"`
}

// unknownPlacement reports whether p, an existing pod, holds a device on a MIG GPU of devs
// whose placement its reservation does not give (allocation's rule c).
func unknownPlacement(t *testing.T, p *corev1.Pod, devs []annotation.Device) bool {
	t.Helper()
	pd, ok, err := allocation.Allocated(p, annotation.NVIDIA(), allocation.VersionMaster)
	if err != nil || !ok {
		return false
	}
	allocs, err := mig.DecodeAllocations(p.Annotations[mig.KeyAllocations])
	if err == nil {
		pd, err = allocation.WithMIG(pd, allocs)
	}
	for _, c := range pd {
		for _, d := range c {
			for _, g := range devs {
				if g.ID == d.GPU() && g.Mode == allocation.ModeMIG && (err != nil || d.MIG.IsZero()) {
					return true
				}
			}
		}
	}
	return false
}

// TestConformanceMIGFilter replays mig-fit.json through Filter: master's vectors give the
// chosen node, the merge patch (device lists by the one-entry-per-container rule,
// hami.io/vgpu-mig-allocations with its containerIndex following its entry) and the
// reasons, after allocation's MIG rules, each asserted where it applies: a (HAMi's
// CardInsufficientCore on a MIG GPU is CardMigTopologyInfeasible), b and d (HAMi's
// CardNotHealth on a GPU registered healthy: the pod fits on a placement no other pod
// holds), c (a device of unknown placement occupies its MIG GPU: CardMigTopologyInfeasible,
// and the pod gets a MIGReservationInvalid Event). v2.9.0's vectors: no patch places a
// device on a MIG GPU, HAMi's refusals are the extender's, nothing panics.
func TestConformanceMIGFilter(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		var f migFitFile
		if !folder.Read(t, "mig-fit.json", &f) {
			continue
		}
		version := vectors.Pick(folder, allocation.VersionMaster, allocation.VersionV290)
		for _, v := range f.Vectors {
			t.Run(folder.Name()+"/"+v.Name, func(t *testing.T) {
				t.Parallel()
				synctest.Test(t, func(t *testing.T) {
					in := v.Input
					var nodes []vectorNode
					for _, n := range in.Nodes {
						nodes = append(nodes, vectorNode{Name: n.Name, Annotations: n.Annotations, Devices: n.Devices})
					}
					objs := nodeObjects(nodes)
					unknown := map[string]bool{} // nodes with a device of unknown placement
					for _, p := range in.ExistingPods {
						pod := p.pod(t)
						objs = append(objs, pod)
						for _, n := range in.Nodes {
							if n.Name == pod.Annotations[allocation.KeyNode] && unknownPlacement(t, pod, n.Devices) {
								unknown[n.Name] = true
							}
						}
					}
					pod := in.Pod.pod(t)
					var before []*corev1.Pod
					for _, fb := range in.FilteredBefore {
						before = append(before, fb.Pod.pod(t))
					}
					for _, p := range append([]*corev1.Pod{pod}, before...) {
						objs = append(objs, runtime.Object(p))
					}
					cfg := in.Config.config(version)
					rec := record.NewFakeRecorder(100)
					e := setupWithNodes(t, Options{Config: cfg, EventRecorder: rec}, objs...)
					e.run()
					held := map[string][]mig.Placement{} // GPU → placements of the pods filtered before
					for i, p := range before {
						e.client.ClearActions()
						if res := e.filter(p, in.FilteredBefore[i].NodeNames...); res.Error != "" {
							t.Fatalf("filter %s: %s", p.Name, res.Error)
						}
						for _, a := range reservationPatched(t, e) {
							held[a.GPUUUID] = append(held[a.GPUUUID], a.Placement)
						}
					}
					e.client.ClearActions()
					res := e.filter(pod, in.NodeNames...)
					if res.Error != "" {
						t.Fatalf("Error = %s", res.Error)
					}
					var got []string
					if res.NodeNames != nil {
						got = *res.NodeNames
					}
					failed := failedUnion(t, res)
					if version == allocation.VersionV290 {
						checkV290Filter(t, e, nodes, v.WantFitReason, failed)
						return
					}
					wantNodes := v.WantNodeNames
					for _, n := range in.Nodes {
						hami, ours := v.WantFitReason[n.Name], failed[n.Name]
						healthy := !slices.ContainsFunc(n.Devices, func(d annotation.Device) bool { return !d.Health })
						hasMIG := slices.ContainsFunc(n.Devices, func(d annotation.Device) bool { return d.Mode == allocation.ModeMIG })
						switch {
						case !slices.Contains(in.NodeNames, n.Name):
						case strings.Contains(hami, allocation.ReasonCardNotHealth) && healthy && unknown[n.Name]:
							// Rule c.
							if want := strings.ReplaceAll(hami, allocation.ReasonCardNotHealth, allocation.ReasonCardMigTopologyInfeasible); ours != want {
								t.Errorf("%s: %q, want %q by the unknown-placement rule (HAMi %q)", n.Name, ours, want, hami)
							}
							if evs := strings.Join(drain(rec), "\n"); !strings.Contains(evs, EventMIGReservationInvalid) {
								t.Errorf("no %s Event: %s", EventMIGReservationInvalid, evs)
							}
						case strings.Contains(hami, allocation.ReasonCardNotHealth) && healthy:
							// Rules b and d: the GPU stays healthy; the pod fits.
							if ours != "" || !slices.Contains(got, n.Name) {
								t.Errorf("%s: %q, want a fit on a free placement (HAMi %q)", n.Name, ours, hami)
							}
							wantNodes = []string{n.Name}
						case strings.Contains(hami, allocation.ReasonCardInsufficientCore) && hasMIG:
							// Rule a.
							if want := strings.ReplaceAll(hami, allocation.ReasonCardInsufficientCore, allocation.ReasonCardMigTopologyInfeasible); ours != want {
								t.Errorf("%s: %q, want %q by the core rule (HAMi %q)", n.Name, ours, want, hami)
							}
						case ours != hami:
							t.Errorf("%s: %q, HAMi %q", n.Name, ours, hami)
						}
					}
					if !slices.Equal(got, wantNodes) && (len(got) != 0 || len(wantNodes) != 0) {
						t.Fatalf("NodeNames = %v, want %v (HAMi %v, failed %v)", got, wantNodes, v.WantNodeNames, failed)
					}
					patched := reservationPatched(t, e)
					for _, a := range patched {
						for _, h := range held[a.GPUUUID] {
							if mig.Overlaps(a.Placement, h) {
								t.Errorf("%v overlaps %v, held by a pod filtered before", a.Placement, h)
							}
						}
					}
					if len(v.WantPatches) == 0 {
						return
					}
					patches := patchesOf(e)
					if len(patches) != len(v.WantPatches) {
						t.Fatalf("patches %q, HAMi %d", patches, len(v.WantPatches))
					}
					for i, want := range v.WantPatches {
						a := want.ruled(t, pod, cfg)
						if value, ok := a["metadata"]["annotations"][mig.KeyAllocations]; ok {
							a["metadata"]["annotations"][mig.KeyAllocations] = ruledReservation(t, value, want.hami(t)["metadata"]["annotations"]["hami.io/vgpu-devices-to-allocate"], gpuContainers(pod, cfg))
						}
						var b patchBody
						_ = json.Unmarshal([]byte(patches[i]), &b)
						if diff := cmp.Diff(a, b); diff != "" {
							t.Errorf("patch (-HAMi +got):\n%s", diff)
						}
					}
				})
			})
		}
		t.Logf("checked %d vectors from %s (mig-fit.json)", len(f.Vectors), folder.Dir)
	}
}

// ruledReservation is HAMi's reservation value after the one-entry-per-container rule: each
// containerIndex names the container its entry of HAMi's device list belongs to.
func ruledReservation(t *testing.T, value, devices string, gpu []bool) string {
	t.Helper()
	allocs, err := mig.DecodeAllocations(value)
	if err != nil {
		t.Fatalf("HAMi's reservation %q: %v", value, err)
	}
	for i := range allocs {
		ci, ok := vectors.ContainerOfEntry(devices, allocs[i].ContainerIndex, gpu)
		if !ok {
			t.Errorf("HAMi's reservation names entry %d of %q", allocs[i].ContainerIndex, devices)
		}
		allocs[i].ContainerIndex = ci
	}
	return mig.EncodeAllocations(allocs)
}

func patchesOf(e *env) []string {
	var out []string
	for _, a := range e.client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			out = append(out, string(p.GetPatch()))
		}
	}
	return out
}

// reservationPatched decodes the MIG reservations of the filter patches sent.
func reservationPatched(t *testing.T, e *env) []mig.Allocation {
	t.Helper()
	var out []mig.Allocation
	for _, p := range patchesOf(e) {
		var b patchBody
		if err := json.Unmarshal([]byte(p), &b); err != nil {
			t.Fatal(err)
		}
		allocs, err := mig.DecodeAllocations(b["metadata"]["annotations"][mig.KeyAllocations])
		if err != nil {
			t.Fatalf("patched reservation: %v", err)
		}
		out = append(out, allocs...)
	}
	return out
}

func drain(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case ev := <-rec.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// checkV290Filter asserts the v2.9.0 choice through the filter: no device on a MIG GPU, no
// reservation, and HAMi's refusals.
func checkV290Filter(t *testing.T, e *env, nodes []vectorNode, want, failed map[string]string) {
	t.Helper()
	mode := map[string]string{}
	for _, n := range nodes {
		for _, d := range n.Devices {
			mode[d.ID] = d.Mode
		}
	}
	for _, p := range patchesOf(e) {
		var b patchBody
		if err := json.Unmarshal([]byte(p), &b); err != nil {
			t.Fatal(err)
		}
		annos := b["metadata"]["annotations"]
		if _, ok := annos[mig.KeyAllocations]; ok {
			t.Errorf("a v2.9.0 filter wrote %s", mig.KeyAllocations)
		}
		pd, err := allocation.DecodePodDevices(annos["hami.io/vgpu-devices-allocated"], allocation.VersionV290)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range pd {
			for _, d := range c {
				if mode[d.GPU()] == allocation.ModeMIG {
					t.Errorf("placed on the v2.9.0 MIG GPU %s", d.UUID)
				}
			}
		}
	}
	for _, node := range slices.Sorted(maps.Keys(want)) {
		if hami := want[node]; hami != "" && failed[node] != hami {
			t.Errorf("%s: %q, HAMi %q", node, failed[node], hami)
		}
	}
}
