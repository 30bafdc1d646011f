package extender

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
)

// simulate calls Filter with whole Nodes and fails the test on any API write or Event.
func (e *env) simulate(pod *corev1.Pod, nodes ...*corev1.Node) *extenderFilterResult {
	e.t.Helper()
	e.client.ClearActions()
	list := &corev1.NodeList{}
	for _, n := range nodes {
		list.Items = append(list.Items, *n)
	}
	res := e.ext.Filter(e.ctx, &extenderArgs{Pod: pod, Nodes: list})
	synctest.Wait()
	for _, a := range e.client.Actions() {
		if v := a.GetVerb(); v != "get" && v != "list" && v != "watch" {
			e.t.Errorf("a simulation wrote: %s %s", v, a.GetResource().Resource)
		}
	}
	if ev := e.events(); len(ev) != 0 {
		e.t.Errorf("a simulation recorded Events %q", ev)
	}
	return res
}

func names(res *extenderFilterResult) []string {
	if res.Nodes == nil {
		return nil
	}
	var out []string
	for _, n := range res.Nodes.Items {
		out = append(out, n.Name)
	}
	return out
}

// TestSimulationReasons: a request Node's register annotation decides its reason on its own:
// absent or listing no devices is HAMi's "node unregistered", present but not decodable (bad
// JSON, a null element) is ReasonRegisterUnparsable with the decoding error; a score
// annotation that does not decode costs the node nothing; the live node cache is not read.
func TestSimulationReasons(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		pod := gpuPod("p", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"})
		// The live "bad" node is registered; its template is not: the request decides.
		e := start(t, Options{}, registered("bad", 1, 23028), pod)
		scored := registered("scored", 1, 23028)
		scored.Annotations[annotation.KeyNVIDIAScore] = "{not json"
		res := e.simulate(pod,
			gpuNode("absent", "", 1), gpuNode("empty", "[]", 1), gpuNode("bad", "[{", 1), gpuNode("null", "[null]", 1),
			registered("ok", 1, 23028), scored)
		if got := names(res); !slices.Equal(got, []string{"ok", "scored"}) {
			t.Errorf("Nodes %q, want ok and scored", got)
		}
		for node, prefix := range map[string]string{
			"absent": ReasonNodeUnregistered + ": ", "empty": ReasonNodeUnregistered + ": ",
			"bad": ReasonRegisterUnparsable + ": ", "null": ReasonRegisterUnparsable + ": ",
		} {
			if r := res.FailedNodes[node]; !strings.HasPrefix(r, prefix) {
				t.Errorf("%s: %q, want it to start with %q", node, r, prefix)
			}
		}
		if r := res.FailedNodes["bad"]; !strings.Contains(r, annotation.ErrMalformed.Error()) {
			t.Errorf("bad: %q does not give the decoding error", r)
		}
		if len(res.FailedNodes) != 4 || res.NodeNames != nil || res.FailedAndUnresolvableNodes != nil {
			t.Errorf("result %+v", res)
		}
	})
}

// TestSimulationLiveUsage: a request Node that is a registered live node (same name and UID)
// is simulated empty by default (HAMi v2.10.0) and with what the live pods hold under
// Options.SimulationLiveUsage; the same name with another UID is not that node. The pod's own
// reservation does not count against it, and a simulation leaves the reservation as it was.
func TestSimulationLiveUsage(t *testing.T) {
	t.Parallel()
	for _, live := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			node := registered("node1", 1, 23028)
			busy := placedPod("busy", "node1", "GPU-node1-0,NVIDIA,20000,50:;")
			pod := gpuPod("p", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "5000"})
			e := start(t, Options{SimulationLiveUsage: live}, node, busy, pod)
			other := node.DeepCopy()
			other.UID = types.UID("uid-a-new-node1")
			res := e.simulate(pod, node, other)
			_, fails := res.FailedNodes["node1"]
			switch {
			case !live && (fails || !slices.Equal(names(res), []string{"node1"})):
				t.Errorf("default: %+v, want node1 simulated empty", res)
			case live && (!fails || !strings.HasPrefix(res.FailedNodes["node1"], "1/1 CardInsufficientMemory")):
				t.Errorf("live usage: %+v, want node1 failed with CardInsufficientMemory", res)
			}
			// The other UID comes second under the same name: one answer per name, the first.
			if len(res.FailedNodes)+len(names(res)) != 1 {
				t.Errorf("two Nodes of one name answered %d times: %+v", len(res.FailedNodes)+len(names(res)), res)
			}
			res = e.simulate(pod, other)
			if !slices.Equal(names(res), []string{"node1"}) {
				t.Errorf("a new node of the same name: %+v, want it simulated empty", res)
			}

			// A pod that holds a reservation on node1 (the busy pod's): re-simulated, it does
			// not count against itself, and its reservation stays.
			before, _ := e.ext.usage.Pod("default/busy")
			busyAsk := gpuPod("busy", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"})
			res = e.simulate(busyAsk, node)
			if !slices.Equal(names(res), []string{"node1"}) {
				t.Errorf("the reserved pod simulated on its own node: %+v, want it fits (it does not count against itself)", res)
			}
			if after, _ := e.ext.usage.Pod("default/busy"); after.Node != before.Node || after.GPUs["GPU-node1-0"] != before.GPUs["GPU-node1-0"] {
				t.Errorf("the reservation changed: %+v → %+v", before, after)
			}
		})
	}
}

// TestSimulationQuota: the namespace's live quota applies to a simulated node, and the reason
// names the quota as the live filter does.
func TestSimulationQuota(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := quotaSpec{Name: "gpu", Namespace: "default", Hard: map[string]string{"limits.nvidia.com/gpumem": "10000"}}.object()
		busy := placedPod("busy", "node1", "GPU-node1-0,NVIDIA,8000,0:;")
		pod := gpuPod("p", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"})
		e := start(t, Options{}, registered("node1", 1, 23028), busy, q, pod)
		res := e.simulate(pod, registered("tmpl", 2, 23028))
		r := res.FailedNodes["tmpl"]
		if !strings.HasPrefix(r, "2/2 "+allocation.ReasonResourceQuotaNotFit+"; ") || !strings.Contains(r, "ResourceQuota gpu") || !strings.Contains(r, "default/busy") {
			t.Errorf("tmpl: %q, want HAMi's reason and the quota, its usage and its pods", r)
		}
	})
}

// TestSimulationOrder: every fitting request Node is answered, best first by the node policy
// (binpack: the busiest; spread: the idlest), ties by name; with live usage the live pods make
// the difference.
func TestSimulationOrder(t *testing.T) {
	t.Parallel()
	for policy, want := range map[allocation.Policy][]string{
		allocation.PolicyBinpack: {"a", "b", "c"},
		allocation.PolicySpread:  {"b", "c", "a"},
	} {
		synctest.Test(t, func(t *testing.T) {
			a, b, c := registered("a", 1, 23028), registered("b", 1, 23028), registered("c", 1, 23028)
			busy := placedPod("busy", "a", "GPU-a-0,NVIDIA,10000,10:;")
			pod := gpuPod("p", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"})
			e := start(t, Options{SimulationLiveUsage: true, Config: allocation.Config{NodeSchedulerPolicy: policy}}, a, b, c, busy, pod)
			// b and c tie (both empty) and go by name; a holds the busy pod.
			if got := names(e.simulate(pod, c, b, a)); !slices.Equal(got, want) {
				t.Errorf("%s: %q, want %q", policy, got, want)
			}
		})
	}
}

// TestSimulationNeverPanics: absent NodeNames, a nil or empty item list, unnamed and nameless
// Nodes, a Node without annotations: an answer, FailedNodes never nil, nothing written.
func TestSimulationNeverPanics(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		pod := gpuPod("p", map[string]string{"nvidia.com/gpu": "1"})
		e := start(t, Options{}, registered("n", 1, 23028), pod)
		for name, nodes := range map[string]*corev1.NodeList{
			"nil items": {}, "empty items": {Items: []corev1.Node{}},
			"nameless": {Items: []corev1.Node{{}, {}}},
		} {
			e.client.ClearActions()
			res := e.ext.Filter(e.ctx, &extenderArgs{Pod: pod, Nodes: nodes})
			if res.Error != "" || res.FailedNodes == nil || res.Nodes != nil || res.NodeNames != nil {
				t.Errorf("%s: %+v", name, res)
			}
			if len(e.client.Actions()) != 0 {
				t.Errorf("%s: actions %v", name, e.client.Actions())
			}
		}
		// No Nodes and no NodeNames: the live path with no candidate.
		if res := e.ext.Filter(e.ctx, &extenderArgs{Pod: pod}); res.Error != "" || res.NodeNames != nil || res.Nodes != nil {
			t.Errorf("no candidates: %+v", res)
		}
		e.events()
	})
}

// FuzzSimulationNode: any register and score annotation on a request Node gets an answer: the
// Node either fits or has a reason, never both, never a panic, never a write, and the reason
// is ReasonRegisterUnparsable exactly when the annotation is present and does not decode.
func FuzzSimulationNode(f *testing.F) {
	for _, s := range [][2]string{
		{annotation.Encode(gpus("t", 2, 23028)), ""}, {"[]", ""}, {"null", ""}, {"[null]", ""}, {"[{", "x"},
		{`[{"id":"GPU-t-0","count":10,"devmem":23028,"devcore":100,"type":"NVIDIA-A10","health":true}]`, `[{"uuid":"GPU-t-0","score":{"GPU-t-1":50}}]`},
		{"GPU-t-0,10,23028,100,NVIDIA-A10,0,true:", ""},
	} {
		f.Add(s[0], s[1])
	}
	client := fake.NewClientset(registered("n", 1, 23028))
	ctx, e := fuzzExtender(f, client, Options{})
	pod := gpuPod("p", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"})
	f.Fuzz(func(t *testing.T, register, score string) {
		node := gpuNode("t", register, 1)
		if score != "" {
			node.Annotations[annotation.KeyNVIDIAScore] = score
		}
		client.ClearActions()
		res := e.Filter(ctx, &extenderArgs{Pod: pod, Nodes: &corev1.NodeList{Items: []corev1.Node{*node}}})
		reason, failed := res.FailedNodes["t"]
		if res.Error != "" || failed == (res.Nodes != nil) || len(res.FailedNodes) > 1 {
			t.Fatalf("register %q: %+v", register, res)
		}
		v := annotation.NVIDIA()
		v.ScoreKey = ""
		verdict := annotation.Check(v, node.Annotations)
		unparsable := verdict.Err != nil && !errors.Is(verdict.Err, annotation.ErrAbsent) && !errors.Is(verdict.Err, annotation.ErrNoDevices)
		if strings.HasPrefix(reason, ReasonRegisterUnparsable) != unparsable {
			t.Fatalf("register %q: reason %q, verdict %v", register, reason, verdict.Err)
		}
		for _, a := range client.Actions() {
			if v := a.GetVerb(); v != "get" && v != "list" && v != "watch" {
				t.Fatalf("register %q: a simulation wrote %s", register, v)
			}
		}
	})
}
