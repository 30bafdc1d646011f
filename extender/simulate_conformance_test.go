package extender

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"

	gocmp "github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/internal/vectors"
	"github.com/hamireg/hamireg/usage"
)

// simVector is one vector of filter-simulation.json.
type simVector struct {
	Name  string `json:"name"`
	Input struct {
		quotaInput
		RequestNodes []vectorNode `json:"request_nodes"`
	} `json:"input"`
	WantResult *struct {
		Error       string            `json:"error"`
		FailedNodes map[string]string `json:"failed_nodes"`
		NodeNames   []string          `json:"node_names"`
		Nodes       []string          `json:"nodes"`
		NodesEqual  bool              `json:"nodes_equal_request_objects"`
	} `json:"want_result"`
	WantPanic *struct {
		Value string `json:"value"`
	} `json:"want_panic"`
	WantError       string        `json:"want_error"`
	WantWrites      []vectorPatch `json:"want_writes"`
	WantEvents      []string      `json:"want_events"`
	WantCacheBefore struct {
		NodeUsage map[string][]struct {
			ID        string `json:"id"`
			Used      int64  `json:"used"`
			Usedcores int64  `json:"usedcores"`
			Usedmem   int64  `json:"usedmem"`
		} `json:"node_usage"`
		Pods  map[string]json.RawMessage `json:"pods"`
		Quota quotaState                 `json:"quota"`
	} `json:"want_cache_before"`
	WantCacheChanged bool              `json:"want_cache_changed"`
	WantFitReason    map[string]string `json:"want_fit_reason"`
	WantNodeScores   map[string]string `json:"want_node_scores"`
	WantTiedNodes    []string          `json:"want_tied_nodes"`
	WantHTTP         struct {
		Status         int    `json:"status"`
		ContentType    string `json:"content_type"`
		TransportError string `json:"transport_error"`
		Writes         int    `json:"writes"`
	} `json:"want_http"`
}

// requestNodes are the Nodes of the vector's ExtenderArgs, built as HAMi's generator builds
// them: the register annotation of the devices (none when the devices are null), the Node's own
// annotations, nvidia.com/gpu capacity and allocatable the sum of the counts, UID
// "uid-node-<name>". Input with neither request nodes nor node names is the request with an
// empty Nodes list (empty_node_list: the only such request HAMi answers without a panic, and
// its answer, FailedNodes {}, is the simulation's).
func (v simVector) requestNodes() *corev1.NodeList {
	in := v.Input
	if in.RequestNodes == nil {
		if in.NodeNames == nil {
			return &corev1.NodeList{}
		}
		return nil
	}
	out := &corev1.NodeList{}
	for _, n := range in.RequestNodes {
		node := corev1.Node{TypeMeta: metav1.TypeMeta{Kind: "Node", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: types.UID("uid-node-" + n.Name), Annotations: maps.Clone(n.Annotations)}}
		if n.Devices != nil {
			if node.Annotations == nil {
				node.Annotations = map[string]string{}
			}
			node.Annotations[annotation.KeyNVIDIARegister] = annotation.Encode(n.Devices)
		}
		var count int64
		for _, d := range n.Devices {
			count += int64(d.Count)
		}
		q := *resource.NewQuantity(count, resource.DecimalSI)
		node.Status.Capacity = corev1.ResourceList{annotation.ResourceNVIDIAGPU: q}
		node.Status.Allocatable = corev1.ResourceList{annotation.ResourceNVIDIAGPU: q}
		out.Items = append(out.Items, node)
	}
	return out
}

// simCache is the extender's state a filter may change: what each pod holds, what the pods
// hold on each node, and each namespace's quota state.
type simCache struct {
	Pods       map[string]string
	Nodes      map[string]map[string]allocation.Usage
	Namespaces map[string]usage.Namespace
}

func simCacheOf(e *env) simCache {
	view := e.ext.usage.Lock()
	defer view.Unlock()
	out := simCache{Pods: map[string]string{}, Nodes: map[string]map[string]allocation.Usage{}, Namespaces: map[string]usage.Namespace{}}
	for k, p := range view.Pods() {
		out.Pods[k] = fmt.Sprintf("%s %v %+v %v", p.Node, p.GPUs, p.Quota, p.MIG)
	}
	for n, used := range view.Nodes() {
		out.Nodes[n] = maps.Clone(used)
	}
	for ns := range view.Namespaces() {
		out.Namespaces[ns.Name] = ns
	}
	return out
}

// simRun is what the extender did with a vector's request.
type simRun struct {
	res           *extenderFilterResult
	status        int    // HTTP only
	contentType   string // HTTP only
	writes        []string
	patches       []string
	events        []string
	before, after simCache
	// rule is the SDK's rule evaluated on the request: the fitting request Nodes in the
	// rule's order and the reason of every other one (its first part).
	ruleFit    []string
	ruleFailed map[string]string
	quota      allocation.Quota
	self       allocation.QuotaAmount // what the pod itself holds against its quota
}

// TestConformanceFilterSimulation replays filter-simulation.json (both versions) through
// Filter and through the /filter route of Handler: a filter with ExtenderArgs.Nodes is a
// simulation, HAMi v2.10.0's filterSimulation. Asserted for every vector, from the SDK's rule:
//
//   - no API write (the fake clientset's actions other than get, list and watch), no Event,
//     and the usage, per-pod and quota state unchanged (HAMi v2.10.0 writes nothing either;
//     v2.9.0 panics, or with NodeNames also set runs its live path and patches the pod);
//   - every request Node that fits by the rule (its own register annotation, nothing held on
//     it, the namespace's live quota) is answered, deep equal to the request's object, best
//     first by the node policy, ties by name; every other one is in FailedNodes with the
//     rule's reason: "node unregistered" when the annotation is absent or lists no devices,
//     ReasonRegisterUnparsable when it does not decode, else the fit reason (the SDK's
//     explanation after "; ");
//   - HTTP: 200, application/json, the same answer.
//
// Where HAMi answers (v2.10.0), the rule is checked against HAMi: the fitting set is the
// nodes HAMi scored (want_node_scores), HAMi's one returned node is among the SDK's, and
// HAMi's failed nodes and reasons are the rule's ("node unregistered" where the rule says
// the annotation does not parse). The state before the filter is HAMi's (want_cache_before).
// A pod without a device request passes both fields through; a request without Nodes runs the
// live path and must answer, patch and record Events as HAMi does.
func TestConformanceFilterSimulation(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		var f struct {
			Vectors []simVector `json:"vectors"`
		}
		if !folder.Read(t, "filter-simulation.json", &f) {
			continue
		}
		version := vectors.Pick(folder, allocation.VersionMaster, allocation.VersionV290)
		t.Logf("checked %d vectors from %s", len(f.Vectors), folder.Dir)
		for _, v := range f.Vectors {
			for _, viaHTTP := range []bool{false, true} {
				t.Run(folder.Name()+"/"+v.Name+"/http="+strconv.FormatBool(viaHTTP), func(t *testing.T) {
					t.Parallel()
					cfg := v.Input.Config.config(version)
					run := runSimVector(t, v, cfg, viaHTTP)
					checkSimVector(t, v, cfg, run, viaHTTP)
				})
			}
		}
	}
}

func runSimVector(t *testing.T, v simVector, cfg allocation.Config, viaHTTP bool) simRun {
	t.Helper()
	var run simRun
	synctest.Test(t, func(t *testing.T) {
		in := v.Input
		e := vectorCluster(t, cfg, in.Nodes, in.Quotas, in.ExistingPods)
		pod := in.Pod.pod(t)
		created := false
		for _, s := range in.Steps {
			var err error
			switch s.Op {
			case "add_pod":
				_, err = e.client.CoreV1().Pods(s.Pod.pod(t).Namespace).Create(e.ctx, s.Pod.pod(t), metav1.CreateOptions{})
			case "delete_pod":
				err = e.client.CoreV1().Pods(s.Pod.pod(t).Namespace).Delete(e.ctx, s.Pod.Name, metav1.DeleteOptions{})
			case "add_quota":
				_, err = e.client.CoreV1().ResourceQuotas(s.Quota.object().Namespace).Create(e.ctx, s.Quota.object(), metav1.CreateOptions{})
			case "filter":
				p := s.Pod.pod(t)
				if p.Namespace == pod.Namespace && p.Name == pod.Name {
					created = true
				}
				e.create(p)
				if res := e.filter(p, s.NodeNames...); res.Error != "" {
					t.Fatalf("step filter: %s", res.Error)
				}
			default:
				t.Fatalf("unknown step %q", s.Op)
			}
			if err != nil {
				t.Fatalf("step %s: %v", s.Op, err)
			}
			synctest.Wait()
		}
		if !created {
			e.create(pod)
		}
		pod = e.pod2(pod.Namespace, pod.Name) // with what a step's filter wrote
		e.events()
		run.before = simCacheOf(e)
		run.quota = e.ext.usage.Quota(pod.Namespace, podKey(pod.Namespace, pod.Name))
		if p, ok := e.ext.usage.Pod(podKey(pod.Namespace, pod.Name)); ok {
			run.self = p.Quota
		}
		run.ruleFit, run.ruleFailed = simRule(t, pod, v.requestNodes(), cfg, run.quota)
		checkCacheBefore(t, v, e)
		e.client.ClearActions()
		args := &extenderArgs{Pod: pod, Nodes: v.requestNodes()}
		if in.NodeNames != nil {
			args.NodeNames = &in.NodeNames
		}
		if viaHTTP {
			body, err := json.Marshal(args)
			if err != nil {
				t.Fatal(err)
			}
			w := httptest.NewRecorder()
			e.ext.Handler().ServeHTTP(w, httptest.NewRequestWithContext(e.ctx, http.MethodPost, PathFilter, bytes.NewReader(body)))
			run.status, run.contentType = w.Code, w.Header().Get("Content-Type")
			run.res = &extenderFilterResult{}
			if err := json.Unmarshal(w.Body.Bytes(), run.res); err != nil {
				t.Fatalf("/filter answered %d %q: %v", w.Code, w.Body, err)
			}
		} else {
			run.res = e.ext.Filter(e.ctx, args)
		}
		synctest.Wait()
		for _, a := range e.client.Actions() {
			switch a.GetVerb() {
			case "get", "list", "watch":
				continue
			}
			run.writes = append(run.writes, a.GetVerb()+" "+a.GetResource().Resource)
			if p, ok := a.(k8stesting.PatchAction); ok {
				run.patches = append(run.patches, string(p.GetPatch()))
			}
		}
		run.events = e.events()
		run.after = simCacheOf(e)
	})
	return run
}

// simRule evaluates the SDK's simulation rule on a request, with allocation's pure fit: the
// fitting Nodes, best first by the node policy (ties by name), and the reason of the others.
func simRule(t *testing.T, pod *corev1.Pod, nodes *corev1.NodeList, cfg allocation.Config, q allocation.Quota) ([]string, map[string]string) {
	t.Helper()
	failed := map[string]string{}
	if nodes == nil {
		return nil, failed
	}
	req := allocation.Requests(pod, cfg)
	var fo allocation.FitOptions
	if q.Limits.Any(cfg.Version) {
		fo.Quota = &q
	}
	type fit struct {
		name  string
		score float64
	}
	var fits []fit
	for _, n := range nodes.Items {
		v := annotation.NVIDIA()
		v.ScoreKey = ""
		verdict := annotation.Check(v, n.Annotations)
		switch {
		case errors.Is(verdict.Err, annotation.ErrAbsent), errors.Is(verdict.Err, annotation.ErrNoDevices):
			failed[n.Name] = ReasonNodeUnregistered
			continue
		case verdict.Err != nil:
			failed[n.Name] = ReasonRegisterUnparsable
			continue
		}
		devs := allocation.WithUsage(verdict.Devices, nil)
		_, reason, ok := allocation.FitWith(devs, req, pod.Annotations, n.Annotations, cfg, fo)
		if !ok {
			failed[n.Name] = reason
			continue
		}
		fits = append(fits, fit{n.Name, allocation.NodeScore(devs)})
	}
	binpack := hasPolicy(cmp.Or(allocation.Policy(pod.Annotations[allocation.KeyNodeSchedulerPolicy]), cfg.NodeSchedulerPolicy), allocation.PolicyBinpack)
	slices.SortStableFunc(fits, func(a, b fit) int {
		c := cmp.Compare(a.score, b.score)
		if binpack {
			c = -c
		}
		return cmp.Or(c, strings.Compare(a.name, b.name))
	})
	names := make([]string, len(fits))
	for i, f := range fits {
		names[i] = f.name
	}
	return names, failed
}

// checkCacheBefore compares the extender's state before the filter with HAMi's.
func checkCacheBefore(t *testing.T, v simVector, e *env) {
	t.Helper()
	want := v.WantCacheBefore
	for node, devs := range want.NodeUsage {
		used := e.ext.usage.Node(node)
		for _, d := range devs {
			if got := used[d.ID]; got != (allocation.Usage{Used: d.Used, Usedcores: d.Usedcores, Usedmem: d.Usedmem}) {
				t.Errorf("before the filter, %s %s holds %+v, HAMi %+v", node, d.ID, got, d)
			}
		}
	}
	var pods []string
	view := e.ext.usage.Lock()
	for k := range view.Pods() {
		pods = append(pods, k)
	}
	view.Unlock()
	if diff := gocmp.Diff(slices.Sorted(maps.Keys(want.Pods)), slices.Sorted(slices.Values(pods)), cmpEmpty); diff != "" {
		t.Errorf("before the filter, pods holding devices (-HAMi +got):\n%s", diff)
	}
	for ns, entries := range want.Quota {
		q := e.ext.usage.Quota(ns, "")
		memKey, _ := allocation.QuotaKeys(e.ext.opts.Config)
		for res, w := range entries {
			used := q.Used.Cores
			if "limits."+res == memKey {
				used = q.Used.Memory
			}
			if used != w.Used {
				t.Errorf("before the filter, namespace %s uses %d of %s, HAMi %d", ns, used, res, w.Used)
			}
		}
	}
}

func checkSimVector(t *testing.T, v simVector, cfg allocation.Config, run simRun, viaHTTP bool) {
	t.Helper()
	res := run.res
	if viaHTTP && (run.status != http.StatusOK || run.contentType != "application/json") {
		t.Errorf("/filter answered %d %q, want 200 application/json (HAMi: %d %q %s)", run.status, run.contentType,
			v.WantHTTP.Status, v.WantHTTP.ContentType, v.WantHTTP.TransportError)
	}
	if v.WantError != "" || res.Error != "" {
		// HAMi refuses the pod before any node (an invalid hami.io/device-scoring-weights):
		// the same Error, and nothing written, recorded or changed.
		if res.Error != v.WantError {
			t.Errorf("Error %q, HAMi %q", res.Error, v.WantError)
		}
		if len(run.writes) != 0 || len(run.events) != 0 || gocmp.Diff(run.before, run.after) != "" {
			t.Errorf("a refused filter wrote %q, recorded %q or changed the state", run.writes, run.events)
		}
		return
	}
	reqNodes := v.requestNodes()
	asks := allocation.Requests(v.Input.Pod.pod(t), cfg).Any()
	switch {
	case !asks:
		// The existing rule: both fields passed through, nothing written (HAMi passes
		// NodeNames only).
		if !slices.Equal(ptrSlice(res.NodeNames), v.Input.NodeNames) || (res.Nodes == nil) != (reqNodes == nil) ||
			(res.Nodes != nil && len(res.Nodes.Items) != len(reqNodes.Items)) {
			t.Errorf("a pod without a device request: %+v, want the request's fields", res)
		}
		if len(run.writes) != 0 || len(v.WantWrites) != 0 {
			t.Errorf("writes %q, HAMi %d", run.writes, len(v.WantWrites))
		}
		return
	case reqNodes == nil:
		checkSimLivePath(t, v, cfg, run)
		return
	}
	// The simulation.
	if v.WantPanic != nil {
		t.Logf("HAMi v2.9.0 panics (%s); the SDK's rule answers", v.WantPanic.Value)
	} else if len(v.WantWrites) > 0 {
		t.Logf("HAMi %s writes %d times (its live path); the SDK's rule writes nothing", cfg.Version, len(v.WantWrites))
	}
	if len(run.writes) != 0 {
		t.Errorf("a simulation wrote %q", run.writes)
	}
	if len(run.events) != 0 {
		t.Errorf("a simulation recorded Events %q", run.events)
	}
	if diff := gocmp.Diff(run.before, run.after); diff != "" {
		t.Errorf("a simulation changed the extender's state (-before +after):\n%s", diff)
	}
	if res.NodeNames != nil || res.FailedNodes == nil || res.FailedAndUnresolvableNodes != nil {
		t.Errorf("NodeNames %v, FailedNodes %v, FailedAndUnresolvableNodes %v: want absent, present, absent", res.NodeNames, res.FailedNodes, res.FailedAndUnresolvableNodes)
	}
	var got []string
	if res.Nodes != nil {
		byName := map[string]corev1.Node{}
		for _, n := range reqNodes.Items {
			byName[n.Name] = n
		}
		for _, n := range res.Nodes.Items {
			got = append(got, n.Name)
			a, _ := json.Marshal(n)
			b, _ := json.Marshal(byName[n.Name])
			if !bytes.Equal(a, b) {
				t.Errorf("answered Node %s is not the request's:\n%s\n%s", n.Name, a, b)
			}
		}
		if len(res.Nodes.Items) == 0 {
			t.Errorf("Nodes present and empty: want absent when none fits")
		}
	}
	if !slices.Equal(got, run.ruleFit) {
		t.Errorf("Nodes %q, by the rule %q (failed %v)", got, run.ruleFit, res.FailedNodes)
	}
	if diff := gocmp.Diff(slices.Sorted(maps.Keys(run.ruleFailed)), slices.Sorted(maps.Keys(res.FailedNodes)), cmpEmpty); diff != "" {
		t.Errorf("FailedNodes (-rule +got):\n%s", diff)
	}
	for node, want := range run.ruleFailed {
		reason := res.FailedNodes[node]
		switch want {
		case ReasonNodeUnregistered, ReasonRegisterUnparsable:
			if !strings.HasPrefix(reason, want+": ") {
				t.Errorf("%s: %q, want %q and why", node, reason, want)
			}
		default:
			if first, _, _ := strings.Cut(reason, "; "); first != want {
				t.Errorf("%s: %q, by the rule %q", node, reason, want)
			}
		}
	}
	// The rule against HAMi, where HAMi answers.
	if v.WantResult == nil || v.WantPanic != nil || len(v.WantWrites) > 0 {
		return
	}
	ruleFit := slices.Sorted(slices.Values(run.ruleFit))
	for node, reason := range v.WantResult.FailedNodes {
		// Rule: the pod does not count against itself. Where HAMi refuses for the quota a
		// node the rule fits, the pod's own reservation must be what tips it over.
		if i, ok := slices.BinarySearch(ruleFit, node); ok && strings.Contains(reason, allocation.ReasonResourceQuotaNotFit) {
			if run.self == (allocation.QuotaAmount{}) {
				t.Errorf("%s: HAMi %q, the rule fits it, and the pod holds no reservation to explain it", node, reason)
			}
			t.Logf("%s: HAMi counts the pod's own reservation against its quota (%q); the SDK does not", node, reason)
			ruleFit = slices.Delete(ruleFit, i, i+1)
			run.ruleFailed[node] = reason
		}
	}
	if hamiFit := slices.Sorted(maps.Keys(v.WantNodeScores)); !slices.Equal(hamiFit, ruleFit) {
		t.Errorf("the rule's fitting nodes %q, HAMi scored %q", run.ruleFit, hamiFit)
	}
	for _, n := range v.WantResult.Nodes {
		candidates := []string{n}
		if n == "{one_of_tied_nodes}" {
			candidates = v.WantTiedNodes
		}
		if !slices.ContainsFunc(candidates, func(c string) bool { return slices.Contains(got, c) }) {
			t.Errorf("HAMi's node %q (of %q) is not among the SDK's %q", n, candidates, got)
		}
	}
	if diff := gocmp.Diff(slices.Sorted(maps.Keys(v.WantResult.FailedNodes)), slices.Sorted(maps.Keys(run.ruleFailed)), cmpEmpty); diff != "" {
		t.Errorf("failed nodes (-HAMi +rule):\n%s", diff)
	}
	for node, hami := range v.WantResult.FailedNodes {
		want := run.ruleFailed[node]
		if want == ReasonRegisterUnparsable {
			want = ReasonNodeUnregistered // HAMi's word for it
		}
		if hami != want {
			t.Errorf("%s: HAMi %q, by the rule %q", node, hami, want)
		}
	}
}

// checkSimLivePath checks a request without Nodes against HAMi: the live path's answer, its
// patch (device lists by the one-entry-per-container rule), HAMi's Events and whether the
// state changed.
func checkSimLivePath(t *testing.T, v simVector, cfg allocation.Config, run simRun) {
	t.Helper()
	res := run.res
	if v.WantResult == nil {
		t.Fatalf("HAMi gave no result for a live filter")
	}
	if !slices.Equal(ptrSlice(res.NodeNames), v.WantResult.NodeNames) {
		t.Errorf("NodeNames %v, HAMi %v", ptrSlice(res.NodeNames), v.WantResult.NodeNames)
	}
	failed := maps.Clone(res.FailedNodes)
	if failed == nil {
		failed = map[string]string{}
	}
	maps.Copy(failed, res.FailedAndUnresolvableNodes)
	if diff := gocmp.Diff(slices.Sorted(maps.Keys(v.WantResult.FailedNodes)), slices.Sorted(maps.Keys(failed)), cmpEmpty); diff != "" {
		t.Errorf("failed nodes (-HAMi +got):\n%s", diff)
	}
	for node, reason := range failed {
		if first, _, _ := strings.Cut(reason, "; "); first != v.WantFitReason[node] {
			t.Errorf("%s: %q, HAMi's fit reason %q", node, reason, v.WantFitReason[node])
		}
	}
	if len(run.patches) != len(v.WantWrites) || len(run.writes) != len(v.WantWrites) {
		t.Fatalf("writes %q, HAMi %d patches", run.writes, len(v.WantWrites))
	}
	pod := v.Input.Pod.pod(t)
	for i, w := range v.WantWrites {
		var b patchBody
		_ = json.Unmarshal([]byte(run.patches[i]), &b)
		if diff := gocmp.Diff(w.ruled(t, pod, cfg), b); diff != "" {
			t.Errorf("patch (-HAMi +got):\n%s", diff)
		}
	}
	if diff := gocmp.Diff(v.WantEvents, run.events, cmpEmpty); diff != "" {
		t.Errorf("Events (-HAMi +got):\n%s", diff)
	}
	if changed := gocmp.Diff(run.before, run.after) != ""; changed != v.WantCacheChanged {
		t.Errorf("state changed %v, HAMi %v", changed, v.WantCacheChanged)
	}
}

func ptrSlice(p *[]string) []string {
	if p == nil {
		return nil
	}
	return *p
}
