package extender

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/internal/vectors"
)

// weightsVector is a vector of scoring-weights.json: quota.json's shape plus HAMi's parse
// result, Filter error and per-device scores.
type weightsVector struct {
	quotaVector
	WantError        string              `json:"want_error"`
	WantDeviceScores map[string][]string `json:"want_device_scores"`
}

// weightsRun is what the extender did with a weights vector.
type weightsRun struct {
	Error     string
	NodeNames []string
	Failed    map[string]string
	Patches   []patchBody
	Events    []string
	Webhook   webhookResult
}

// TestConformanceScoringWeights replays scoring-weights.json through the real informers,
// Filter and Admit over a fake clientset, for both versions: the Filter error of an invalid
// annotation (its Event, no patch, no failed node), HAMi's per-device scores (float32, as HAMi
// printed them with %f, in the order HAMi's fit scored each device), the chosen node and GPUs,
// the failed nodes and HAMi's Events, and the webhook's answer (v2.10.0: denied with the parse
// error for a pod asking for GPUs).
//
// Where the SDK departs from HAMi the rule is asserted, found from the input: weights never
// make a placeable pod unschedulable, so a node HAMi's weighted greedy fit leaves unfit but
// the default order fits must fit with the default order's devices, and the node is then
// chosen among the fitting ones by the (unweighted) node score.
func TestConformanceScoringWeights(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		var f struct {
			Vectors []weightsVector `json:"vectors"`
		}
		if !folder.Read(t, "scoring-weights.json", &f) {
			continue
		}
		version := vectors.Pick(folder, allocation.VersionMaster, allocation.VersionV290)
		t.Logf("checked %d vectors from %s", len(f.Vectors), folder.Dir)
		for _, v := range f.Vectors {
			t.Run(folder.Name()+"/"+v.Name, func(t *testing.T) {
				t.Parallel()
				cfg := v.Input.Config.config(version)
				got := runWeightsVector(t, v, cfg)
				checkWeightsVector(t, v, cfg, got)
			})
		}
	}
}

func runWeightsVector(t *testing.T, v weightsVector, cfg allocation.Config) weightsRun {
	t.Helper()
	var run weightsRun
	synctest.Test(t, func(t *testing.T) {
		in := v.Input
		e := vectorCluster(t, cfg, in.Nodes, nil, in.ExistingPods)
		pod := in.Pod.pod(t)
		run.Webhook = admitQuota(t, e, pod)
		e.create(pod)
		e.client.ClearActions()
		res := e.filter(pod, in.NodeNames...)
		synctest.Wait()
		run.Error, run.Failed = res.Error, res.FailedNodes
		if res.NodeNames != nil {
			run.NodeNames = *res.NodeNames
		}
		for _, a := range e.client.Actions() {
			if p, ok := a.(k8stesting.PatchAction); ok {
				var b patchBody
				if err := json.Unmarshal(p.GetPatch(), &b); err != nil {
					t.Fatal(err)
				}
				run.Patches = append(run.Patches, b)
			}
		}
		run.Events = e.events()
	})
	return run
}

func checkWeightsVector(t *testing.T, v weightsVector, cfg allocation.Config, got weightsRun) {
	t.Helper()
	pod := v.Input.Pod.pod(t)
	req := allocation.Requests(pod, cfg)
	weights, parseErr := allocation.PodScoringWeights(pod.Annotations, cfg.Version)

	// The webhook: a GPU pod with weights that do not parse is denied with the parse error.
	wantWebhook := webhookResult{Allowed: true}
	if parseErr != nil && req.Any() {
		wantWebhook = webhookResult{Code: http.StatusForbidden, Message: parseErr.Error()}
	}
	if diff := cmp.Diff(wantWebhook, got.Webhook); diff != "" {
		t.Errorf("webhook (-want +got):\n%s", diff)
	}

	if v.WantError != "" {
		if got.Error != v.WantError || len(got.NodeNames) > 0 || len(got.Failed) > 0 || len(got.Patches) > 0 {
			t.Errorf("Filter = error %q, nodes %v, failed %v, %d patches; HAMi error %q and nothing else", got.Error, got.NodeNames, got.Failed, len(got.Patches), v.WantError)
		}
		if diff := cmp.Diff(v.WantEvents, got.Events); diff != "" {
			t.Errorf("events (-HAMi +got):\n%s", diff)
		}
		return
	}
	if got.Error != "" {
		t.Fatalf("Filter error %q, HAMi none", got.Error)
	}
	if !req.Any() {
		if !slices.Equal(got.NodeNames, v.WantNodeNames) || len(got.Patches) > 0 {
			t.Errorf("a pod without device requests: nodes %v, %d patches; HAMi %v and none", got.NodeNames, len(got.Patches), v.WantNodeNames)
		}
		return
	}

	nodes := weightsNodes(t, v, cfg)
	if diff := cmp.Diff(v.WantDeviceScores, deviceScores(t, v, nodes, req, weights, cfg)); diff != "" {
		t.Errorf("device scores (-HAMi +SDK's order and float32 scores):\n%s", diff)
	}

	// The rule: a node HAMi's weighted fit leaves unfit but the default order fits, fits.
	unweighted := maps.Clone(pod.Annotations)
	delete(unweighted, allocation.KeyDeviceScoringWeights)
	fallback := map[string]allocation.PodDevices{}
	for name := range v.WantFitReason {
		n, ok := nodes[name]
		if !ok {
			continue
		}
		if pd, _, fits := allocation.Fit(n.Devices, req, unweighted, n.Annotations, cfg); fits {
			fallback[name] = pd
		}
	}
	if len(fallback) == 0 {
		if !slices.Equal(got.NodeNames, v.WantNodeNames) {
			t.Errorf("NodeNames = %v, HAMi %v", got.NodeNames, v.WantNodeNames)
		}
		for name, reason := range v.WantFailedNodes {
			if ours, _, _ := strings.Cut(got.Failed[name], "; "); !strings.HasPrefix(ours, reason) {
				t.Errorf("%s: %q, HAMi %q", name, got.Failed[name], reason)
			}
		}
		if diff := cmp.Diff(sortedFitLists(v.WantEvents), sortedFitLists(got.Events)); diff != "" {
			t.Errorf("events, fitting nodes sorted (-HAMi +got):\n%s", diff)
		}
		if len(got.Patches) != len(v.WantPatches) {
			t.Fatalf("%d patches, HAMi %d", len(got.Patches), len(v.WantPatches))
		}
		for i, want := range v.WantPatches {
			if diff := cmp.Diff(want.ruled(t, pod, cfg), got.Patches[i]); diff != "" {
				t.Errorf("patch (-HAMi +got):\n%s", diff)
			}
		}
		return
	}

	// HAMi's chosen node and its devices there, if any.
	fitting := map[string]allocation.PodDevices{}
	if len(v.WantNodeNames) == 1 && len(v.WantPatches) == 1 {
		b := v.WantPatches[0].ruled(t, pod, cfg)
		pd, err := allocation.DecodePodDevices(b["metadata"]["annotations"][annotation.NVIDIA().AllocatedKey], cfg.Version)
		if err != nil {
			t.Fatal(err)
		}
		fitting[v.WantNodeNames[0]] = pd
	}
	for _, name := range v.Input.NodeNames {
		if _, failed := v.WantFitReason[name]; failed || nodes[name].Devices == nil {
			continue
		}
		if _, ok := fitting[name]; !ok {
			// HAMi fits it but did not choose it: its weighted devices are the SDK's fit.
			pd, _, _ := allocation.Fit(nodes[name].Devices, req, pod.Annotations, nodes[name].Annotations, cfg)
			fitting[name] = pd
		}
	}
	maps.Copy(fitting, fallback)
	binpack := slices.Contains(strings.Split(string(cmpOr(allocation.Policy(pod.Annotations[allocation.KeyNodeSchedulerPolicy]), cfg.NodeSchedulerPolicy)), ","), string(allocation.PolicyBinpack))
	want, best := "", 0.0
	for _, name := range slices.Sorted(maps.Keys(fitting)) {
		s := allocation.NodeScore(nodes[name].Devices)
		if want == "" || (binpack && s > best) || (!binpack && s < best) {
			want, best = name, s
		}
	}
	t.Logf("HAMi's weighted greedy fit leaves %v unfit where the default order fits: by the fallback rule the SDK places the pod on %s", slices.Sorted(maps.Keys(fallback)), want)
	if !slices.Equal(got.NodeNames, []string{want}) || len(got.Patches) != 1 {
		t.Fatalf("NodeNames = %v with %d patches, the rule's %s", got.NodeNames, len(got.Patches), want)
	}
	a := got.Patches[0]["metadata"]["annotations"]
	if a[allocation.KeyNode] != want || a[annotation.NVIDIA().AllocatedKey] != allocation.EncodePodDevices(fitting[want]) {
		t.Errorf("patch %v, the rule's node %s devices %q", a, want, allocation.EncodePodDevices(fitting[want]))
	}
	if len(got.Events) != 1 || !strings.Contains(got.Events[0], EventFilteringSucceed+" find fit node("+want+")") {
		t.Errorf("events %q, want one FilteringSucceed for %s", got.Events, want)
	}
}

// weightsNode is a vector node with what the existing pods hold of its GPUs.
type weightsNode struct {
	Devices     []allocation.DeviceUsage
	Annotations map[string]string
}

// weightsNodes are the vector's nodes with the usage of its existing pods.
func weightsNodes(t *testing.T, v weightsVector, cfg allocation.Config) map[string]weightsNode {
	t.Helper()
	used := map[string]map[string]allocation.Usage{}
	for _, vp := range v.Input.ExistingPods {
		p := vp.pod(t)
		node, ok := allocation.PodNode(p)
		if !ok {
			continue
		}
		pd, ok, err := allocation.Allocated(p, annotation.NVIDIA(), cfg.Version)
		if err != nil || !ok {
			continue
		}
		if used[node] == nil {
			used[node] = map[string]allocation.Usage{}
		}
		for id, u := range pd.Usage() {
			used[node][id] = used[node][id].Add(u)
		}
	}
	out := map[string]weightsNode{}
	for _, n := range v.Input.Nodes {
		out[n.Name] = weightsNode{Devices: allocation.WithUsage(n.Devices, used[n.Name]), Annotations: n.Annotations}
	}
	return out
}

// deviceScores are the scores HAMi's fit gives each GPU of each candidate, one per container
// it scores them for, as HAMi logs them: container k is scored on the node's usage with the
// GPUs that containers 0…k-1 took there by the weighted greedy fit (HAMi does not backtrack),
// and scoring stops at the first container that does not fit.
func deviceScores(t *testing.T, v weightsVector, nodes map[string]weightsNode, req allocation.PodRequest, w allocation.ScoringWeights, cfg allocation.Config) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	pod := v.Input.Pod.pod(t)
	for _, name := range v.Input.NodeNames {
		n, ok := nodes[name]
		if !ok {
			continue
		}
		devices := slices.Clone(n.Devices)
		for _, r := range req.Containers {
			if r.Count <= 0 {
				continue
			}
			for _, d := range devices {
				out[d.ID] = append(out[d.ID], fmt.Sprintf("%f", w.DeviceScore(d)))
			}
			pd, _, fits := allocation.Fit(devices, allocation.PodRequest{Containers: []allocation.Request{r}}, pod.Annotations, n.Annotations, cfg)
			if !fits {
				break
			}
			use := pd.Usage()
			for i := range devices {
				devices[i].Usage = devices[i].Add(use[devices[i].ID])
			}
		}
	}
	return out
}

// sortedFitLists sorts the "nodes fit(a:1.00,b:2.00)" list of FilteringSucceed Events: HAMi
// scores nodes in parallel and lists them in the order they finish.
func sortedFitLists(events []string) []string {
	out := slices.Clone(events)
	for i, ev := range out {
		head, rest, ok := strings.Cut(ev, " nodes fit(")
		if !ok {
			continue
		}
		list, tail, _ := strings.Cut(rest, ")")
		parts := strings.Split(list, ",")
		slices.Sort(parts)
		out[i] = head + " nodes fit(" + strings.Join(parts, ",") + ")" + tail
	}
	return out
}
