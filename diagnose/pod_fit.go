package diagnose

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/usage"
)

// CodeFitChanged is the warning of a pod whose last FilteringFailed Event found no node while
// the fit recomputed now finds one: the usage or the nodes changed since the filter.
const CodeFitChanged = "FitChangedSinceFilter"

// filterBatchWindow groups the FilteringFailed Events of one filter call: HAMi records one
// per reason word and the summary within the same second.
const filterBatchWindow = 2 * time.Second

// fitState is the fit recomputed for the pod, with what the findings need beyond the
// FitExplanation.
type fitState struct {
	x FitExplanation
	t *usage.Tracker
	// quota is the pod's namespace quota without the pod itself.
	quota allocation.Quota
	// ask is the largest container's request, index its entry in the PodRequest.
	ask   allocation.Request
	index int
	// devices are the candidates' GPUs with their usage, by node.
	devices map[string][]allocation.DeviceUsage
	// excluded are evidence lines on the nodes that are no candidates, and why.
	excluded []string
}

// filterEvents are the Events of the extender's last failed filter.
type filterEvents struct {
	// at is when the last filter failed; events are the FilteringFailed Events it recorded
	// (word Events first, the summary last), scheduling the newest FailedScheduling Event.
	at         time.Time
	events     []corev1.Event
	scheduling *corev1.Event
	// notMeet is N of "no available node, N nodes do not meet" (-1 when absent); words
	// counts the nodes per reason word of "<n> nodes <Word>(<nodes>)".
	notMeet int
	words   map[string]int
	// noRequest says the extender read no device request of the pod.
	noRequest bool
}

var (
	filterWordEvent    = regexp.MustCompile(`^(\d+) nodes (.+)\(([^()]*)\)$`)
	filterSummaryEvent = regexp.MustCompile(`^no available node, (\d+) nodes do not meet`)
)

// filterNoRequest is HAMi's FilteringFailed message for a pod it reads no device request of.
const filterNoRequest = "does not request any resource"

// checkFit (P3) recomputes the fit for a pod before S1 and, when the filter found no node
// (FilteringFailed newer than FilteringSucceed), names what is short and who holds it.
func (a *podAnalysis) checkFit() {
	if !a.req.Any() {
		return
	}
	fs := a.recomputeFit()
	a.r.Fit = &fs.x
	fe := a.filterFailure()
	switch {
	case fe != nil && fe.noRequest && fe.notMeet < 0:
		a.add(a.noRequestFinding(fe))
	case fe != nil && fs.x.Fits == "":
		a.addSpecificFit(fs, SeverityError)
		a.add(a.noFitFinding(fs, fe))
	case fe != nil:
		a.add(a.fitChangedFinding(fs, fe))
	case fs.x.Fits == "" && len(fs.x.Nodes) > 0:
		a.addSpecificFit(fs, SeverityWarning)
		f := a.noFitFinding(fs, nil)
		f.Severity = SeverityWarning
		f.Summary = "no node fits the pod by the fit recomputed now, but the extender has not said so yet (no FilteringFailed Event): " + f.Summary
		a.add(f)
	}
}

// recomputeFit fits the pod with the SDK's allocation on the candidate nodes and the usage
// of the pods read.
func (a *podAnalysis) recomputeFit() *fitState {
	fs := &fitState{t: usage.New(usage.Options{Vendor: a.opts.Vendor, Config: a.opts.Allocation}),
		devices: map[string][]allocation.DeviceUsage{}}
	for i := range a.ev.Pods {
		p := &a.ev.Pods[i]
		if p.Namespace == a.pod.Namespace && p.Name == a.pod.Name {
			continue
		}
		fs.t.Observe(p)
	}
	for i := range a.ev.Quotas {
		fs.t.SetQuota(&a.ev.Quotas[i])
	}
	fs.quota = fs.t.Quota(a.pod.Namespace, usage.Key(a.pod.Namespace, a.pod.Name))
	fs.index, fs.ask = largestRequest(a.req)

	nodes := a.fitCandidates(fs)
	d := allocation.ScheduleWith(nodes, a.req, a.pod.Annotations, a.opts.Allocation, allocation.FitOptions{Quota: &fs.quota})
	fs.x.Fits = d.Node
	for _, n := range nodes {
		nf := NodeFit{Node: n.Name, Reason: d.Failed[n.Name]}
		for _, g := range n.Devices {
			free := GPUFree{UUID: g.ID, Type: g.Type, FreeMemory: int64(g.Devmem) - g.Usedmem,
				FreeCores: int64(g.Devcore) - g.Usedcores, FreeSlots: int64(g.Count) - g.Used, Healthy: g.Health,
				HeldBy: fs.t.PodsOnGPU(n.Name, g.ID)}
			if fs.roomFor(g) {
				nf.FreeGPUs++
			}
			nf.GPUs = append(nf.GPUs, free)
		}
		fs.x.Nodes = append(fs.x.Nodes, nf)
		if nf.Reason == "" {
			continue
		}
		if fs.x.Reasons == nil {
			fs.x.Reasons = map[string]int{}
		}
		for _, w := range fitReasonWords(nf.Reason) {
			fs.x.Reasons[w]++
		}
	}
	fs.x.Shortage = fs.shortage()
	return fs
}

// fitCandidates are the nodes the extender would fit the pod on, sorted by name: those whose
// register annotation decodes to devices, within the extender's --node-label-selector and
// the pod's own node selection (kube-scheduler passes only those to the extender).
func (a *podAnalysis) fitCandidates(fs *fitState) []allocation.Node {
	sel := a.opts.NodeLabelSelector
	if sel == nil && a.ev.Scheduler != nil {
		var err error
		if sel, _, err = schedulerArgs(a.ev.Scheduler, a.opts.ExtenderContainer); err != nil {
			fs.excluded = append(fs.excluded, fmt.Sprintf("deployment %s/%s: %v (every node counts as a candidate)", a.ev.Scheduler.Namespace, a.ev.Scheduler.Name, err))
		}
	}
	order := make([]int, len(a.ev.Nodes))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(x, y int) int { return cmp.Compare(a.ev.Nodes[x].Name, a.ev.Nodes[y].Name) })
	var out []allocation.Node
	for _, i := range order {
		n := &a.ev.Nodes[i]
		v := annotation.Check(a.opts.Vendor, n.Annotations)
		if !v.Registers {
			if !errors.Is(v.Err, annotation.ErrAbsent) {
				fs.excluded = append(fs.excluded, fmt.Sprintf("node %s: not a candidate: %v", n.Name, v.Err))
			}
			continue
		}
		if why := a.notCandidate(n, sel); why != "" {
			fs.excluded = append(fs.excluded, fmt.Sprintf("node %s: not a candidate: %s", n.Name, why))
			continue
		}
		devs := allocation.SetMIGUsage(allocation.WithUsage(v.Devices, fs.t.Node(n.Name)), fs.t.MIG(n.Name))
		fs.devices[n.Name] = devs
		out = append(out, allocation.Node{Name: n.Name, Devices: devs, Annotations: n.Annotations})
	}
	return out
}

// notCandidate says why kube-scheduler or the extender leaves a registered node out, "" when
// it does not.
func (a *podAnalysis) notCandidate(n *corev1.Node, sel map[string]string) string {
	if missing := matchesSelector(n.Labels, sel); len(missing) > 0 {
		return "the extender's --node-label-selector wants " + strings.Join(missing, ",")
	}
	if missing := matchesSelector(n.Labels, a.pod.Spec.NodeSelector); len(missing) > 0 {
		return "the pod's nodeSelector wants " + strings.Join(missing, ",")
	}
	if s, mismatch, err := requiredAffinityMismatch(n, &a.pod.Spec); mismatch {
		why := "the pod's required node affinity (" + describeNodeSelector(s) + ") does not match it"
		if err != nil {
			why += ": " + err.Error()
		}
		return why
	}
	return ""
}

// largestRequest is the container entry that asks the most: GPUs, then memory, then the
// percentage, then cores; the first of equals.
func largestRequest(req allocation.PodRequest) (int, allocation.Request) {
	best := -1
	for i, c := range req.Containers {
		if c.Count == 0 {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		b := req.Containers[best]
		if cmp.Or(cmp.Compare(c.Count, b.Count), cmp.Compare(c.Memory, b.Memory),
			cmp.Compare(pct(c), pct(b)), cmp.Compare(c.Cores, b.Cores)) > 0 {
			best = i
		}
	}
	if best < 0 {
		return -1, allocation.Request{}
	}
	return best, req.Containers[best]
}

// pct is a request's memory percentage, 0 when unset.
func pct(r allocation.Request) int32 {
	if r.MemoryPercentage == allocation.PercentageUnset {
		return 0
	}
	return r.MemoryPercentage
}

// need is the memory in MiB the largest request takes on g.
func (fs *fitState) need(g allocation.DeviceUsage) int64 {
	if fs.ask.Memory > 0 {
		return int64(fs.ask.Memory)
	}
	return int64(g.Devmem) * int64(pct(fs.ask)) / 100
}

// roomFor reports whether g is healthy with the largest request's memory free.
func (fs *fitState) roomFor(g allocation.DeviceUsage) bool {
	return g.Health && int64(g.Devmem)-g.Usedmem >= fs.need(g)
}

// askPhrase is the largest request in words: "2 × 30000 MiB asked".
func (fs *fitState) askPhrase() string {
	if fs.ask.Memory > 0 {
		return fmt.Sprintf("%d × %d MiB asked", fs.ask.Count, fs.ask.Memory)
	}
	return fmt.Sprintf("%d × %d %% of a GPU's memory asked", fs.ask.Count, pct(fs.ask))
}

// freePhrase is what each GPU needs free: "≥ 30000 MiB free".
func (fs *fitState) freePhrase() string {
	if fs.ask.Memory > 0 {
		return fmt.Sprintf("≥ %d MiB free", fs.ask.Memory)
	}
	return fmt.Sprintf("≥ %d %% of its memory free", pct(fs.ask))
}

// gpuCount is "no GPU", "one GPU", "3 GPUs".
func gpuCount(n int) string {
	switch n {
	case 0:
		return "no GPU"
	case 1:
		return "one GPU"
	}
	return fmt.Sprintf("%d GPUs", n)
}

// best is the candidate with the most GPUs that have room for the largest request, ties by
// name; nil without candidates.
func (fs *fitState) best() *NodeFit {
	var b *NodeFit
	for i := range fs.x.Nodes {
		if b == nil || fs.x.Nodes[i].FreeGPUs > b.FreeGPUs {
			b = &fs.x.Nodes[i]
		}
	}
	return b
}

// toFree are the GPUs of node that would be next to free for the largest request: healthy,
// big enough, without room now, most memory free first (then fewest holders, then UUID).
func (fs *fitState) toFree(node string) []allocation.DeviceUsage {
	var out []allocation.DeviceUsage
	for _, g := range fs.devices[node] {
		if g.Health && int64(g.Devmem) >= fs.need(g) && !fs.roomFor(g) {
			out = append(out, g)
		}
	}
	slices.SortFunc(out, func(x, y allocation.DeviceUsage) int {
		return cmp.Or(cmp.Compare(int64(y.Devmem)-y.Usedmem, int64(x.Devmem)-x.Usedmem),
			cmp.Compare(len(fs.t.PodsOnGPU(node, x.ID)), len(fs.t.PodsOnGPU(node, y.ID))), cmp.Compare(x.ID, y.ID))
	})
	return out
}

// shortage is the sentence naming what is short and who holds it; "" when a node fits or
// there is no candidate.
func (fs *fitState) shortage() string {
	b := fs.best()
	if fs.x.Fits != "" || b == nil || fs.index < 0 {
		return ""
	}
	s := fmt.Sprintf("%s; the best node %s has %s with %s", fs.askPhrase(), b.Node, gpuCount(b.FreeGPUs), fs.freePhrase())
	if b.FreeGPUs >= int(fs.ask.Count) {
		return s + ", but it fails with " + b.Reason
	}
	if next := fs.toFree(b.Node); len(next) > 0 {
		if holders := fs.t.PodsOnGPU(b.Node, next[0].ID); len(holders) > 0 {
			return fmt.Sprintf("%s; %s is held by pods %s", s, next[0].ID, strings.Join(holders, ", "))
		}
		return s
	}
	var largest int64
	for _, devs := range fs.devices {
		for _, g := range devs {
			largest = max(largest, int64(g.Devmem))
		}
	}
	return fmt.Sprintf("%s; no GPU of a candidate node is that large (the largest has %d MiB): ask less", s, largest)
}

// fitReasonWords are the reason words of a node's fit reason, as HAMi's FilteringFailed
// Events count them: "node unregistered", else the Word of each "<n>/<m> Word" part; what
// follows "; " only explains.
func fitReasonWords(reason string) []string {
	if strings.HasPrefix(reason, allocation.ReasonNodeUnregistered) {
		return []string{allocation.ReasonNodeUnregistered}
	}
	reason, _, _ = strings.Cut(reason, "; ")
	var words []string
	for part := range strings.SplitSeq(reason, ", ") {
		if _, w, ok := strings.Cut(part, " "); ok {
			part = w
		}
		if part != "" && !slices.Contains(words, part) {
			words = append(words, part)
		}
	}
	return words
}

// filterFailure returns the Events of the extender's last filter when it failed (its newest
// FilteringFailed is newer than the newest FilteringSucceed), nil otherwise.
func (a *podAnalysis) filterFailure() *filterEvents {
	last := a.lastEvent(eventFilteringFailed)
	if last == nil {
		return nil
	}
	if ok := a.lastEvent(eventFilteringSucceed); ok != nil && !eventTime(*last).After(eventTime(*ok)) {
		return nil
	}
	fe := &filterEvents{at: eventTime(*last), notMeet: -1, words: map[string]int{}}
	for _, e := range a.eventsWith(eventFilteringFailed) {
		if fe.at.Sub(eventTime(e)) > filterBatchWindow {
			continue
		}
		msg := strings.TrimSpace(e.Message)
		if m := filterSummaryEvent.FindStringSubmatch(msg); m != nil {
			if fe.notMeet < 0 {
				fe.notMeet, _ = strconv.Atoi(m[1])
			}
		} else if strings.Contains(msg, filterNoRequest) {
			fe.noRequest = true
		} else if m := filterWordEvent.FindStringSubmatch(msg); m != nil {
			if _, seen := fe.words[m[2]]; !seen {
				fe.words[m[2]], _ = strconv.Atoi(m[1])
			}
		}
		fe.events = append(fe.events, e)
	}
	slices.SortStableFunc(fe.events, func(x, y corev1.Event) int {
		return cmp.Or(cmp.Compare(summaryRank(x), summaryRank(y)), cmp.Compare(x.Message, y.Message))
	})
	if e := a.lastEvent(eventFailedScheduling); e != nil && fe.at.Sub(eventTime(*e)) <= filterBatchWindow {
		fe.scheduling = e
	}
	return fe
}

// summaryRank puts the summary Event after the word Events.
func summaryRank(e corev1.Event) int {
	if filterSummaryEvent.MatchString(strings.TrimSpace(e.Message)) {
		return 1
	}
	return 0
}

// eventLine quotes an Event as evidence on the pod.
func (a *podAnalysis) eventLine(e corev1.Event) string {
	from := cmp.Or(e.Source.Component, e.ReportingController, "unknown source")
	times := ""
	if e.Count > 1 {
		times = fmt.Sprintf(", %d times", e.Count)
	}
	return fmt.Sprintf("pod %s/%s: Event %s from %s at %s%s: %q", a.pod.Namespace, a.pod.Name, e.Reason, from,
		eventTime(e).UTC().Format(time.RFC3339), times, e.Message)
}

// recomputedLines render the recomputed fit the way HAMi's Events do, then each node.
func (fs *fitState) recomputedLines() []string {
	byWord := map[string][]string{}
	failed := 0
	for _, n := range fs.x.Nodes {
		if n.Reason == "" {
			continue
		}
		failed++
		for _, w := range fitReasonWords(n.Reason) {
			byWord[w] = append(byWord[w], n.Node)
		}
	}
	var parts []string
	for _, w := range slices.Sorted(maps.Keys(byWord)) {
		parts = append(parts, fmt.Sprintf("%d nodes %s(%s)", len(byWord[w]), w, strings.Join(byWord[w], ",")))
	}
	head := fmt.Sprintf("recomputed now: %d of %d candidate nodes do not fit", failed, len(fs.x.Nodes))
	if len(parts) > 0 {
		head += ": " + strings.Join(parts, ", ")
	}
	lines := []string{head}
	for _, n := range fs.x.Nodes {
		reason := cmp.Or(n.Reason, "fits")
		lines = append(lines, fmt.Sprintf("node %s: %s; %s with %s", n.Node, reason, gpuCount(n.FreeGPUs), fs.freePhrase()))
	}
	return lines
}

// disagreement says how the Events' counts differ from the recomputed ones, "" when they
// agree.
func (fs *fitState) disagreement(fe *filterEvents) string {
	failed := 0
	for _, n := range fs.x.Nodes {
		if n.Reason != "" {
			failed++
		}
	}
	var diffs []string
	if fe.notMeet >= 0 && fe.notMeet != failed {
		diffs = append(diffs, fmt.Sprintf("%d nodes do not meet in the Events, %d now", fe.notMeet, failed))
	}
	for _, w := range slices.Sorted(maps.Keys(fe.words)) {
		if got := fs.x.Reasons[w]; got != fe.words[w] {
			diffs = append(diffs, fmt.Sprintf("%s: %d in the Events, %d now", w, fe.words[w], got))
		}
	}
	for _, w := range slices.Sorted(maps.Keys(fs.x.Reasons)) {
		if _, ok := fe.words[w]; !ok && len(fe.words) > 0 && w != allocation.ReasonNodeInsufficientDevice {
			diffs = append(diffs, fmt.Sprintf("%s: none in the Events, %d now", w, fs.x.Reasons[w]))
		}
	}
	if len(diffs) == 0 {
		return ""
	}
	return fmt.Sprintf("the Events and the recomputed fit disagree (%s): the usage or the nodes changed since the filter at %s",
		strings.Join(diffs, "; "), fe.at.UTC().Format(time.RFC3339))
}

// noFitFinding is the P3 finding: the shortage, the Events (fe, nil when there are none),
// the recomputed counts and the fix.
func (a *podAnalysis) noFitFinding(fs *fitState, fe *filterEvents) Finding {
	f := Finding{Case: P3NoNodeFits, Severity: SeverityError, Code: CodeFitShort}
	switch {
	case fs.x.Shortage != "":
		f.Summary = "no node fits the pod: " + fs.x.Shortage
	case len(fs.x.Nodes) == 0:
		f.Summary = "no node fits the pod: no node registers GPUs with HAMi's scheduler as a candidate for it"
	default:
		f.Summary = "no node fits the pod"
	}
	for _, ask := range a.r.Asks {
		f.Evidence = append(f.Evidence, fmt.Sprintf("pod %s/%s asks %s", a.pod.Namespace, a.pod.Name, ask))
	}
	if fe != nil {
		for _, e := range fe.events {
			f.Evidence = append(f.Evidence, a.eventLine(e))
		}
		if fe.scheduling != nil {
			f.Evidence = append(f.Evidence, a.eventLine(*fe.scheduling))
		}
	}
	f.Evidence = append(f.Evidence, fs.recomputedLines()...)
	if fe != nil {
		if d := fs.disagreement(fe); d != "" {
			f.Evidence = append(f.Evidence, d)
		}
		if fe.scheduling != nil && strings.Contains(fe.scheduling.Message, allocation.ReasonNodeUnfitPod) {
			f.Evidence = append(f.Evidence, fmt.Sprintf("%q is HAMi v2.9.0's word for any registered node that does not fit; the reasons are the FilteringFailed Events' and the recomputed ones above", allocation.ReasonNodeUnfitPod))
		}
	}
	f.Evidence = append(f.Evidence, fs.excluded...)
	f.Fix = a.shortageFix(fs)
	if len(f.Fix) == 0 {
		// No candidate, or nothing to free or ask less of: the nodes are the problem.
		f.Fix = []string{"kubectl hami-doctor nodes    # why no GPU node registers with HAMi's scheduler, with the fixes"}
	}
	return f
}

// shortageFix frees the GPUs the best node lacks (deleting their holders) or asks less.
func (a *podAnalysis) shortageFix(fs *fitState) []string {
	b := fs.best()
	if b == nil || fs.index < 0 || b.FreeGPUs >= int(fs.ask.Count) {
		return nil
	}
	var fix []string
	next := fs.toFree(b.Node)
	if lack := int(fs.ask.Count) - b.FreeGPUs; len(next) > lack {
		next = next[:lack]
	}
	seen := map[string]bool{}
	for _, g := range next {
		for _, h := range fs.t.PodsOnGPU(b.Node, g.ID) {
			if seen[h] {
				continue
			}
			seen[h] = true
			hns, hname, _ := strings.Cut(h, "/")
			fix = append(fix, fmt.Sprintf("kubectl -n %s delete pod %s    # frees its share of %s on node %s", hns, hname, g.ID, b.Node))
		}
	}
	if smaller := fs.smallerAsk(b.Node); smaller > 0 {
		path := a.resourcePath(fs.index, a.opts.Allocation.ResourceMemory)
		fix = append(fix, recreateFix(a.pod, fmt.Sprintf(`%s="%d"`, path, smaller))+
			fmt.Sprintf("    # or ask at most %d MiB per GPU, which fits %d GPUs of node %s now", smaller, fs.ask.Count, b.Node))
	}
	return fix
}

// smallerAsk is the most memory per GPU, below the ask, with which the largest request would
// find its GPUs free on node; 0 when none (the ask is a percentage, or too few GPUs).
func (fs *fitState) smallerAsk(node string) int64 {
	if fs.ask.Memory <= 0 {
		return 0
	}
	var free []int64
	for _, g := range fs.devices[node] {
		if g.Health && g.Used < int64(g.Count) {
			free = append(free, int64(g.Devmem)-g.Usedmem)
		}
	}
	slices.SortFunc(free, func(x, y int64) int { return cmp.Compare(y, x) })
	if int(fs.ask.Count) > len(free) || fs.ask.Count <= 0 {
		return 0
	}
	if v := free[fs.ask.Count-1]; v > 0 && v < int64(fs.ask.Memory) {
		return v
	}
	return 0
}

// resourcePath is the jq path of a resource limit of the i-th request entry's container.
func (a *podAnalysis) resourcePath(i int, resource string) string {
	n := len(a.pod.Spec.InitContainers)
	if i < n {
		return fmt.Sprintf(".spec.initContainers[%d].resources.limits[%q]", i, resource)
	}
	return fmt.Sprintf(".spec.containers[%d].resources.limits[%q]", i-n, resource)
}

// fitChangedFinding is the warning of a pod whose last filter failed while a node fits now.
func (a *podAnalysis) fitChangedFinding(fs *fitState, fe *filterEvents) Finding {
	f := Finding{Case: P3NoNodeFits, Severity: SeverityWarning, Code: CodeFitChanged,
		Summary: fmt.Sprintf("the extender found no node at %s, but node %s fits the pod now: the usage or the nodes changed since; kube-scheduler retries the pod (when a pod or node changes, else within 5 min)",
			fe.at.UTC().Format(time.RFC3339), fs.x.Fits)}
	for _, e := range fe.events {
		f.Evidence = append(f.Evidence, a.eventLine(e))
	}
	f.Evidence = append(f.Evidence, fs.recomputedLines()...)
	if d := fs.disagreement(fe); d != "" {
		f.Evidence = append(f.Evidence, d)
	}
	f.Fix = []string{fmt.Sprintf("kubectl -n %s get pod %s -w    # wait for the retry; if it stays Pending, diagnose it again", a.pod.Namespace, a.pod.Name)}
	return f
}

// addSpecificFit adds the findings of the reasons with a cause of their own: the quota, the
// type or UUID selector, the NUMA binding.
func (a *podAnalysis) addSpecificFit(fs *fitState, sev Severity) {
	for _, f := range []func(*fitState) (Finding, bool){a.quotaFinding, a.typeFinding, a.uuidFinding, a.numaFinding} {
		if pf, ok := f(fs); ok {
			pf.Case, pf.Severity = P3NoNodeFits, sev
			a.add(pf)
		}
	}
}

// quotaAsk is what the pod asks against its namespace's quota: count × memory and cores per
// container (a percentage resolved on the largest candidate GPU), with VersionMaster the
// init containers as the larger of the largest of them and the regular containers' sum.
func (a *podAnalysis) quotaAsk(fs *fitState) allocation.QuotaAmount {
	var largest int64
	for _, devs := range fs.devices {
		for _, g := range devs {
			largest = max(largest, int64(g.Devmem))
		}
	}
	var initMax, sum allocation.QuotaAmount
	for i, c := range a.req.Containers {
		mem := int64(c.Memory)
		if mem == 0 {
			mem = largest * int64(pct(c)) / 100
		}
		q := allocation.QuotaAmount{Memory: mem * int64(c.Count), Cores: int64(c.Cores) * int64(c.Count)}
		if i < a.req.Init && a.opts.Allocation.Version == allocation.VersionMaster {
			initMax = allocation.QuotaAmount{Memory: max(initMax.Memory, q.Memory), Cores: max(initMax.Cores, q.Cores)}
			continue
		}
		sum = sum.Add(q)
	}
	return allocation.QuotaAmount{Memory: max(initMax.Memory, sum.Memory), Cores: max(initMax.Cores, sum.Cores)}
}

// quotaFinding names the ResourceQuota that refuses the pod's GPUs.
func (a *podAnalysis) quotaFinding(fs *fitState) (Finding, bool) {
	if fs.x.Reasons[allocation.ReasonResourceQuotaNotFit] == 0 {
		return Finding{}, false
	}
	cfg, q, ns := a.opts.Allocation, fs.quota, a.pod.Namespace
	ask := a.quotaAsk(fs)
	memKey, coreKey := allocation.QuotaKeys(cfg)
	exceeded := q.Exceeded(ask, cfg)
	if len(exceeded) == 0 { // the fit refused a GPU on the quota; name whatever limit applies
		if q.Limits.Memory.Applies(cfg.Version) {
			exceeded = append(exceeded, memKey)
		}
		if q.Limits.Cores.Applies(cfg.Version) {
			exceeded = append(exceeded, coreKey)
		}
	}
	if len(exceeded) == 0 {
		return Finding{}, false
	}
	factor := max(int64(cfg.MemoryFactor), 1)
	f := Finding{Code: CodeQuotaExceeded}
	var sums []string
	for _, key := range exceeded {
		limit, used, asked, unit := q.Limits.Cores, q.Used.Cores, ask.Cores, "%"
		needed := used + asked
		if key == memKey {
			limit, used, asked, unit = q.Limits.Memory, q.Used.Memory, ask.Memory, "MiB"
			needed = (used + asked + factor - 1) / factor
		}
		sums = append(sums, fmt.Sprintf("ResourceQuota %s/%s allows %s %d; the namespace's other pods hold %d %s and the pod asks %d %s",
			ns, limit.Quota, key, limit.Value, used, unit, asked, unit))
		f.Evidence = append(f.Evidence, fmt.Sprintf("resourcequota %s/%s: spec.hard[%q] = %d", ns, limit.Quota, key, limit.Value))
		f.Fix = append(f.Fix, fmt.Sprintf(`kubectl -n %s patch resourcequota %s --type merge -p '{"spec":{"hard":{%q:"%d"}}}'`, ns, limit.Quota, key, needed))
	}
	f.Summary = strings.Join(sums, "; ")
	_, byPod := fs.t.NamespaceUsage(ns)
	keys := slices.Sorted(maps.Keys(byPod))
	slices.SortStableFunc(keys, func(x, y string) int { return cmp.Compare(byPod[y].Memory, byPod[x].Memory) })
	var held []string
	for _, k := range keys {
		held = append(held, fmt.Sprintf("%s %d MiB, %d %% cores", k, byPod[k].Memory, byPod[k].Cores))
	}
	if len(held) > 0 {
		f.Evidence = append(f.Evidence, fmt.Sprintf("namespace %s: pods holding GPU quota: %s", ns, strings.Join(held, "; ")))
	}
	for _, k := range keys[:min(len(keys), 3)] {
		_, name, _ := strings.Cut(k, "/")
		f.Fix = append(f.Fix, fmt.Sprintf("kubectl -n %s delete pod %s    # or free the %d MiB, %d %% cores of the quota it holds", ns, name, byPod[k].Memory, byPod[k].Cores))
	}
	return f, true
}

// candidateTypes lists the GPU types (or modes) of the candidate nodes with the nodes that
// have them: "NVIDIA A10 (gpu-1, gpu-2)".
func (fs *fitState) candidateTypes(of func(allocation.DeviceUsage) string) (types []string, phrase string) {
	nodes := map[string][]string{}
	for _, n := range slices.Sorted(maps.Keys(fs.devices)) {
		for _, g := range fs.devices[n] {
			if v := of(g); !slices.Contains(nodes[v], n) {
				nodes[v] = append(nodes[v], n)
			}
		}
	}
	var parts []string
	for _, v := range slices.Sorted(maps.Keys(nodes)) {
		types = append(types, v)
		parts = append(parts, fmt.Sprintf("%s (%s)", v, strings.Join(nodes[v], ", ")))
	}
	return types, strings.Join(parts, ", ")
}

// annotateFix is the command that removes (value "") or sets a pod annotation.
func (a *podAnalysis) annotateFix(key, value string) string {
	if value == "" {
		return fmt.Sprintf("kubectl -n %s annotate pod %s %s-", a.pod.Namespace, a.pod.Name, key)
	}
	return fmt.Sprintf("kubectl -n %s annotate pod %s --overwrite '%s=%s'", a.pod.Namespace, a.pod.Name, key, value)
}

// typeFinding names the type or mode selector that no candidate GPU matches.
func (a *podAnalysis) typeFinding(fs *fitState) (Finding, bool) {
	if fs.x.Reasons[allocation.ReasonCardTypeMismatch] == 0 {
		return Finding{}, false
	}
	f := Finding{Code: CodeTypeSelector}
	types, typePhrase := fs.candidateTypes(func(g allocation.DeviceUsage) string { return g.Type })
	_, modePhrase := fs.candidateTypes(func(g allocation.DeviceUsage) string { return g.Mode })
	var sums []string
	for _, s := range []struct{ key, what, have string }{
		{allocation.KeyUseGPUType, "matches no GPU type of the candidate nodes", typePhrase},
		{allocation.KeyNoUseGPUType, "excludes the GPU types of the candidate nodes", typePhrase},
		{allocation.KeyVGPUMode, "matches no GPU mode of the candidate nodes", modePhrase},
	} {
		v, ok := a.pod.Annotations[s.key]
		if !ok {
			continue
		}
		sums = append(sums, fmt.Sprintf("the pod's %s %q %s, which have %s", s.key, v, s.what, s.have))
		f.Evidence = append(f.Evidence, fmt.Sprintf("pod %s/%s: %s = %q", a.pod.Namespace, a.pod.Name, s.key, v))
		f.Fix = append(f.Fix, a.annotateFix(s.key, ""))
		if s.key == allocation.KeyUseGPUType && len(types) > 0 {
			f.Fix = append(f.Fix, a.annotateFix(s.key, types[0])+"    # or a type the nodes have")
		}
	}
	if len(sums) == 0 {
		return Finding{}, false
	}
	f.Summary = strings.Join(sums, "; ")
	f.Evidence = append(f.Evidence, fmt.Sprintf("candidate nodes: %d with CardTypeMismatch; GPU types %s", fs.x.Reasons[allocation.ReasonCardTypeMismatch], typePhrase))
	return f, true
}

// uuidFinding names the UUID selector that no candidate GPU satisfies.
func (a *podAnalysis) uuidFinding(fs *fitState) (Finding, bool) {
	if fs.x.Reasons[allocation.ReasonCardUUIDMismatch] == 0 {
		return Finding{}, false
	}
	where := map[string]string{}
	for n, devs := range fs.devices {
		for _, g := range devs {
			where[g.ID] = n
		}
	}
	f := Finding{Code: CodeUUIDSelector}
	var sums []string
	for _, key := range []string{allocation.KeyUseGPUUUID, allocation.KeyNoUseGPUUUID} {
		v, ok := a.pod.Annotations[key]
		if !ok {
			continue
		}
		var on, off []string
		for u := range strings.SplitSeq(v, ",") {
			if u = strings.TrimSpace(u); u == "" {
				continue
			}
			if n, ok := where[u]; ok {
				on = append(on, u+" on node "+n)
			} else {
				off = append(off, u)
			}
		}
		s := fmt.Sprintf("the pod's %s %q", key, v)
		switch {
		case key == allocation.KeyUseGPUUUID && len(on) == 0:
			s += " names no GPU of a candidate node"
		case key == allocation.KeyUseGPUUUID:
			s += " allows only " + strings.Join(on, ", ") + ", which do not fit"
		default:
			s += " excludes the GPUs that would fit"
		}
		sums = append(sums, s)
		f.Evidence = append(f.Evidence, fmt.Sprintf("pod %s/%s: %s = %q", a.pod.Namespace, a.pod.Name, key, v))
		if len(off) > 0 {
			f.Evidence = append(f.Evidence, "on no candidate node: "+strings.Join(off, ", "))
		}
		f.Fix = append(f.Fix, a.annotateFix(key, ""))
	}
	if len(sums) == 0 {
		return Finding{}, false
	}
	f.Summary = strings.Join(sums, "; ")
	return f, true
}

// numaFinding names the NUMA binding that no candidate satisfies.
func (a *podAnalysis) numaFinding(fs *fitState) (Finding, bool) {
	v := a.pod.Annotations[allocation.KeyNUMABind]
	if bind, _ := strconv.ParseBool(v); !bind || fs.x.Reasons[allocation.ReasonNumaNotFit] == 0 {
		return Finding{}, false
	}
	bestNode, bestNUMA, bestN := "", 0, -1
	for _, n := range slices.Sorted(maps.Keys(fs.devices)) {
		per := map[int]int{}
		for _, g := range fs.devices[n] {
			if fs.roomFor(g) && g.Used < int64(g.Count) {
				per[g.Numa]++
			}
		}
		for _, numa := range slices.Sorted(maps.Keys(per)) {
			if per[numa] > bestN {
				bestNode, bestNUMA, bestN = n, numa, per[numa]
			}
		}
	}
	f := Finding{Code: CodeNUMABind,
		Summary: fmt.Sprintf("the pod's %s=%s puts the %d GPUs of a container on one NUMA node", allocation.KeyNUMABind, v, fs.ask.Count),
		Evidence: []string{fmt.Sprintf("pod %s/%s: %s = %q", a.pod.Namespace, a.pod.Name, allocation.KeyNUMABind, v),
			fmt.Sprintf("candidate nodes: %d with NumaNotFit", fs.x.Reasons[allocation.ReasonNumaNotFit])},
		Fix: []string{a.annotateFix(allocation.KeyNUMABind, "")}}
	if bestN > 0 {
		f.Summary += fmt.Sprintf("; the best is node %s NUMA %d, which has %s with %s", bestNode, bestNUMA, gpuCount(bestN), fs.freePhrase())
	} else {
		f.Summary += "; no NUMA node of a candidate has a GPU with " + fs.freePhrase()
	}
	return f, true
}

// noRequestFinding is the P3 error of a pod the extender reads no device request of, while
// the SDK reads one: the scheduler's device configuration names other resources.
func (a *podAnalysis) noRequestFinding(fe *filterEvents) Finding {
	c := a.opts.Allocation
	f := Finding{Case: P3NoNodeFits, Severity: SeverityError, Code: CodeFitShort,
		Summary: fmt.Sprintf("the extender says the pod %q, though it asks %s: the scheduler's device configuration names other resources than %s, %s, %s",
			filterNoRequest, strings.Join(a.r.Asks, "; "), c.ResourceCount, c.ResourceMemory, c.ResourceCores)}
	for _, e := range fe.events {
		f.Evidence = append(f.Evidence, a.eventLine(e))
	}
	f.Fix = []string{fmt.Sprintf("kubectl -n %s get deployment %s -o yaml    # compare the resource names of the extender's device configuration with the pod's limits",
		a.opts.Namespace, a.opts.Scheduler)}
	return f
}
