package extender

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/allocation"
)

// Event reasons of the ResourceQuota check, besides HAMi's.
const (
	// EventResourceQuotaNotFit is recorded on a pod that no node fits because of its
	// namespace's quota: which quota, how much is used and by whom, the limit, and what the
	// pod asks. HAMi's FilteringFailed Events come as well.
	EventResourceQuotaNotFit = allocation.ReasonResourceQuotaNotFit
	// EventQuotaWarning is recorded on a ResourceQuota with a key that names a GPU resource in
	// a form HAMi's quota ignores, or a value read differently from how it looks
	// (allocation.QuotaError).
	EventQuotaWarning = "GPUQuotaWarning"
)

// maxQuotaPods is how many pods a quota rejection names.
const maxQuotaPods = 5

// quotaKey is what a fit depends on of the namespace's quota, for the memo.
func quotaKey(q allocation.Quota) string {
	return fmt.Sprintf("|quota=%+v", q)
}

// askOf is what a request asks at least against a quota under version v's default
// accounting (allocation.AskQuota).
func askOf(req allocation.PodRequest, v allocation.Version) allocation.QuotaAmount {
	return allocation.AskQuota(req, allocation.Config{Version: v})
}

// explainQuota adds to every reason with HAMi's ResourceQuotaNotFit which quota, how much is
// used and by whom, the limit and what the pod asks, and records it as a Warning Event.
func (e *Extender) explainQuota(pod *corev1.Pod, req allocation.PodRequest, d decision) {
	if d.quota == nil {
		return
	}
	var nodes []string
	for node, reason := range d.failed {
		if strings.Contains(reason, allocation.ReasonResourceQuotaNotFit) {
			nodes = append(nodes, node)
		}
	}
	if len(nodes) == 0 {
		return
	}
	_, pods := e.usage.NamespaceUsage(pod.Namespace)
	delete(pods, podKey(pod.Namespace, pod.Name))
	detail := quotaDetail(pod.Namespace, *d.quota, allocation.AskQuota(req, e.opts.Config), pods, e.opts.Config)
	for _, node := range nodes {
		d.failed[node] += "; " + detail
	}
	if e.opts.EventRecorder != nil {
		e.opts.EventRecorder.Eventf(pod, corev1.EventTypeWarning, EventResourceQuotaNotFit, "%s", detail)
	}
}

// quotaDetail says, for each limit the pod goes over (every limit when its percentage request
// cannot be counted beforehand), the quota, the limit, the usage and its pods, and the ask.
func quotaDetail(namespace string, q allocation.Quota, ask allocation.QuotaAmount, pods map[string]allocation.QuotaAmount, c allocation.Config) string {
	memKey, coresKey := allocation.QuotaKeys(c)
	keys := q.Exceeded(ask, c)
	if len(keys) == 0 {
		if q.Limits.Memory.Applies(c.Version) {
			keys = append(keys, memKey)
		}
		if q.Limits.Cores.Applies(c.Version) {
			keys = append(keys, coresKey)
		}
	}
	parts := make([]string, 0, len(keys))
	for _, key := range keys {
		l, limit, used, asks, unit := q.Limits.Cores, q.Limits.Cores.Value, q.Used.Cores, ask.Cores, "%"
		amount := func(a allocation.QuotaAmount) int64 { return a.Cores }
		if key == memKey {
			l, limit, used, asks, unit = q.Limits.Memory, q.MemoryLimit(c), q.Used.Memory, ask.Memory, " MiB"
			amount = func(a allocation.QuotaAmount) int64 { return a.Memory }
		}
		written := strconv.FormatInt(l.Value, 10)
		if limit != l.Value {
			written += fmt.Sprintf(" (%d%s)", limit, unit)
		}
		parts = append(parts, fmt.Sprintf("namespace %s over ResourceQuota %s %s %s: %d%s used by %s, the pod asks %d%s",
			namespace, l.Quota, key, written, used, unit, holders(pods, amount, unit), asks, unit))
	}
	return strings.Join(parts, "; ")
}

// holders names the pods that hold some of a quota, the largest first.
func holders(pods map[string]allocation.QuotaAmount, amount func(allocation.QuotaAmount) int64, unit string) string {
	keys := slices.SortedFunc(maps.Keys(pods), func(a, b string) int {
		return cmp.Or(cmp.Compare(amount(pods[b]), amount(pods[a])), cmp.Compare(a, b))
	})
	keys = slices.DeleteFunc(keys, func(k string) bool { return amount(pods[k]) == 0 })
	if len(keys) == 0 {
		return "no pod"
	}
	var b strings.Builder
	for i, k := range keys {
		if i == maxQuotaPods {
			fmt.Fprintf(&b, " and %d more", len(keys)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s (%d%s)", k, amount(pods[k]), unit)
	}
	return b.String()
}

// observeQuota applies a ResourceQuota add or update and records its warnings on it when they
// changed (a quota's status is written on every pod change of its namespace).
func (e *Extender) observeQuota(rq *corev1.ResourceQuota) {
	warnings := e.usage.SetQuota(rq)
	msgs := make([]string, len(warnings))
	for i, w := range warnings {
		msgs[i] = w.Error()
	}
	key := podKey(rq.Namespace, rq.Name)
	joined := strings.Join(msgs, "\n")
	if e.quotaWarned[key] == joined {
		return
	}
	if joined == "" {
		delete(e.quotaWarned, key)
	} else {
		e.quotaWarned[key] = joined
	}
	if e.opts.EventRecorder == nil {
		return
	}
	for _, m := range msgs {
		e.opts.EventRecorder.Event(rq, corev1.EventTypeWarning, EventQuotaWarning, m)
	}
}

// quotaDenies is HAMi's webhook quota check (fitResourceQuota): whether pod, as the webhook
// mutates it, takes its namespace over a quota limit with what allocation.AdmissionQuotaAsk
// counts.
func (e *Extender) quotaDenies(pod *corev1.Pod, namespace string) bool {
	q := e.usage.Quota(namespace, "")
	cfg := e.opts.Config
	if !q.Limits.Any(cfg.Version) {
		return false
	}
	mutated := pod.DeepCopy()
	for i := range mutated.Spec.Containers {
		c := &mutated.Spec.Containers[i]
		if c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged {
			continue
		}
		add, _, _ := e.mutateContainer(c)
		if len(add) > 0 && c.Resources.Limits == nil {
			c.Resources.Limits = corev1.ResourceList{}
		}
		maps.Copy(c.Resources.Limits, add)
	}
	return len(q.Exceeded(allocation.AdmissionQuotaAsk(mutated, cfg), cfg)) > 0
}
