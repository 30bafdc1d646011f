package extender

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/internal/vectors"
)

type quotaSpec struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Hard      map[string]string `json:"hard"`
}

func (q quotaSpec) object() *corev1.ResourceQuota {
	out := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: q.Name, Namespace: cmpOr(q.Namespace, "default")},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{}}}
	for k, v := range q.Hard {
		out.Spec.Hard[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	return out
}

// quotaEntry is one line of HAMi's QuotaManager.GetResourceQuota().
type quotaEntry struct {
	Used     int64 `json:"used"`
	Limit    int64 `json:"limit"`
	LimitSet *bool `json:"limit_set,omitempty"`
}

type quotaState map[string]map[string]quotaEntry

type webhookResult struct {
	Allowed bool   `json:"allowed"`
	Code    int32  `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

type quotaVector struct {
	Name            string            `json:"name"`
	Input           quotaInput        `json:"input"`
	WantFitReason   map[string]string `json:"want_fit_reason"`
	WantNodeNames   []string          `json:"want_node_names"`
	WantFailedNodes map[string]string `json:"want_failed_nodes"`
	WantPatches     []vectorPatch     `json:"want_patches"`
	WantEvents      []string          `json:"want_events"`
	WantQuotaBefore quotaState        `json:"want_quota_before"`
	WantQuotaAfter  quotaState        `json:"want_quota_after"`
	WantWebhook     webhookResult     `json:"want_webhook"`
}

// quotaInput is the input of HAMi's Filter vectors (quota.json's harness, shared by the
// simulation, weights and sidecar files): the cluster, earlier steps, the pod and the
// candidate node names.
type quotaInput struct {
	Config       vectorConfig `json:"config"`
	Quotas       []quotaSpec  `json:"quotas"`
	Nodes        []vectorNode `json:"nodes"`
	ExistingPods []vectorPod  `json:"existing_pods"`
	Steps        []struct {
		Op        string     `json:"op"`
		Pod       *vectorPod `json:"pod"`
		Quota     *quotaSpec `json:"quota"`
		NodeNames []string   `json:"node_names"`
	} `json:"steps"`
	Pod       vectorPod `json:"pod"`
	NodeNames []string  `json:"node_names"`
}

// quotaRun is what the extender did with a vector.
type quotaRun struct {
	NodeNames     []string
	Failed        map[string]string
	Patches       []string
	Events        []string // HAMi's reasons
	OwnEvents     []string // the SDK's own reasons
	Before, After quotaState
	Webhook       webhookResult
	// WebhookUsed and WebhookAsk are the namespace's usage when the webhook ran and what the
	// webhook counts of the pod (its mutated containers), for the rule's webhook answer.
	WebhookUsed, WebhookAsk allocation.QuotaAmount
	// Used is what the namespace's other pods hold before the final filter, as it reads it.
	Used allocation.QuotaAmount
}

// TestConformanceQuota replays quota.json through the real informers, Filter and Admit over a
// fake clientset: the chosen node, the pod's merge patch, every candidate's reason (HAMi's
// fit reason, then the SDK's explanation after "; "), HAMi's Events, the quota state before
// and after the filter, and the webhook's answer. Where HAMi is wrong, the SDK's rule is
// asserted instead, found from the input, never from a vector's name:
//
//   - the limits are the tightest of a namespace's ResourceQuota objects, a fractional one
//     its integer part (HAMi: the object delivered last; deleting either removes the limit;
//     a fractional one is ignored): HAMi's quota state is compared after applying the rule
//     to its limits, and when that changes the answer, the answer must follow the rule: the
//     filter's fit and the webhook's admission are computed from the rule's limits. A
//     fractional limit in the input always brings the rule in, since HAMi may hold no entry
//     for the limit it ignores;
//   - a re-filtered pod counts once: its filter must answer what a first filter answers
//     (HAMi v2.9.0 counts it twice).
//
// The SDK's own Events are checked by their rule: a ResourceQuotaNotFit Event naming the quota
// when a node failed for the quota, a GPUQuotaWarning for each key HAMi ignores.
func TestConformanceQuota(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		var f struct {
			Vectors []quotaVector `json:"vectors"`
		}
		if !folder.Read(t, "quota.json", &f) {
			continue
		}
		version := vectors.Pick(folder, allocation.VersionMaster, allocation.VersionV290)
		t.Logf("checked %d vectors from %s", len(f.Vectors), folder.Dir)
		for _, v := range f.Vectors {
			t.Run(folder.Name()+"/"+v.Name, func(t *testing.T) {
				t.Parallel()
				cfg := v.Input.Config.config(version)
				got := runQuotaVector(t, v, cfg, true)
				checkQuotaVector(t, v, cfg, got)
				if refiltered(v) {
					// Rule: a re-filtered pod counts once, so its filter answers as a first one.
					fresh := runQuotaVector(t, v, cfg, false)
					opts := cmp.FilterPath(func(p cmp.Path) bool {
						f := p.Last().String()
						return f == ".Before" || f == ".Webhook" || f == ".OwnEvents" || f == ".WebhookUsed" || f == ".WebhookAsk"
					}, cmp.Ignore())
					if diff := cmp.Diff(fresh, got, opts); diff != "" {
						t.Errorf("a re-filtered pod is not counted once (-first filter +re-filter):\n%s", diff)
					}
				}
			})
		}
	}
}

// refiltered reports whether a step filters the vector's pod before its final filter.
func refiltered(v quotaVector) bool {
	for _, s := range v.Input.Steps {
		if s.Op == "filter" && s.Pod != nil && s.Pod.Name == v.Input.Pod.Name && cmpOr(s.Pod.Namespace, "default") == cmpOr(v.Input.Pod.Namespace, "default") {
			return true
		}
	}
	return false
}

func runQuotaVector(t *testing.T, v quotaVector, cfg allocation.Config, withRefilter bool) quotaRun {
	t.Helper()
	var run quotaRun
	synctest.Test(t, func(t *testing.T) {
		in := v.Input
		e := vectorCluster(t, cfg, in.Nodes, in.Quotas, in.ExistingPods)
		pod := in.Pod.pod(t)
		created := map[string]bool{}
		ensure := func(p *corev1.Pod) {
			if !created[p.Namespace+"/"+p.Name] {
				created[p.Namespace+"/"+p.Name] = true
				e.create(p)
			}
		}
		webhookDone := false
		for _, s := range in.Steps {
			var err error
			switch s.Op {
			case "add_pod":
				_, err = e.client.CoreV1().Pods(s.Pod.pod(t).Namespace).Create(e.ctx, s.Pod.pod(t), metav1.CreateOptions{})
			case "update_pod":
				_, err = e.client.CoreV1().Pods(s.Pod.pod(t).Namespace).Update(e.ctx, s.Pod.pod(t), metav1.UpdateOptions{})
			case "delete_pod":
				err = e.client.CoreV1().Pods(s.Pod.pod(t).Namespace).Delete(e.ctx, s.Pod.Name, metav1.DeleteOptions{})
			case "add_quota":
				_, err = e.client.CoreV1().ResourceQuotas(s.Quota.object().Namespace).Create(e.ctx, s.Quota.object(), metav1.CreateOptions{})
			case "update_quota":
				_, err = e.client.CoreV1().ResourceQuotas(s.Quota.object().Namespace).Update(e.ctx, s.Quota.object(), metav1.UpdateOptions{})
			case "delete_quota":
				err = e.client.CoreV1().ResourceQuotas(s.Quota.object().Namespace).Delete(e.ctx, s.Quota.Name, metav1.DeleteOptions{})
			case "filter":
				p := s.Pod.pod(t)
				same := p.Namespace == pod.Namespace && p.Name == pod.Name
				if same && !withRefilter {
					continue
				}
				if same && !webhookDone {
					run.Webhook, webhookDone = admitQuota(t, e, pod), true // the webhook runs once, at creation
					run.WebhookUsed, run.WebhookAsk = webhookView(e, pod)
				}
				ensure(p)
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
		if !webhookDone {
			run.Webhook = admitQuota(t, e, pod)
			run.WebhookUsed, run.WebhookAsk = webhookView(e, pod)
		}
		ensure(pod)
		if p, err := e.client.CoreV1().Pods(pod.Namespace).Get(e.ctx, pod.Name, metav1.GetOptions{}); err == nil {
			pod = p // with what a step's filter wrote
		}
		for _, ev := range e.events() { // before the final filter: only the SDK's own count
			if !isHAMiEvent(ev) {
				run.OwnEvents = append(run.OwnEvents, ev)
			}
		}
		run.Before = quotaStateOf(e, v.WantQuotaBefore)
		run.Used = e.ext.usage.Quota(pod.Namespace, podKey(pod.Namespace, pod.Name)).Used
		e.client.ClearActions()
		res := e.filter(pod, in.NodeNames...)
		if res.Error != "" {
			t.Fatalf("Error = %s", res.Error)
		}
		synctest.Wait()
		if res.NodeNames != nil {
			run.NodeNames = *res.NodeNames
		}
		run.Failed = res.FailedNodes
		for _, a := range e.client.Actions() {
			if p, ok := a.(k8stesting.PatchAction); ok {
				run.Patches = append(run.Patches, string(p.GetPatch()))
			}
		}
		for _, ev := range e.events() {
			if isHAMiEvent(ev) {
				run.Events = append(run.Events, ev)
			} else {
				run.OwnEvents = append(run.OwnEvents, ev)
			}
		}
		run.After = quotaStateOf(e, v.WantQuotaAfter)
	})
	return run
}

func isHAMiEvent(ev string) bool {
	return strings.Contains(ev, " "+EventFilteringFailed+" ") || strings.Contains(ev, " "+EventFilteringSucceed+" ")
}

// admitQuota runs the webhook on pod as the API server would at its creation.
func admitQuota(t *testing.T, e *env, pod *corev1.Pod) webhookResult {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	resp := e.ext.Admit(e.ctx, &admissionv1.AdmissionRequest{UID: "u", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Namespace: pod.Namespace, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}})
	out := webhookResult{Allowed: resp.Allowed}
	if !resp.Allowed && resp.Result != nil {
		out.Code, out.Message = resp.Result.Code, resp.Result.Message
	}
	return out
}

// webhookView is the namespace's usage as the webhook reads it and what the webhook counts of
// pod: its containers after the webhook's defaults (allocation.AdmissionQuotaAsk).
func webhookView(e *env, pod *corev1.Pod) (used, ask allocation.QuotaAmount) {
	mutated := pod.DeepCopy()
	for i := range mutated.Spec.Containers {
		c := &mutated.Spec.Containers[i]
		add, _, _ := e.ext.mutateContainer(c)
		if len(add) > 0 && c.Resources.Limits == nil {
			c.Resources.Limits = corev1.ResourceList{}
		}
		maps.Copy(c.Resources.Limits, add)
	}
	return e.ext.usage.Quota(pod.Namespace, "").Used, allocation.AdmissionQuotaAsk(mutated, e.ext.opts.Config)
}

// quotaStateOf reads the extender's quota state in HAMi's shape for the entries like holds.
func quotaStateOf(e *env, like quotaState) quotaState {
	memKey, coresKey := allocation.QuotaKeys(e.ext.opts.Config)
	out := quotaState{}
	for ns, entries := range like {
		q := e.ext.usage.Quota(ns, "")
		out[ns] = map[string]quotaEntry{}
		for res, want := range entries {
			l, used := q.Limits.Cores, q.Used.Cores
			if "limits."+res == memKey {
				l, used = q.Limits.Memory, q.Used.Memory
			} else if "limits."+res != coresKey {
				continue
			}
			got := quotaEntry{Used: used, Limit: l.Value}
			if !l.Set {
				got.Limit = 0
			}
			if want.LimitSet != nil {
				got.LimitSet = &l.Set
			}
			out[ns][res] = got
		}
	}
	return out
}

// ruleLimits are the limits by the SDK's rule, computed from the vector's input alone: the
// tightest of each namespace's objects after the steps, a fractional value's integer part,
// with v2.9.0 a 0 limiting nothing.
func ruleLimits(v quotaVector, v290 bool) map[string]map[string]quotaEntry {
	objs := map[string]map[string]map[string]string{} // ns → name → hard
	set := func(q quotaSpec) {
		ns := cmpOr(q.Namespace, "default")
		if objs[ns] == nil {
			objs[ns] = map[string]map[string]string{}
		}
		objs[ns][q.Name] = q.Hard
	}
	for _, q := range v.Input.Quotas {
		set(q)
	}
	for _, s := range v.Input.Steps {
		switch s.Op {
		case "add_quota", "update_quota":
			set(*s.Quota)
		case "delete_quota":
			delete(objs[cmpOr(s.Quota.Namespace, "default")], s.Quota.Name)
		}
	}
	out := map[string]map[string]quotaEntry{}
	for ns, byName := range objs {
		out[ns] = map[string]quotaEntry{}
		for _, res := range []string{allocation.DefaultResourceMemory, allocation.DefaultResourceCores} {
			limit, isSet := int64(math.MaxInt64), false
			for _, hard := range byName {
				s, ok := hard["limits."+res]
				if !ok {
					continue
				}
				q := resource.MustParse(s)
				n := int64(math.Floor(q.AsApproximateFloat64()))
				if i, exact := q.AsInt64(); exact {
					n = i
				}
				if v290 && n == 0 && q.IsZero() {
					continue
				}
				limit, isSet = min(limit, n), true
			}
			if !isSet {
				limit = 0
			}
			out[ns][res] = quotaEntry{Limit: limit, LimitSet: &isSet}
		}
	}
	return out
}

// byRule is HAMi's quota state with its limits replaced by the rule's; changed says whether
// any limit changed.
func byRule(hami quotaState, rule map[string]map[string]quotaEntry) (quotaState, bool) {
	out, changed := quotaState{}, false
	for ns, entries := range hami {
		out[ns] = map[string]quotaEntry{}
		for res, e := range entries {
			r, ok := rule[ns][res]
			if !ok {
				r = quotaEntry{LimitSet: new(bool)}
			}
			if e.Limit != r.Limit {
				changed = true
			}
			e.Limit = r.Limit
			if e.LimitSet != nil {
				if *e.LimitSet != *r.LimitSet {
					changed = true
				}
				e.LimitSet = r.LimitSet
			}
			out[ns][res] = e
		}
	}
	return out, changed
}

func checkQuotaVector(t *testing.T, v quotaVector, cfg allocation.Config, got quotaRun) {
	t.Helper()
	v290 := cfg.Version == allocation.VersionV290
	rule := ruleLimits(v, v290)
	wantBefore, limitsByRule := byRule(v.WantQuotaBefore, rule)
	wantAfter, _ := byRule(v.WantQuotaAfter, rule)
	// HAMi ignores a fractional limit, and may then hold no entry for it at all: the rule
	// decides wherever the input has one, whatever HAMi's state shows.
	limitsByRule = limitsByRule || fractionalLimit(v)
	if limitsByRule {
		t.Logf("HAMi's limits differ from the SDK's rule (tightest object, integer part): compared after applying it")
	}
	if diff := cmp.Diff(wantBefore, got.Before); diff != "" {
		t.Errorf("quota before the filter (-HAMi by rule +got):\n%s", diff)
	}
	ns := cmpOr(v.Input.Pod.Namespace, "default")
	ruleQuota := func(used allocation.QuotaAmount) allocation.Quota {
		q := allocation.Quota{Used: used}
		if r, ok := rule[ns][allocation.DefaultResourceMemory]; ok {
			q.Limits.Memory = allocation.QuotaLimit{Value: r.Limit, Set: *r.LimitSet}
		}
		if r, ok := rule[ns][allocation.DefaultResourceCores]; ok {
			q.Limits.Cores = allocation.QuotaLimit{Value: r.Limit, Set: *r.LimitSet}
		}
		return q
	}
	wantWebhook := v.WantWebhook
	if limitsByRule {
		// Rule: the webhook denies a pod whose admission ask takes the namespace over the
		// rule's limits (and otherwise answers as HAMi, whose other denials do not depend on
		// the limit).
		wantWebhook = webhookResult{Allowed: true}
		if v.WantWebhook.Message != "" && v.WantWebhook.Message != "exceeding resource quota" {
			wantWebhook = v.WantWebhook
		} else if q := ruleQuota(got.WebhookUsed); len(q.Exceeded(got.WebhookAsk, cfg)) > 0 {
			wantWebhook = webhookResult{Code: 403, Message: "exceeding resource quota"}
		}
	}
	if diff := cmp.Diff(wantWebhook, got.Webhook); diff != "" {
		t.Errorf("webhook (-HAMi by rule +got):\n%s", diff)
	}
	hamiFits := len(v.WantNodeNames) > 0
	gotFits := len(got.NodeNames) > 0
	if hamiFits != gotFits {
		switch {
		case limitsByRule:
			// Rule: the answer follows the rule's limit. The pod asks at least its nominal
			// share; it fits iff that fits the namespace's limit.
			req := allocation.Requests(v.Input.Pod.pod(t), cfg)
			q := ruleQuota(got.Used)
			if ruleFits := len(q.Exceeded(askOf(req, cfg.Version), cfg)) == 0; ruleFits != gotFits {
				t.Errorf("fits %v, but by the rule's limits %+v and usage %+v it fits %v", gotFits, q.Limits, q.Used, ruleFits)
			}
			return
		case refiltered(v) && !hamiFits:
			// Rule: counted once. HAMi's refusal must be the double count: the namespace
			// with the pod counted twice is over, with it counted once it fits.
			e := v.WantQuotaBefore[ns][allocation.DefaultResourceMemory]
			ask := askOf(allocation.Requests(v.Input.Pod.pod(t), cfg), cfg.Version).Memory
			if e.Used+ask <= e.Limit || e.Used > e.Limit {
				t.Errorf("HAMi refuses a re-filtered pod for another reason than counting it twice: %+v, ask %d", e, ask)
			}
			t.Logf("HAMi counts the re-filtered pod twice; the SDK once (checked against a first filter)")
			return
		}
		t.Fatalf("NodeNames = %v, HAMi %v (failed %v)", got.NodeNames, v.WantNodeNames, got.Failed)
	}
	if !slices.Equal(got.NodeNames, v.WantNodeNames) && hamiFits {
		t.Errorf("NodeNames = %v, HAMi %v", got.NodeNames, v.WantNodeNames)
	}
	if diff := cmp.Diff(wantAfter, got.After); diff != "" {
		t.Errorf("quota after the filter (-HAMi by rule +got):\n%s", diff)
	}
	quotaFailed := false
	if !hamiFits {
		if !slices.Equal(slices.Sorted(maps.Keys(got.Failed)), slices.Sorted(maps.Keys(v.WantFailedNodes))) {
			t.Fatalf("FailedNodes = %v, HAMi %v", got.Failed, v.WantFailedNodes)
		}
		for node := range v.WantFailedNodes {
			ours, detail, _ := strings.Cut(got.Failed[node], "; ")
			if ours != v.WantFitReason[node] {
				t.Errorf("%s: %q, HAMi's fit reason %q", node, ours, v.WantFitReason[node])
			}
			if strings.Contains(ours, allocation.ReasonResourceQuotaNotFit) {
				quotaFailed = true
				if !strings.Contains(detail, "ResourceQuota ") || !strings.Contains(detail, " used by ") {
					t.Errorf("%s: the quota rejection %q does not name the quota, its usage and its pods", node, detail)
				}
			}
		}
	}
	if diff := cmp.Diff(v.WantEvents, got.Events); diff != "" {
		t.Errorf("HAMi's events (-HAMi +got):\n%s", diff)
	}
	// The SDK's own Events, by rule.
	var wantOwn []string
	for _, q := range append(append([]quotaSpec(nil), v.Input.Quotas...), stepQuotas(v)...) {
		for _, key := range slices.Sorted(maps.Keys(q.Hard)) {
			if ignoredByHAMi(key) || readDifferently(key, q.Hard[key]) {
				wantOwn = append(wantOwn, EventQuotaWarning+" "+key)
			}
		}
	}
	if quotaFailed {
		wantOwn = append(wantOwn, EventResourceQuotaNotFit+" ResourceQuota")
	}
	var gotOwn []string
	for _, ev := range got.OwnEvents {
		_, rest, _ := strings.Cut(ev, " ") // type
		reason, msg, _ := strings.Cut(rest, " ")
		word := "ResourceQuota"
		if reason == EventQuotaWarning {
			_, after, _ := strings.Cut(msg, ": ")
			word, _, _ = strings.Cut(after, ":")
		}
		gotOwn = append(gotOwn, reason+" "+word)
	}
	if diff := cmp.Diff(wantOwn, gotOwn); diff != "" {
		t.Errorf("the SDK's own events (-rule +got):\n%s\n%q", diff, got.OwnEvents)
	}
	if len(got.Patches) != len(v.WantPatches) {
		t.Fatalf("patches %q, HAMi %d", got.Patches, len(v.WantPatches))
	}
	pod := v.Input.Pod.pod(t)
	for i, want := range v.WantPatches {
		a := want.ruled(t, pod, cfg)
		var b patchBody
		_ = json.Unmarshal([]byte(got.Patches[i]), &b)
		if diff := cmp.Diff(a, b); diff != "" {
			t.Errorf("patch (-HAMi +got):\n%s", diff)
		}
	}
}

func stepQuotas(v quotaVector) []quotaSpec {
	var out []quotaSpec
	for _, s := range v.Input.Steps {
		if s.Op == "add_quota" || s.Op == "update_quota" {
			out = append(out, *s.Quota)
		}
	}
	return out
}

// readDifferently is the rule for a GPUQuotaWarning on an enforced key: a fractional value,
// or a memory value with a unit suffix other than k.
func readDifferently(key, value string) bool {
	if key != "limits."+allocation.DefaultResourceMemory && key != "limits."+allocation.DefaultResourceCores {
		return false
	}
	if q := resource.MustParse(value); !isWhole(&q) {
		return true
	}
	return key == "limits."+allocation.DefaultResourceMemory && strings.TrimRight(value, "0123456789k") != ""
}

func isWhole(q *resource.Quantity) bool {
	_, exact := q.AsInt64()
	return exact
}

// ignoredByHAMi is the rule for a GPUQuotaWarning: a key about the chart's GPU memory, cores,
// percentage or count that HAMi's quota does not read, except requests of the count, which
// Kubernetes' own quota enforces.
func ignoredByHAMi(key string) bool {
	switch key {
	case "limits." + allocation.DefaultResourceMemory, "limits." + allocation.DefaultResourceCores, "requests." + allocation.DefaultResourceCount:
		return false
	}
	name := strings.TrimPrefix(strings.TrimPrefix(key, "limits."), "requests.")
	return slices.Contains([]string{allocation.DefaultResourceMemory, allocation.DefaultResourceCores, allocation.DefaultResourceCount,
		allocation.DefaultResourceMemoryPercentage}, name)
}

// fractionalLimit reports whether a ResourceQuota of the input (at the start or in a step)
// has a limit on GPU memory or cores that is not a whole number.
func fractionalLimit(v quotaVector) bool {
	for _, q := range append(append([]quotaSpec(nil), v.Input.Quotas...), stepQuotas(v)...) {
		for _, key := range []string{"limits." + allocation.DefaultResourceMemory, "limits." + allocation.DefaultResourceCores} {
			if s, ok := q.Hard[key]; ok {
				if n := resource.MustParse(s); !isWhole(&n) {
					return true
				}
			}
		}
	}
	return false
}

// TestConformanceQuotaFractionalLimit runs two vectors of quota.json's shape, written as HAMi
// answers them (it ignores a fractional limit, holding no limit for it), through the same
// harness as TestConformanceQuota: the harness must derive the filter's and the webhook's
// answers from the SDK's rule (the integer part is the limit). A pod asking 3000 MiB under
// "2500.5" is denied and fits nowhere; one asking 2000 MiB is admitted and placed as by HAMi.
func TestConformanceQuotaFractionalLimit(t *testing.T) {
	t.Parallel()
	const shape = `{"name": "%s", "input": {"config": {"gpu_scheduler_policy": "spread", "node_scheduler_policy": "binpack", "memory_factor": 1},
	  "quotas": [{"name": "gpu-quota", "namespace": "team-a", "hard": {"limits.nvidia.com/gpumem": "2500.5"}}],
	  "nodes": [{"name": "node1", "devices": [
	    {"id": "GPU-0a1b2c3d-0000-1111-2222-333344445555", "index": 0, "count": 10, "devmem": 23028, "devcore": 100, "type": "NVIDIA A10", "mode": "hami-core", "health": true},
	    {"id": "GPU-1a1b2c3d-0000-1111-2222-333344445555", "index": 1, "count": 10, "devmem": 23028, "devcore": 100, "type": "NVIDIA A10", "mode": "hami-core", "health": true}]}],
	  "pod": {"name": "p", "namespace": "team-a", "containers": [{"name": "c0", "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30", "nvidia.com/gpumem": "%d"}}]},
	  "node_names": ["node1"]},
	 "want_events": ["Normal FilteringSucceed find fit node(node1), 0 nodes not fit, 1 nodes fit(node1:0.00)"],
	 "want_failed_nodes": {}, "want_fit_reason": {}, "want_node_names": ["node1"],
	 "want_patches": [{"body": {"metadata": {"annotations": {
	   "hami.io/vgpu-devices-allocated": "GPU-1a1b2c3d-0000-1111-2222-333344445555,NVIDIA,%[2]d,30:;",
	   "hami.io/vgpu-devices-to-allocate": "GPU-1a1b2c3d-0000-1111-2222-333344445555,NVIDIA,%[2]d,30:;",
	   "hami.io/vgpu-node": "node1", "hami.io/vgpu-time": "{unix_now}"}, "labels": {"hami.io/vgpu-node": "node1"}}}}],
	 "want_quota_before": {},
	 "want_quota_after": {"team-a": {"nvidia.com/gpucores": {"limit": 0, "used": 30}, "nvidia.com/gpumem": {"limit": 0, "used": %[2]d}}},
	 "want_webhook": {"allowed": true}}`
	for _, folder := range vectors.Folders(t) {
		version := vectors.Pick(folder, allocation.VersionMaster, allocation.VersionV290)
		for _, tc := range []struct {
			name string
			mem  int
			fits bool
		}{{"fractional_limit_integer_part_exceeded", 3000, false}, {"fractional_limit_integer_part_fits", 2000, true}} {
			t.Run(folder.Name()+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				var v quotaVector
				if err := json.Unmarshal(fmt.Appendf(nil, shape, tc.name, tc.mem), &v); err != nil {
					t.Fatal(err)
				}
				cfg := v.Input.Config.config(version)
				got := runQuotaVector(t, v, cfg, true)
				checkQuotaVector(t, v, cfg, got)
				if fits := len(got.NodeNames) > 0; fits != tc.fits || got.Webhook.Allowed != tc.fits {
					t.Errorf("fits %v, admitted %v; the integer part of the limit says %v", fits, got.Webhook.Allowed, tc.fits)
				}
			})
		}
	}
}
