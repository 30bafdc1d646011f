package extender_test

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// The ResourceQuota keys HAMi enforces, with the chart's resource names.
var quotaMemKey, quotaCoresKey = allocation.QuotaKeys(allocation.Config{})

// quotaName is the ResourceQuota object every quota test creates in its namespaces.
const quotaName = "gpu-quota"

// quotaNamespace creates a namespace for test (deleted when tb ends) and, when hard is not
// empty, the ResourceQuota quotaName with those limits in it. The extender's ResourceQuota
// informer lists it once the extender starts (its /readyz waits for that sync), or sees it by
// its watch; waitQuotaLimit tells when.
func quotaNamespace(tb testing.TB, prefix string, hard map[string]int64) string {
	tb.Helper()
	ctx := tb.Context()
	ns := harness.UniqueName(prefix)
	if err := cp.EnsureNamespace(ctx, ns); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = cp.AdminClient().CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), ns, metav1.DeleteOptions{})
	})
	if len(hard) == 0 {
		return ns
	}
	rl := corev1.ResourceList{}
	for k, v := range hard {
		rl[corev1.ResourceName(k)] = *resource.NewQuantity(v, resource.DecimalSI)
	}
	rq := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: quotaName, Namespace: ns}, Spec: corev1.ResourceQuotaSpec{Hard: rl}}
	if _, err := cp.AdminClient().CoreV1().ResourceQuotas(ns).Create(ctx, rq, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("create resource quota in %s: %v", ns, err)
	}
	return ns
}

// quotaPod is a pod of the stack's scheduler in namespace ns, labelled for test (the quota
// tests' informers select it by the label), whose one container asks for res.
func (s *stack) quotaPod(ns, name, test string, res map[string]int64) *corev1.Pod {
	p := s.gpuPod(name, test, res)
	p.Namespace = ns
	p.Labels = map[string]string{harness.TestLabel: test}
	return p
}

// quotaWatch follows a test's pods over its namespaces, as a Pod informer delivers them in
// order, and after each bind (an event that shows a pod with spec.nodeName for the first time)
// counts the GPU memory and cores the namespace's bound pods hold, from their device
// annotation as HAMi's quota counts them (allocation.QuotaUsage). It keeps the most each
// namespace ever held at once and the number of binds; a deleted pod no longer counts.
type quotaWatch struct {
	pods   corev1listers.PodLister
	events corev1listers.EventLister

	mu    sync.Mutex
	bound map[string]map[string]allocation.QuotaAmount // namespace → pod → what it holds
	peak  map[string]allocation.QuotaAmount            // namespace → most held at once, per resource
	binds map[string]int                               // namespace → binds seen
	// limits are the namespaces' quotas (0: none), set before the pods are created; a bind
	// that takes a namespace's bound pods over one is an error naming the bind.
	limits map[string]allocation.QuotaAmount
	errs   []string
}

// setLimits sets the limits a bind is checked against.
func (w *quotaWatch) setLimits(limits map[string]allocation.QuotaAmount) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.limits = maps.Clone(limits)
}

// newQuotaWatch starts informers on test's pods (all namespaces, by label) and on every
// namespace's Events, and the plugin emulator on those pods (it releases each node lock after
// the bind, as nodeagent does after Allocate). They stop when tb ends.
func newQuotaWatch(tb testing.TB, test string) *quotaWatch {
	tb.Helper()
	podFactory := informers.NewSharedInformerFactoryWithOptions(cp.AdminClient(), 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = harness.TestLabel + "=" + test
	}))
	eventFactory := informers.NewSharedInformerFactory(cp.AdminClient(), 0)
	pods := podFactory.Core().V1().Pods()
	w := &quotaWatch{pods: pods.Lister(), events: eventFactory.Core().V1().Events().Lister(),
		bound: map[string]map[string]allocation.QuotaAmount{}, peak: map[string]allocation.QuotaAmount{}, binds: map[string]int{}}
	if _, err := pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.observe(obj, false) },
		UpdateFunc: func(_, obj any) { w.observe(obj, false) },
		DeleteFunc: func(obj any) { w.observe(obj, true) },
	}); err != nil {
		tb.Fatal(err)
	}
	newPluginEmulator(tb, pods)
	ctx, cancel := context.WithCancel(context.WithoutCancel(tb.Context()))
	podFactory.Start(ctx.Done())
	eventFactory.Start(ctx.Done())
	tb.Cleanup(func() {
		cancel()
		podFactory.Shutdown()
		eventFactory.Shutdown()
	})
	for _, f := range []informers.SharedInformerFactory{podFactory, eventFactory} {
		for typ, ok := range f.WaitForCacheSync(tb.Context().Done()) {
			if !ok {
				tb.Fatalf("informer %v not synced", typ)
			}
		}
	}
	return w
}

// observe applies one pod event.
func (w *quotaWatch) observe(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = d.Obj, true
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	pods := w.bound[p.Namespace]
	if pods == nil {
		pods = map[string]allocation.QuotaAmount{}
		w.bound[p.Namespace] = pods
	}
	if deleted {
		delete(pods, p.Name)
		return
	}
	if _, seen := pods[p.Name]; seen || p.Spec.NodeName == "" {
		return
	}
	pd, _, err := allocation.Allocated(p, annotation.NVIDIA(), allocation.VersionMaster)
	if err != nil || len(pd) == 0 {
		w.errs = append(w.errs, fmt.Sprintf("pod %s/%s bound to %s with devices %q: %v", p.Namespace, p.Name, p.Spec.NodeName,
			p.Annotations[annotation.KeyNVIDIAAllocated], err))
		return
	}
	pods[p.Name] = allocation.QuotaUsage(pd, 0, allocation.VersionMaster)
	w.binds[p.Namespace]++
	var sum allocation.QuotaAmount
	for _, a := range pods {
		sum = sum.Add(a)
	}
	if lim, ok := w.limits[p.Namespace]; ok && ((lim.Memory > 0 && sum.Memory > lim.Memory) || (lim.Cores > 0 && sum.Cores > lim.Cores)) {
		w.errs = append(w.errs, fmt.Sprintf("bind %d of %s: %s to %s takes its %d bound pods to %d MiB, %d %% cores, over the quota's %d MiB, %d %%",
			w.binds[p.Namespace], p.Namespace, p.Name, p.Spec.NodeName, len(pods), sum.Memory, sum.Cores, lim.Memory, lim.Cores))
	}
	pk := w.peak[p.Namespace]
	w.peak[p.Namespace] = allocation.QuotaAmount{Memory: max(pk.Memory, sum.Memory), Cores: max(pk.Cores, sum.Cores)}
}

// held returns what the namespace's bound pods hold now, how many there are, and the most
// they ever held at once.
func (w *quotaWatch) held(ns string) (now allocation.QuotaAmount, pods int, peak allocation.QuotaAmount) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range w.bound[ns] {
		now = now.Add(a)
	}
	return now, len(w.bound[ns]), w.peak[ns]
}

// checkErrs fails tb with what observe could not count.
func (w *quotaWatch) checkErrs(tb testing.TB) {
	tb.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.errs {
		tb.Error(e)
	}
}

// list returns the namespace's pods of the test from the informer.
func (w *quotaWatch) list(tb testing.TB, ns string) []*corev1.Pod {
	tb.Helper()
	pods, err := w.pods.Pods(ns).List(labels.Everything())
	if err != nil {
		tb.Fatal(err)
	}
	return pods
}

// eventMessages returns the messages of the pod's Events with the given reason.
func (w *quotaWatch) eventMessages(tb testing.TB, ns, pod, reason string) []string {
	tb.Helper()
	evs, err := w.events.Events(ns).List(labels.Everything())
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		if e.InvolvedObject.Name == pod && e.Reason == reason {
			out = append(out, e.Message)
		}
	}
	return out
}

// split returns the namespace's bound and pending pods, each sorted by name.
func (w *quotaWatch) split(tb testing.TB, ns string) (bound, pending []*corev1.Pod) {
	tb.Helper()
	for _, p := range w.list(tb, ns) {
		if p.Spec.NodeName != "" {
			bound = append(bound, p)
		} else {
			pending = append(pending, p)
		}
	}
	byName := func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) }
	slices.SortFunc(bound, byName)
	slices.SortFunc(pending, byName)
	return bound, pending
}

// quotaMetric reads the extender's hami_resource_quota_used (used) and hami_resource_quota_limit
// (limit) for the namespace's resource (the quota key without "limits.") from /metrics at addr;
// ok is false when either is missing.
func quotaMetric(addr, ns, res string) (used, limit float64, ok bool) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, 0, false
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return 0, 0, false
	}
	labelsOf := fmt.Sprintf(`namespace="%s",quota_name="%s"`, ns, res)
	var gotUsed, gotLimit bool
	for l := range strings.SplitSeq(string(body), "\n") {
		name, rest, _ := strings.Cut(l, "{")
		if !strings.Contains(rest, labelsOf) {
			continue
		}
		i := strings.LastIndexByte(rest, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(rest[i+1:], 64)
		if err != nil {
			continue
		}
		switch name {
		case "hami_resource_quota_used":
			used, gotUsed = v, true
		case "hami_resource_quota_limit":
			limit, gotLimit = v, true
		}
	}
	return used, limit, gotUsed && gotLimit
}

// waitQuotaUsed waits until the extender's /metrics says the namespace uses want of res under
// the limit: the extender's own count of the quota, which a filter checks against.
func waitQuotaUsed(tb testing.TB, addr, ns, res string, limit, want int64) {
	tb.Helper()
	var used, lim float64
	var ok bool
	harness.Eventually(tb, fmt.Sprintf("extender's quota usage of %s in %s at %d of %d", res, ns, want, limit), 30*time.Second, func() bool {
		used, lim, ok = quotaMetric(addr, ns, res)
		return ok && int64(used) == want && int64(lim) == limit
	})
}

// A namespace with a ResourceQuota limits.nvidia.com/gpumem 20000: of 6 pods asking 5000 MiB
// each, 4 are bound (the boundary fits) and 2 stay Pending, marked Unschedulable with HAMi's
// reason word ResourceQuotaNotFit — in the extender's FilteringFailed Events, in kube-scheduler's
// FailedScheduling Event and the pod's condition — and with the SDK's detail (which quota, the
// limit, the usage and by whom, the ask) in FailedScheduling and in the ResourceQuotaNotFit
// Event. The same 6 pods in a namespace without a quota are all bound. Deleting one bound pod
// of the quota's namespace lets exactly one Pending pod in. At no bind do the namespace's bound
// pods hold more than the limit.
//
// The extender runs with deploy/rbac.yaml's ClusterRole, whose resourcequotas list and watch the
// quota informer needs (examples/extender's tests check it covers extender.ClusterRoleRules).
//
// kube-scheduler retries a pod an extender rejected on any cluster event, here the deleted
// pod. Should that retry reach the extender before its informer delivered the delete (both
// watch the same API server), the pod is rejected again and waits for the next event: when no
// Pending pod is bound 15 s after the delete and the extender's /metrics shows the usage
// without the deleted pod, the test touches the Pending pods (an update event requeues them)
// and logs it.
func TestExtenderQuotaPendingBeyondLimit(t *testing.T) {
	t.Parallel()
	const (
		limit = 20000
		ask   = 5000
		n     = 6
		fit   = limit / ask
	)
	test := harness.UniqueName("quota")
	quotaNS := quotaNamespace(t, "quota", map[string]int64{quotaMemKey: limit})
	freeNS := quotaNamespace(t, "noquota", nil)
	w := newQuotaWatch(t, test)
	w.setLimits(map[string]allocation.QuotaAmount{quotaNS: {Memory: limit}})
	addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	s := newStack(t, stackOptions{args: []string{"--metrics-bind-address=" + addr, "--node-label-selector=" + harness.TestLabel + "=" + test}})
	node := test + "-a"
	createGPUNode(t, test, node, nodeOptions{devices: gpus(node, true), allocatable: -1})
	waitStamped(t, node)
	memRes := strings.TrimPrefix(quotaMemKey, allocation.QuotaPrefix)
	waitQuotaUsed(t, addr, quotaNS, memRes, limit, 0)

	var pods []*corev1.Pod
	for _, ns := range []string{quotaNS, freeNS} {
		for i := range n {
			pods = append(pods, s.quotaPod(ns, fmt.Sprintf("p-%d", i), test, map[string]int64{resGPU: 1, resMem: ask}))
		}
	}
	start := time.Now()
	createPods(t, pods)

	var pending []*corev1.Pod
	harness.Eventually(t, fmt.Sprintf("%d pods of %s bound and %d Unschedulable, %d of %s bound", fit, quotaNS, n-fit, n, freeNS), 45*time.Second, func() bool {
		if b, _ := w.split(t, freeNS); len(b) != n {
			return false
		}
		var b []*corev1.Pod
		b, pending = w.split(t, quotaNS)
		if len(b) != fit || len(pending) != n-fit {
			return false
		}
		for _, p := range pending {
			if _, ok := unschedulable(p); !ok {
				return false
			}
		}
		return true
	})
	t.Logf("%d pods bound in %s, %d in %s, %d Pending, in %v", fit, quotaNS, n, freeNS, len(pending), time.Since(start).Round(time.Millisecond))
	waitQuotaUsed(t, addr, quotaNS, memRes, limit, limit)

	detail := fmt.Sprintf("namespace %s over ResourceQuota %s %s %d: %d MiB used by ", quotaNS, quotaName, quotaMemKey, limit, limit)
	asks := fmt.Sprintf("the pod asks %d MiB", ask)
	for _, p := range pending {
		var filtering, quota, failed []string
		harness.Eventually(t, "the Events of Pending pod "+p.Name, 30*time.Second, func() bool {
			filtering = w.eventMessages(t, quotaNS, p.Name, extender.EventFilteringFailed)
			quota = w.eventMessages(t, quotaNS, p.Name, extender.EventResourceQuotaNotFit)
			failed = w.eventMessages(t, quotaNS, p.Name, "FailedScheduling")
			return containsAny(filtering, []string{"1 nodes " + allocation.ReasonResourceQuotaNotFit + "(" + node + ")"}) &&
				containsAll(quota, detail, asks) && containsAll(failed, allocation.ReasonResourceQuotaNotFit, detail, asks)
		})
		t.Logf("pod %s: FilteringFailed %q; ResourceQuotaNotFit %q; FailedScheduling %q", p.Name, filtering, quota, failed)
		if msg, _ := unschedulable(p); !strings.Contains(msg, allocation.ReasonResourceQuotaNotFit) {
			t.Errorf("pod %s Unschedulable with %q, want HAMi's %s", p.Name, msg, allocation.ReasonResourceQuotaNotFit)
		}
	}

	bound, _ := w.split(t, quotaNS)
	victim := bound[0]
	if err := cp.AdminClient().CoreV1().Pods(quotaNS).Delete(t.Context(), victim.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	refilled := func() bool {
		b, p := w.split(t, quotaNS)
		return len(b) == fit && len(p) == n-fit-1
	}
	nudged := false
	harness.Eventually(t, "a Pending pod of "+quotaNS+" bound after deleting "+victim.Name, 45*time.Second, func() bool {
		if refilled() {
			return true
		}
		if !nudged && time.Since(deleted) > 15*time.Second {
			used, _, _ := quotaMetric(addr, quotaNS, memRes)
			if int64(used) != limit-ask {
				return false // the extender has not seen the delete yet
			}
			nudged = true
			t.Logf("no Pending pod bound 15 s after the delete, which the extender saw: kube-scheduler's retry came before; touching the Pending pods")
			_, p := w.split(t, quotaNS)
			for _, pod := range p {
				touch(t, pod)
			}
		}
		return false
	})
	waitQuotaUsed(t, addr, quotaNS, memRes, limit, limit)
	now, count, peak := w.held(quotaNS)
	t.Logf("%s: %d pods bound holding %d MiB after the delete; at most %d MiB at once (limit %d)", quotaNS, count, now.Memory, peak.Memory, limit)
	if peak.Memory > limit || now.Memory != limit {
		t.Errorf("%s: bound pods held at most %d MiB, now %d MiB, limit %d", quotaNS, peak.Memory, now.Memory, limit)
	}
	if free, _, _ := w.held(freeNS); free.Memory != n*ask {
		t.Errorf("%s (no quota): bound pods hold %d MiB, want %d", freeNS, free.Memory, n*ask)
	}
	w.checkErrs(t)
}

// containsAll reports whether one of msgs contains every part.
func containsAll(msgs []string, parts ...string) bool {
	return slices.ContainsFunc(msgs, func(m string) bool {
		return !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(m, p) })
	})
}

// touch updates an annotation of the pod, an update event on which kube-scheduler requeues a
// Pending pod an extender rejected.
func touch(tb testing.TB, p *corev1.Pod) {
	tb.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{"e2e.hamireg.io/touched":%q}}}`, time.Now().Format(time.RFC3339Nano))
	if _, err := cp.AdminClient().CoreV1().Pods(p.Namespace).Patch(tb.Context(), p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		tb.Fatalf("touch pod %s/%s: %v", p.Namespace, p.Name, err)
	}
}

// quotaAsk is what a pod's request counts against its namespace's quota before it is placed
// (one GPU container: memory and cores × the count).
func quotaAsk(p *corev1.Pod) allocation.QuotaAmount {
	var out allocation.QuotaAmount
	for _, r := range allocation.Requests(p, allocation.Config{}).Containers {
		out = out.Add(allocation.QuotaAmount{Memory: int64(r.Memory) * int64(r.Count), Cores: int64(r.Cores) * int64(r.Count)})
	}
	return out
}

// 150 pods from 3 namespaces, each under a ResourceQuota (GPU memory; the third also GPU cores,
// which it runs out of first), created at once on 3 nodes that have GPUs to spare: after every
// bind, the namespace's bound pods hold no more than its limits; in the end each namespace is
// full (no Pending pod fits what its quota has left, so it holds more than its limit less the
// largest ask), every Pending pod is Unschedulable with HAMi's ResourceQuotaNotFit, and the
// extender's hami_resource_quota_used says what the bound pods hold. The nodes are chosen by
// spread so that the binds do not queue on one node's lock; the plugin emulator releases each
// lock after the bind.
func TestExtenderQuotaManyPodsNeverExceeded(t *testing.T) {
	t.Parallel()
	const perNS = 50
	sizes := []int64{500, 800, 1200, 2000} // MiB, one after the other
	specs := []struct {
		prefix string
		hard   map[string]int64
		cores  int64 // each pod's gpucores
	}{
		{"quota-a", map[string]int64{quotaMemKey: 12000}, 0},
		{"quota-b", map[string]int64{quotaMemKey: 20000}, 0},
		{"quota-c", map[string]int64{quotaMemKey: 40000, quotaCoresKey: 100}, 5},
	}
	test := harness.UniqueName("quotas")
	namespaces := make([]string, len(specs))
	limits := map[string]allocation.QuotaAmount{}
	for i, sp := range specs {
		namespaces[i] = quotaNamespace(t, sp.prefix, sp.hard)
		limits[namespaces[i]] = allocation.QuotaAmount{Memory: sp.hard[quotaMemKey], Cores: sp.hard[quotaCoresKey]}
	}
	w := newQuotaWatch(t, test)
	w.setLimits(limits)
	addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	s := newStack(t, stackOptions{args: []string{"--metrics-bind-address=" + addr, "--node-label-selector=" + harness.TestLabel + "=" + test,
		"--node-scheduler-policy=spread"}})
	gpuNodes(t, test, 3)
	memRes := strings.TrimPrefix(quotaMemKey, allocation.QuotaPrefix)
	for _, ns := range namespaces {
		waitQuotaUsed(t, addr, ns, memRes, limits[ns].Memory, 0)
	}

	var pods []*corev1.Pod
	for j := range perNS {
		for i, sp := range specs {
			res := map[string]int64{resGPU: 1, resMem: sizes[j%len(sizes)]}
			if sp.cores > 0 {
				res[resCores] = sp.cores
			}
			pods = append(pods, s.quotaPod(namespaces[i], fmt.Sprintf("p-%02d", j), test, res))
		}
	}
	start := time.Now()
	createPods(t, pods)

	// full reports whether every pod of ns is bound or Unschedulable and no Pending one fits
	// what the quota has left after the bound pods; it returns what they hold.
	full := func(ns string) (allocation.QuotaAmount, bool) {
		bound, pending := w.split(t, ns)
		var used allocation.QuotaAmount
		for _, p := range bound {
			used = used.Add(quotaAsk(p))
		}
		if len(bound)+len(pending) != perNS {
			return used, false
		}
		lim := limits[ns]
		for _, p := range pending {
			a := quotaAsk(p)
			_, ok := unschedulable(p)
			if !ok || (used.Memory+a.Memory <= lim.Memory && (lim.Cores == 0 || used.Cores+a.Cores <= lim.Cores)) {
				return used, false
			}
		}
		return used, true
	}
	harness.Eventually(t, "every namespace full up to its quota", 90*time.Second, func() bool {
		for _, ns := range namespaces {
			if _, ok := full(ns); !ok {
				return false
			}
		}
		return true
	})
	t.Logf("150 pods settled in %v", time.Since(start).Round(time.Millisecond))

	for i, ns := range namespaces {
		lim := limits[ns]
		used, _ := full(ns)
		now, count, peak := w.held(ns)
		bound, pending := w.split(t, ns)
		t.Logf("%s: %d pods bound hold %d MiB, %d %% cores (limits %d MiB, %d %%; at most %d MiB, %d %% at once); %d Pending",
			ns, count, now.Memory, now.Cores, lim.Memory, lim.Cores, peak.Memory, peak.Cores, len(pending))
		if now != used || count != len(bound) {
			t.Errorf("%s: the watch counts %d pods holding %+v, the informer %d holding %+v", ns, count, now, len(bound), used)
		}
		if peak.Memory > lim.Memory || (lim.Cores > 0 && peak.Cores > lim.Cores) {
			t.Errorf("%s: bound pods held %+v at once, over the limits %+v", ns, peak, lim)
		}
		largest := slices.Max(sizes)
		if sp := specs[i]; sp.cores > 0 {
			if now.Cores <= lim.Cores-sp.cores {
				t.Errorf("%s: bound pods hold %d %% cores, the quota has %d %% left for pods asking %d %%", ns, now.Cores, lim.Cores-now.Cores, sp.cores)
			}
		} else if now.Memory <= lim.Memory-largest {
			t.Errorf("%s: bound pods hold %d MiB, the quota has %d MiB left for pods asking at most %d MiB", ns, now.Memory, lim.Memory-now.Memory, largest)
		}
		if len(pending) == 0 {
			t.Errorf("%s: no pod Pending; the test's pods ask more than the quota", ns)
			continue
		}
		p := pending[0]
		harness.Eventually(t, "FailedScheduling of "+ns+"/"+p.Name+" naming the quota", 30*time.Second, func() bool {
			return containsAll(w.eventMessages(t, ns, p.Name, "FailedScheduling"), allocation.ReasonResourceQuotaNotFit, "ResourceQuota "+quotaName)
		})
		waitQuotaUsed(t, addr, ns, memRes, lim.Memory, now.Memory)
		if lim.Cores > 0 {
			waitQuotaUsed(t, addr, ns, strings.TrimPrefix(quotaCoresKey, allocation.QuotaPrefix), lim.Cores, now.Cores)
		}
	}
	total := 0
	for _, ns := range namespaces {
		w.mu.Lock()
		total += w.binds[ns]
		w.mu.Unlock()
	}
	t.Logf("%d binds counted after each bind, in %v", total, time.Since(start).Round(time.Millisecond))
	w.checkErrs(t)
}
