package extender

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/internal/vectors"
	"github.com/hamireg/hamireg/schedcache"
)

type topologyInput struct {
	Config       vectorConfig `json:"config"`
	Quotas       []quotaSpec  `json:"quotas"`
	Nodes        []vectorNode `json:"nodes"`
	ExistingPods []vectorPod  `json:"existing_pods"`
	Pod          vectorPod    `json:"pod"`
	NodeNames    []string     `json:"node_names"`
}

type topologyVector struct {
	Name            string            `json:"name"`
	Input           topologyInput     `json:"input"`
	WantFitReason   map[string]string `json:"want_fit_reason"`
	WantNodeNames   []string          `json:"want_node_names"`
	WantFailedNodes map[string]string `json:"want_failed_nodes"`
	WantPatches     []vectorPatch     `json:"want_patches"`
}

type topologyFile struct {
	Vectors []topologyVector `json:"vectors"`
}

// topologyRun is what one Filter of a topology vector's pod gave.
type topologyRun struct {
	nodeNames []string
	failed    map[string]string
	patches   []map[string]map[string]map[string]string
	regs      map[string]schedcache.Registration
}

// runTopology filters in.Pod through a real Extender on in's nodes and pods.
func runTopology(t *testing.T, in topologyInput, version allocation.Version) topologyRun {
	t.Helper()
	var out topologyRun
	synctest.Test(t, func(t *testing.T) {
		objs := nodeObjects(in.Nodes)
		for _, p := range in.ExistingPods {
			objs = append(objs, p.pod(t))
		}
		pod := in.Pod.pod(t)
		objs = append(objs, pod)
		cfg := in.Config.config(version)
		for _, q := range in.Quotas {
			objs = append(objs, q.object())
		}
		e := setupWithNodes(t, Options{Config: cfg}, objs...)
		e.run()
		e.client.ClearActions()
		res := e.filter(pod, in.NodeNames...)
		if res.Error != "" {
			t.Fatalf("Error = %s", res.Error)
		}
		if res.NodeNames != nil {
			out.nodeNames = *res.NodeNames
		}
		out.failed = res.FailedNodes
		for _, a := range e.client.Actions() {
			if p, ok := a.(k8stesting.PatchAction); ok {
				var m map[string]map[string]map[string]string
				if err := json.Unmarshal(p.GetPatch(), &m); err != nil {
					t.Fatal(err)
				}
				out.patches = append(out.patches, m)
			}
		}
		out.regs = map[string]schedcache.Registration{}
		snap := e.cache.Snapshot()
		for _, n := range in.Nodes {
			if info, ok := snap.Node(n.Name); ok {
				out.regs[n.Name] = info.Registrations[0]
			}
		}
	})
	return out
}

// TestConformanceTopology replays topology.json's scheduler vectors through Filter, both
// versions: the chosen node, the pod's merge patch (HAMi's device lists after
// vectors.OneEntryPerContainer) and every failed candidate's reason. Two deliberate
// differences are compared by their rule, and the rule is asserted:
//
//   - A score annotation that does not decode: HAMi drops the node (and names it "node
//     unregistered" only when no node fits; with another node chosen it names no reason, so
//     HAMi's reason is not compared); the SDK keeps it registered without scores, so the
//     answer is the SDK's own answer for the same input without that annotation, the
//     registration is registered and carries the ErrMalformed and no scores, and no reason
//     the SDK gives for that node says "node unregistered".
//   - HAMi v2.9.0 writes an empty entry for a GPU container when no combination scores above
//     0; the SDK takes the first best combination in walk order, which without scores is the
//     first GPUs of the walk: the answer is the SDK's own answer under the spread policy, and
//     the entry holds as many GPUs as the container asks for.
func TestConformanceTopology(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		checked := 0
		var f topologyFile
		if !folder.Read(t, "topology.json", &f) {
			continue
		}
		version := vectors.Pick(folder, allocation.VersionMaster, allocation.VersionV290)
		for _, v := range f.Vectors {
			checked++
			t.Run(folder.Name()+"/"+v.Name, func(t *testing.T) {
				t.Parallel()
				checkTopologyVector(t, v, version)
			})
		}
		t.Logf("checked %d vectors from %s (topology.json)", checked, folder.Dir)
	}
}

// checkTopologyVector filters v's pod and checks the answer against HAMi's or the rule's (see
// TestConformanceTopology).
func checkTopologyVector(t *testing.T, v topologyVector, version allocation.Version) {
	t.Helper()
	in := v.Input
	got := runTopology(t, in, version)

	wantNodes, wantFailed, wantReason := v.WantNodeNames, v.WantFailedNodes, v.WantFitReason
	var want []patchBody
	for _, p := range v.WantPatches {
		want = append(want, p.hami(t))
	}

	// Rule 1: a malformed score annotation costs the node its scores only.
	var malformed []string
	stripped := in
	stripped.Nodes = slices.Clone(in.Nodes)
	for i, n := range in.Nodes {
		raw, ok := n.Annotations[annotation.KeyNVIDIAScore]
		if _, err := annotation.DecodePairScores(raw); !ok || err == nil {
			continue
		}
		// HAMi's answer for this node is not compared: it drops the node, and names
		// it "node unregistered" only when no node fits (with another node chosen it
		// names no reason). The SDK's rule is asserted instead.
		malformed = append(malformed, n.Name)
		if r := got.regs[n.Name]; r.State != schedcache.StateRegistered || !errors.Is(r.ScoreErr, annotation.ErrMalformed) || r.PairScores != nil {
			t.Errorf("%s: registration %s, ScoreErr %v, scores %v; want registered, ErrMalformed, none", n.Name, r.State, r.ScoreErr, r.PairScores)
		}
		stripped.Nodes[i].Annotations = maps.Clone(n.Annotations)
		delete(stripped.Nodes[i].Annotations, annotation.KeyNVIDIAScore)
	}
	if len(malformed) > 0 {
		ruled := runTopology(t, stripped, version)
		wantNodes, wantFailed, wantReason, want = ruled.nodeNames, ruled.failed, ruled.failed, ruled.patches
		for _, node := range malformed {
			if reason, ok := got.failed[node]; ok && strings.HasPrefix(reason, ReasonNodeUnregistered) {
				t.Errorf("%s: %q; a node with a malformed score annotation stays registered", node, reason)
			}
		}
	}

	// Rule 2 (v2.9.0): no empty entry for a GPU container.
	pod := in.Pod.pod(t)
	cfg := allocation.Config{Version: version, DefaultMemory: in.Config.DefaultMemory, DefaultCores: in.Config.DefaultCores}
	gpu := gpuContainers(pod, cfg)
	req := allocation.Requests(pod, cfg)
	emptied := false
	for _, m := range want {
		hami, ok := m["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"]
		if !ok {
			continue
		}
		pd, err := allocation.DecodePodDevices(hami, allocation.VersionV290)
		for i, c := range req.Containers {
			if err == nil && c.Count > 0 && (i >= len(pd) || len(pd[i]) == 0) {
				emptied = true
			}
		}
	}
	if emptied {
		if version != allocation.VersionV290 {
			t.Fatal("HAMi master wrote an empty entry for a GPU container")
		}
		spread := in
		spread.Config.GPUPolicy = allocation.PolicySpread
		if in.Pod.Annotations[allocation.KeyGPUSchedulerPolicy] != "" {
			spread.Pod.Annotations = maps.Clone(in.Pod.Annotations)
			spread.Pod.Annotations[allocation.KeyGPUSchedulerPolicy] = string(allocation.PolicySpread)
		}
		ruled := runTopology(t, spread, version)
		wantNodes, want = ruled.nodeNames, ruled.patches
		for _, m := range want {
			pd, err := allocation.DecodePodDevices(m["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"], allocation.VersionMaster)
			if err != nil {
				t.Fatal(err)
			}
			for i, c := range req.Containers {
				if len(pd[i]) != int(c.Count) {
					t.Errorf("container %d: %d GPUs by the rule, asks for %d", i, len(pd[i]), c.Count)
				}
			}
		}
	} else {
		for _, m := range want {
			for _, k := range []string{"hami.io/vgpu-devices-allocated", "hami.io/vgpu-devices-to-allocate"} {
				if hami, ok := m["metadata"]["annotations"][k]; ok {
					ruled, fits := vectors.OneEntryPerContainer(hami, gpu)
					if !fits {
						t.Errorf("%s: HAMi's list %q has not one entry per GPU container", k, hami)
					}
					m["metadata"]["annotations"][k] = ruled
				}
			}
		}
	}

	if !slices.Equal(got.nodeNames, wantNodes) {
		t.Fatalf("NodeNames = %v, want %v (failed %v)", got.nodeNames, wantNodes, got.failed)
	}
	if len(wantNodes) == 0 {
		if !slices.Equal(slices.Sorted(maps.Keys(got.failed)), slices.Sorted(maps.Keys(wantFailed))) {
			t.Fatalf("FailedNodes = %v, want %v", got.failed, wantFailed)
		}
		for node, hami := range wantFailed {
			ours := got.failed[node]
			switch {
			case hami == ReasonNodeUnregistered:
				if !strings.HasPrefix(ours, ReasonNodeUnregistered+": ") {
					t.Errorf("%s: %q, HAMi %q", node, ours, hami)
				}
			case ours != wantReason[node]:
				t.Errorf("%s: %q, want fit reason %q", node, ours, wantReason[node])
			}
		}
	}
	if diff := cmp.Diff(want, got.patches); diff != "" {
		t.Errorf("patches (-want +got):\n%s", diff)
	}
}

// TestConformanceTopologyMalformedScoreBesideChosen checks a vector of topology.json's shape
// that the published set lacks: node1's score annotation does not decode while node2 (no
// scores) fits. HAMi drops node1 and chooses node2, naming no reason for node1 (FailedNodes
// {}); the harness must assert the SDK's rule (node1 stays registered, unscored, and the
// answer is the SDK's own for the input without node1's annotation), not HAMi's reason.
func TestConformanceTopologyMalformedScoreBesideChosen(t *testing.T) {
	t.Parallel()
	gpu := func(node string, i, numa int) annotation.Device {
		return annotation.Device{ID: fmt.Sprintf("GPU-%s%07d-1111-2222-3333-444455556666", node, i), Index: uint(i), Count: 10, Devmem: 40960, Devcore: 100,
			Type: "NVIDIA A100-SXM4-40GB", Numa: numa, Mode: "hami-core", Health: true}
	}
	var node1, node2 []annotation.Device
	for i := range 4 {
		node1, node2 = append(node1, gpu("a", i, i/2)), append(node2, gpu("b", i, i/2))
	}
	v := topologyVector{
		Name: "malformed_score_beside_chosen_node",
		Input: topologyInput{
			Config: vectorConfig{GPUPolicy: allocation.PolicyTopologyAware, NodePolicy: allocation.PolicyBinpack, MemoryFactor: 1},
			Nodes: []vectorNode{{Name: "node1", Annotations: map[string]string{annotation.KeyNVIDIAScore: "{not json"}, Devices: node1},
				{Name: "node2", Devices: node2}},
			Pod: vectorPod{Name: "p", Namespace: "default", Containers: []vectorContainer{{Name: "c0",
				Limits: map[string]string{"nvidia.com/gpu": "2", "nvidia.com/gpucores": "10", "nvidia.com/gpumem": "1000"}}}},
			NodeNames: []string{"node1", "node2"},
		},
		// HAMi: node1 dropped without a reason, node2 chosen.
		WantFitReason: map[string]string{}, WantFailedNodes: map[string]string{}, WantNodeNames: []string{"node2"},
		WantPatches: []vectorPatch{{Body: json.RawMessage(`{"metadata":{"annotations":{"hami.io/vgpu-node":"node2"}}}`)}},
	}
	for _, version := range []allocation.Version{allocation.VersionMaster, allocation.VersionV290} {
		checkTopologyVector(t, v, version)
	}
}
