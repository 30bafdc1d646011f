package diagnose

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/nodelock"
)

// lockedWords are HAMi's words for a bind the node lock refused, in BindingFailed and in
// kube-scheduler's FailedScheduling: "node gpu-1 has been locked within 5m0s".
const lockedWords = "has been locked within"

// lockedNode finds the node in "node <n> has been locked within …".
var lockedNode = regexp.MustCompile(`node ([^\s\[\],:]+) ` + lockedWords)

// kubelet's words for a failed admission.
const (
	reasonAdmission = "UnexpectedAdmissionError"
	msgNoBindingPod = "no binding pod found on node"
	msgNoRequest    = "device request not found"
	msgNoPending    = "no pending device allocation found" // HAMi master's wording of msgNoRequest
	msgNumber       = "device number not matched"
)

// clearAnnotationsFix is the command that removes the filter's and the bind's annotations
// from a pod, so that the extender filters it again.
func clearAnnotationsFix(p *corev1.Pod) string {
	return fmt.Sprintf("kubectl -n %s annotate pod %s hami.io/vgpu-node- hami.io/vgpu-time- hami.io/vgpu-devices-to-allocate- hami.io/vgpu-devices-allocated- hami.io/bind-phase- hami.io/bind-time-    # kube-scheduler retries the Pending pod and HAMi's extender filters it again",
		p.Namespace, p.Name)
}

// unlockFix is the repair verb for the node's stale lock, with a note after the command.
func unlockFix(node, note string) string {
	return fmt.Sprintf("kubectl hami-doctor unlock %s --yes    # %s", node, note)
}

// unlockNote says what the repair verb does.
const unlockNote = "removes the lock only if it is still the one shown here"

// lockRefusal returns the newest BindingFailed or FailedScheduling Event of the pod that says
// the node lock refused the bind, and the node it names.
func (a *podAnalysis) lockRefusal() (*corev1.Event, string) {
	for i := range a.events {
		e := &a.events[i]
		if (e.Reason != eventBindingFailed && e.Reason != eventFailedScheduling) || !strings.Contains(e.Message, lockedWords) {
			continue
		}
		if m := lockedNode.FindStringSubmatch(e.Message); m != nil {
			return e, m[1]
		}
		return e, ""
	}
	return nil, ""
}

// holderFromEvidence looks a lock holder up in the recorded pods; unknown when they could
// not be read.
func (a *podAnalysis) holderFromEvidence(pod types.NamespacedName) (*corev1.Pod, error) {
	if p := a.podByKey(pod.String()); p != nil {
		return p, nil
	}
	for what, err := range a.ev.ReadErrors {
		if strings.HasPrefix(what, "pods") {
			return nil, fmt.Errorf("could not read %s: %w", what, err)
		}
	}
	return nil, nil
}

// lockOn judges the lock on the node as recorded; nil when the node has none or was not read.
func (a *podAnalysis) lockOn(n *corev1.Node) *lockVerdict {
	if n == nil {
		return nil
	}
	return judgeLock(n, a.now, a.opts.LockTimeout, a.holderFromEvidence)
}

// lockEvidence describes a lock and its holder, each line naming its object.
func (a *podAnalysis) lockEvidence(v *lockVerdict) []string {
	s := v.state
	out := []string{fmt.Sprintf("node %s: %s = %q", s.Node, nodelock.Key, s.Value)}
	switch {
	case s.Error != "":
		return append(out, "node "+s.Node+": "+s.Error)
	case s.Holder == "":
		out = append(out, fmt.Sprintf("node %s: the lock was taken %s (%s ago) and names no pod", s.Node, s.Since.Format(time.RFC3339), s.Age.Round(time.Second)))
	default:
		out = append(out, fmt.Sprintf("node %s: the lock was taken by pod %s at %s, %s ago (lock timeout %s)",
			s.Node, s.Holder, s.Since.Format(time.RFC3339), s.Age.Round(time.Second), a.opts.LockTimeout))
	}
	switch {
	case v.holderErr != "":
		out = append(out, fmt.Sprintf("pod %s: not known whether it exists: %s", s.Holder, v.holderErr))
	case s.Holder != "" && !s.HolderExists:
		out = append(out, fmt.Sprintf("pod %s: does not exist", s.Holder))
	case s.HolderExists:
		out = append(out, fmt.Sprintf("pod %s: phase %s, node %q, %s %q", s.Holder, v.holder.Status.Phase, s.HolderNode, allocation.KeyBindPhase, s.HolderBindPhase))
	}
	return out
}

// pluginOn names the device plugin Pod on the node and its image, or the DaemonSet's.
func (a *podAnalysis) pluginOn(node string) (what, image string) {
	for _, p := range a.ev.PluginPods {
		if p.Spec.NodeName == node && len(p.Spec.Containers) > 0 {
			return fmt.Sprintf("Pod %s/%s", p.Namespace, p.Name), p.Spec.Containers[0].Image
		}
	}
	if ds := a.ev.PluginDaemonSet; ds != nil && len(ds.Spec.Template.Spec.Containers) > 0 {
		return fmt.Sprintf("DaemonSet %s/%s", ds.Namespace, ds.Name), ds.Spec.Template.Spec.Containers[0].Image
	}
	return "", ""
}

// checkLock (P4) reads the node lock on the pod's node and says whether it stops the pod.
func (a *podAnalysis) checkLock() {
	refusal, named := a.lockRefusal()
	node := a.r.AssignedNode
	switch {
	case node == "":
		node = named
	case named != "" && named != node:
		refusal = nil // about a node the filter chose before
	}
	if node == "" {
		return
	}
	var refusedLine string
	if refusal != nil {
		refusedLine = fmt.Sprintf("event %s (%s, %s ago): %s", refusal.Reason, eventTime(*refusal).Format(time.RFC3339),
			a.now.Sub(eventTime(*refusal)).Round(time.Second), trim(refusal.Message, 300))
	}
	n := a.node(node)
	if n == nil {
		if refusal != nil {
			a.add(Finding{Case: P4NodeLocked, Severity: SeverityInfo, Code: CodePodNotChecked,
				Summary:  fmt.Sprintf("the node lock refused the bind to node %s, but the node was not read: its lock is not checked", node),
				Evidence: []string{refusedLine}})
		}
		return
	}
	v := a.lockOn(n)
	if v == nil {
		if refusal != nil {
			a.add(Finding{Case: P4NodeLocked, Severity: SeverityInfo, Code: CodePodWaiting,
				Summary:  fmt.Sprintf("the node lock refused the bind to node %s earlier, and the node is unlocked now: kube-scheduler retries the bind", node),
				Evidence: []string{refusedLine, fmt.Sprintf("node %s: no %s", node, nodelock.Key)}})
		}
		return
	}
	s := v.state
	a.r.Lock = s
	ev := a.lockEvidence(v)
	if refusedLine != "" {
		ev = append([]string{refusedLine}, ev...)
	}
	if s.Holder == a.pod.Namespace+"/"+a.pod.Name {
		a.add(Finding{Case: P4NodeLocked, Severity: SeverityInfo, Code: CodePodWaiting,
			Summary:  fmt.Sprintf("node %s is locked for this pod itself (its bind is under way)", node),
			Evidence: ev})
		return
	}
	if s.Stale == "" {
		a.lockLive(v, ev)
		return
	}
	a.add(Finding{Case: P4NodeLocked, Severity: SeverityError, Code: CodeNodeLocked,
		Summary:  fmt.Sprintf("node %s is locked by %s: HAMi's scheduler refuses to bind this pod there (\"node %s has been locked within %s\")", node, lockHolder(s), node, a.opts.LockTimeout),
		Evidence: ev, Fix: []string{unlockFix(node, unlockNote)}})
	if v.neverReleased {
		a.lockNeverReleased(v)
		return
	}
	a.add(Finding{Case: P4NodeLocked, Severity: SeverityError, Code: CodeLockStale,
		Summary:  fmt.Sprintf("the lock on node %s is stale: %s", node, s.Stale),
		Evidence: []string{fmt.Sprintf("node %s: %s", node, s.Stale)},
		Fix:      a.staleFix(s)})
}

// lockHolder names who holds a lock, for sentences.
func lockHolder(s *LockState) string {
	switch {
	case s.Error != "":
		return "an unreadable value"
	case s.Holder == "":
		return "a lock that names no pod"
	}
	return "pod " + s.Holder
}

// lockLive explains a lock held by a live pod within the timeout: the pod waits for it.
func (a *podAnalysis) lockLive(v *lockVerdict, ev []string) {
	s := v.state
	f := Finding{Case: P4NodeLocked, Severity: SeverityInfo, Code: CodePodWaiting,
		Summary: fmt.Sprintf("waiting for the node lock on %s, held by pod %s for %s: it is released after that pod's Allocate, or taken over once older than %s (at %s)",
			s.Node, s.Holder, s.Age.Round(time.Second), a.opts.LockTimeout, s.Since.Add(a.opts.LockTimeout).Format(time.RFC3339)),
		Evidence: ev}
	if v.holderErr != "" {
		f.Summary = fmt.Sprintf("node %s is locked by pod %s for %s; whether that pod still exists could not be read", s.Node, s.Holder, s.Age.Round(time.Second))
	}
	if h := v.holder; h != nil {
		if t, ok := unixAnnotation(h, allocation.KeyBindTime); ok && a.now.Sub(t) > a.opts.AllocateWait {
			ns, name, _ := strings.Cut(s.Holder, "/")
			f.Evidence = append(f.Evidence, fmt.Sprintf("pod %s: bound %s ago and still %q: its Allocate is late", s.Holder, a.now.Sub(t).Round(time.Second), s.HolderBindPhase))
			f.Fix = append(f.Fix, fmt.Sprintf("kubectl hami-doctor pod %s/%s    # why the holder's Allocate does not come", ns, name))
		}
	}
	a.add(f)
}

// lockNeverReleased explains a lock the node's device plugin keeps (HAMi §8.1, #1130).
func (a *podAnalysis) lockNeverReleased(v *lockVerdict) {
	s := v.state
	what, image := a.pluginOn(s.Node)
	ev := []string{fmt.Sprintf("node %s: %s", s.Node, s.Stale)}
	fix := []string{unlockFix(s.Node, "unblocks this pod; the plugin keeps the next pod's lock again")}
	if what != "" {
		ev = append(ev, fmt.Sprintf("node %s: the device plugin is %s, image %s", s.Node, what, image))
	}
	if ds := a.ev.PluginDaemonSet; ds != nil {
		fix = append(fix, fmt.Sprintf("kubectl -n %s edit daemonset %s    # replace image %s by HAMi's device plugin or one that implements HAMi's allocation protocol (consume hami.io/vgpu-devices-to-allocate, set bind-phase, release the lock)",
			ds.Namespace, ds.Name, image))
	} else {
		fix = append(fix, fmt.Sprintf("replace the device plugin of node %s (%s) by HAMi's or one that implements HAMi's allocation protocol", s.Node, cmp.Or(what, "not found")))
	}
	a.add(Finding{Case: P4NodeLocked, Severity: SeverityError, Code: CodeLockNeverReleased,
		Summary: fmt.Sprintf("node %s's device plugin never releases the node lock: HAMi's scheduler then binds one GPU pod per node per %s (#1130)",
			s.Node, a.opts.LockTimeout),
		Evidence: ev, Fix: fix})
}

// staleFix is the repair of a stale lock, with what HAMi's scheduler would need by hand.
func (a *podAnalysis) staleFix(s *LockState) []string {
	fix := []string{unlockFix(s.Node, unlockNote)}
	switch {
	case s.Error != "":
		fix = append(fix, fmt.Sprintf("or by hand: kubectl annotate node %s %s-    # HAMi's scheduler never takes an unreadable value over", s.Node, nodelock.Key))
	case s.Holder != "" && !s.HolderExists:
		fix = append(fix, "or nothing: HAMi's scheduler takes over a lock whose pod is gone at the next bind, which kube-scheduler retries")
	case s.Holder != "" && !s.Expired:
		ns, name, _ := strings.Cut(s.Holder, "/")
		fix = append(fix,
			fmt.Sprintf("or, if pod %s may go: kubectl -n %s delete pod %s    # HAMi's scheduler takes over the lock of a pod that is gone", s.Holder, ns, name),
			fmt.Sprintf("or wait until %s: HAMi's scheduler takes over a lock older than %s", s.Since.Add(a.opts.LockTimeout).Format(time.RFC3339), a.opts.LockTimeout))
	case !s.Expired:
		fix = append(fix, fmt.Sprintf("or wait until %s: HAMi's scheduler takes over a lock older than %s", s.Since.Add(a.opts.LockTimeout).Format(time.RFC3339), a.opts.LockTimeout))
	default:
		fix = append(fix, "or nothing: the lock expired, HAMi's scheduler takes it over at the next bind, which kube-scheduler retries")
	}
	return fix
}

// unixAnnotation reads an annotation in Unix seconds.
func unixAnnotation(p *corev1.Pod, key string) (time.Time, bool) {
	v, ok := p.Annotations[key]
	if !ok {
		return time.Time{}, false
	}
	sec, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(sec, 0).UTC(), true
}

// readyCondition returns the node's Ready condition, nil when it has none.
func readyCondition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// readyEvidence describes the node's Ready condition.
func readyEvidence(n *corev1.Node) string {
	c := readyCondition(n)
	if c == nil {
		return fmt.Sprintf("node %s: no Ready condition (its kubelet has never posted status)", n.Name)
	}
	line := fmt.Sprintf("node %s: Ready=%s since %s", n.Name, c.Status, c.LastTransitionTime.UTC().Format(time.RFC3339))
	if c.LastTransitionTime.IsZero() {
		line = fmt.Sprintf("node %s: Ready=%s (no lastTransitionTime)", n.Name, c.Status)
	}
	if c.Reason != "" {
		line += " (" + c.Reason + ")"
	}
	return line
}

// checkAllocateWait (P5) explains a bound pod whose Allocate did not come.
func (a *podAnalysis) checkAllocateWait() {
	p, node := a.pod, a.pod.Spec.NodeName
	n := a.node(node)
	lock := a.lockOn(n)
	if lock != nil {
		a.r.Lock = lock.state
	}
	bound, ok := unixAnnotation(p, allocation.KeyBindTime)
	what := allocation.KeyBindTime
	if !ok {
		if e := a.lastEvent(eventBindingSucceed); e != nil {
			bound, ok, what = eventTime(*e), true, "event "+eventBindingSucceed
		}
	}
	if !ok {
		a.add(Finding{Case: P5AllocateNeverCame, Severity: SeverityInfo, Code: CodePodWaiting,
			Summary:  fmt.Sprintf("bound to node %s and allocating; when it was bound is not known (no %s), so whether the Allocate is late cannot be told", node, allocation.KeyBindTime),
			Evidence: []string{fmt.Sprintf("pod %s/%s: %s %q", p.Namespace, p.Name, allocation.KeyBindPhase, a.r.BindPhase)}})
		return
	}
	age := a.now.Sub(bound)
	if age <= a.opts.AllocateWait {
		a.add(Finding{Case: P5AllocateNeverCame, Severity: SeverityInfo, Code: CodePodWaiting,
			Summary: fmt.Sprintf("bound %s ago; waiting for the kubelet's Allocate", age.Round(time.Second))})
		return
	}
	ev := []string{fmt.Sprintf("pod %s/%s: %s %q, %s %s (%s ago, more than %s)", p.Namespace, p.Name, allocation.KeyBindPhase, a.r.BindPhase,
		what, bound.Format(time.RFC3339), age.Round(time.Second), a.opts.AllocateWait)}
	var fix []string
	if n != nil {
		ev = append(ev, readyEvidence(n))
		if q, ok := n.Status.Allocatable[corev1.ResourceName(a.opts.ResourceName)]; ok {
			ev = append(ev, fmt.Sprintf("node %s: allocatable %s = %s", node, a.opts.ResourceName, q.String()))
		} else {
			ev = append(ev, fmt.Sprintf("node %s: no allocatable %s (the device plugin has not registered with the kubelet)", node, a.opts.ResourceName))
		}
		if lock != nil {
			ev = append(ev, a.lockEvidence(lock)...)
		} else {
			ev = append(ev, fmt.Sprintf("node %s: no %s", node, nodelock.Key))
		}
	} else {
		ev = append(ev, fmt.Sprintf("node %s: not read", node))
	}
	if rep := a.nodeReport(node); rep != nil {
		a.r.Nodes = []Report{*rep}
		ev = append(ev, fmt.Sprintf("node %s: node diagnosis %s: %s", node, rep.Case.Describe(), rep.Reason))
		for _, f := range rep.Errors() {
			fix = append(fix, f.Fix...)
		}
	}
	fix = append(fix, "the kubelet retries the pod's admission once the plugin registers: nothing to do with the pod itself")
	a.add(Finding{Case: P5AllocateNeverCame, Severity: SeverityError, Code: CodeAllocateLate,
		Summary: fmt.Sprintf("bound to node %s %s ago, but the device plugin's Allocate never came: the kubelet does not admit the pod's containers",
			node, age.Round(time.Second)),
		Evidence: ev, Fix: fix})
}

// admissionError returns the error the kubelet or the plugin gave for a failed allocation:
// the part after "desc = " of the kubelet's message, or a Warning Event's.
func (a *podAnalysis) admissionError() (text, source string) {
	p := a.pod
	if p.Status.Reason == reasonAdmission || strings.Contains(p.Status.Message, "Allocate failed") {
		return afterDesc(p.Status.Message), fmt.Sprintf("pod %s/%s: status.reason %s: %s", p.Namespace, p.Name, p.Status.Reason, trim(p.Status.Message, 300))
	}
	for _, e := range a.events {
		if e.Type == corev1.EventTypeWarning && (e.Reason == reasonAdmission || strings.Contains(e.Message, "Allocate failed")) {
			return afterDesc(e.Message), fmt.Sprintf("event %s: %s", e.Reason, trim(e.Message, 300))
		}
	}
	return "", ""
}

// afterDesc returns the gRPC description of the kubelet's "Allocate failed due to rpc error:
// code = … desc = <error>, which is unexpected".
func afterDesc(msg string) string {
	if _, desc, ok := strings.Cut(msg, "desc = "); ok {
		msg = desc
	}
	return strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(msg), ", which is unexpected"))
}

// pluginWarnings quotes the Warning Events on the pod besides the scheduler's and the
// admission's own.
func (a *podAnalysis) pluginWarnings() []string {
	var out []string
	for _, e := range a.events {
		if e.Type != corev1.EventTypeWarning || slices.Contains([]string{eventFilteringFailed, eventBindingFailed, eventFailedScheduling, reasonAdmission}, e.Reason) {
			continue
		}
		src := e.Source.Component
		if src == "" {
			src = e.ReportingController
		}
		out = append(out, fmt.Sprintf("event Warning %s from %q: %s", e.Reason, src, trim(e.Message, 300)))
	}
	return out
}

// checkAdmission (P6) explains a pod the kubelet failed at admission.
func (a *podAnalysis) checkAdmission() {
	p := a.pod
	text, source := a.admissionError()
	failedPhase := a.r.BindPhase == string(allocation.PhaseFailed)
	if text == "" && !failedPhase {
		if p.Status.Phase == corev1.PodFailed {
			a.add(Finding{Case: P6AllocateFailed, Severity: SeverityInfo, Code: CodePodWaiting,
				Summary:  fmt.Sprintf("the pod failed (%s), not at the admission of its devices: not a HAMi problem", cmp.Or(p.Status.Reason, "no reason given")),
				Evidence: []string{fmt.Sprintf("pod %s/%s: phase Failed, reason %q: %s", p.Namespace, p.Name, p.Status.Reason, trim(p.Status.Message, 300))}})
		}
		return
	}
	var ev []string
	if source != "" {
		ev = append(ev, source)
	}
	if failedPhase {
		ev = append(ev, fmt.Sprintf("pod %s/%s: %s failed (the device plugin's Allocate failed)", p.Namespace, p.Name, allocation.KeyBindPhase))
	}
	f := Finding{Case: P6AllocateFailed, Severity: SeverityError, Fix: []string{recreateFix(p, "")}}
	switch {
	case strings.Contains(text, msgNoBindingPod):
		f.Code = CodeNoBindingPod
		f.Summary, ev = a.noBindingPod(text, ev)
	case strings.Contains(text, msgNoRequest) || strings.Contains(text, msgNoPending):
		f.Code = CodeRequestNotFound
		f.Summary, ev = a.requestNotFound(ev)
	case strings.Contains(text, msgNumber):
		f.Code = CodeNumberMismatch
		f.Summary, ev = a.numberMismatch(ev)
	case text == "":
		f.Code = CodeAllocateFailed
		f.Summary = "the device plugin's Allocate failed (bind-phase failed); its error is not recorded on the pod"
	default:
		f.Code = CodeAllocateFailed
		f.Summary = fmt.Sprintf("the device plugin's Allocate failed: %s", trim(text, 200))
	}
	f.Summary += "; a failed admission is never retried: create the pod again"
	ev = append(ev, a.pluginWarnings()...)
	f.Evidence = ev
	if f.Code == CodeNoBindingPod && slices.ContainsFunc(a.r.Findings, func(x Finding) bool {
		return x.Severity == SeverityError && x.Case == P1NotRoutedToHAMi
	}) {
		f.Severity, f.Fix = SeverityInfo, nil // P1 says why and how to fix it
	}
	a.add(f)
}

// noBindingPod explains "no binding pod found on node": the plugin found neither a lock nor a
// pending pod bound by HAMi on its node.
func (a *podAnalysis) noBindingPod(text string, ev []string) (string, []string) {
	p := a.pod
	node := cmp.Or(p.Spec.NodeName, a.r.AssignedNode)
	if !hasHAMiAnnotations(p) {
		return fmt.Sprintf("the device plugin on node %s found no pod bound by HAMi's scheduler (%q): this pod never went through HAMi's scheduler (P1)", node, text),
			append(ev, fmt.Sprintf("pod %s/%s: no %s and no %s: HAMi's scheduler did not place it (schedulerName %q)", p.Namespace, p.Name, allocation.KeyNode, allocation.KeyBindPhase, p.Spec.SchedulerName))
	}
	if n := a.node(node); n != nil {
		if v := a.lockOn(n); v != nil {
			a.r.Lock = v.state
			ev = append(ev, a.lockEvidence(v)...)
		} else {
			ev = append(ev, fmt.Sprintf("node %s: no %s now", node, nodelock.Key))
		}
	}
	if t, ok := unixAnnotation(p, allocation.KeyBindTime); ok {
		ev = append(ev, fmt.Sprintf("pod %s/%s: %s %s (%s ago)", p.Namespace, p.Name, allocation.KeyBindTime, t.Format(time.RFC3339), a.now.Sub(t).Round(time.Second)))
	}
	var pending []string
	for _, o := range a.ev.Pods {
		phase := allocation.BindPhase(o.Annotations[allocation.KeyBindPhase])
		if o.Spec.NodeName == node && o.Status.Phase == corev1.PodPending && o.Annotations[allocation.KeyNode] == node &&
			(phase == allocation.PhaseAllocating || phase == allocation.PhaseSuccess) && (o.Namespace != p.Namespace || o.Name != p.Name) {
			pending = append(pending, o.Namespace+"/"+o.Name)
		}
	}
	if len(pending) > 0 {
		ev = append(ev, fmt.Sprintf("node %s: pending HAMi pods now: %s", node, strings.Join(pending, ", ")))
	} else {
		ev = append(ev, fmt.Sprintf("node %s: no other Pending pod bound by HAMi now", node))
	}
	return fmt.Sprintf("the device plugin on node %s found no lock and no pending HAMi pod (%q): the node lock was gone (expired after %s, or taken over) before the kubelet's Allocate",
		node, text, a.opts.LockTimeout), ev
}

// toAllocate decodes the pod's hami.io/vgpu-devices-to-allocate.
func (a *podAnalysis) toAllocate() (value string, present bool, pd allocation.PodDevices, err error) {
	key := a.opts.Vendor.ToAllocateKey
	value, present = a.pod.Annotations[key]
	if !present {
		return "", false, nil, nil
	}
	pd, err = allocation.DecodePodDevices(value, a.opts.Allocation.Version)
	return value, true, pd, err
}

// requestNotFound explains "device request not found": no entry left to serve.
func (a *podAnalysis) requestNotFound(ev []string) (string, []string) {
	p := a.pod
	key := a.opts.Vendor.ToAllocateKey
	value, present, pd, err := a.toAllocate()
	allocated := p.Annotations[a.opts.Vendor.AllocatedKey]
	switch {
	case !present:
		return fmt.Sprintf("the device plugin found no device entry to serve: %s is missing", key),
			append(ev, fmt.Sprintf("pod %s/%s: no %s", p.Namespace, p.Name, key))
	case err != nil:
		return fmt.Sprintf("the device plugin found no device entry to serve: %s does not decode", key),
			append(ev, fmt.Sprintf("pod %s/%s: %s = %q: %v", p.Namespace, p.Name, key, value, err))
	}
	ev = append(ev, fmt.Sprintf("pod %s/%s: %s = %q, %s = %q", p.Namespace, p.Name, key, value, a.opts.Vendor.AllocatedKey, allocated))
	if _, ok := pd.Next(); !ok && allocated != "" && allocated != value {
		return fmt.Sprintf("the device plugin found no device entry to serve: every entry of %s was consumed, while the pod's containers did not all get theirs: another pod's Allocate consumed them (a node lock naming another pod, #781/#3076)", key), ev
	}
	return fmt.Sprintf("the device plugin found no device entry to serve in %s (no container entry with devices)", key), ev
}

// numberMismatch explains "device number not matched": the kubelet asked for another count
// than the container's entry has.
func (a *podAnalysis) numberMismatch(ev []string) (string, []string) {
	p := a.pod
	key := a.opts.Vendor.ToAllocateKey
	value, _, pd, err := a.toAllocate()
	i, ok := pd.Next()
	if err != nil || !ok {
		return fmt.Sprintf("the kubelet asked for another number of devices than the pod's entry in %s has", key),
			append(ev, fmt.Sprintf("pod %s/%s: %s = %q", p.Namespace, p.Name, key, value))
	}
	name, limit := a.containerName(i), "none"
	if c, found := allocation.ContainerAt(p, i); found {
		if q, has := c.Resources.Limits[corev1.ResourceName(a.opts.Allocation.ResourceCount)]; has {
			limit = q.String()
		}
	}
	var uuids []string
	for _, d := range pd[i] {
		uuids = append(uuids, d.UUID)
	}
	ev = append(ev,
		fmt.Sprintf("pod %s/%s: container %s has limit %s: %s (the kubelet's device count)", p.Namespace, p.Name, name, a.opts.Allocation.ResourceCount, limit),
		fmt.Sprintf("pod %s/%s: %s entry %d (container %s) has %d device(s): %s", p.Namespace, p.Name, key, i, name, len(pd[i]), strings.Join(uuids, ", ")))
	return fmt.Sprintf("the kubelet asked for %s device(s) for container %s, but its entry in %s has %d: the annotation does not match the pod's limits (edited, or written for another pod spec, #710)",
		limit, name, key, len(pd[i])), ev
}

// checkStaleAssignment (P7) explains a filtered pod that was never bound.
func (a *podAnalysis) checkStaleAssignment() {
	p, node := a.pod, a.r.AssignedNode
	if node == "" || p.Spec.NodeName != "" {
		return
	}
	if slices.ContainsFunc(a.r.Findings, func(f Finding) bool { return f.Case == P4NodeLocked && f.Severity == SeverityError }) {
		return
	}
	phase := allocation.BindPhase(a.r.BindPhase)
	if phase != "" && phase != allocation.PhaseAllocating {
		return
	}
	filtered, ok := unixAnnotation(p, allocation.KeyTime)
	if !ok {
		return
	}
	age := a.now.Sub(filtered)
	ev := []string{fmt.Sprintf("pod %s/%s: %s %s, %s %s (%s ago), no spec.nodeName", p.Namespace, p.Name, allocation.KeyNode, node,
		allocation.KeyTime, filtered.Format(time.RFC3339), age.Round(time.Second))}
	latest := filtered
	if t, ok := unixAnnotation(p, allocation.KeyBindTime); ok {
		ev = append(ev, fmt.Sprintf("pod %s/%s: %s %q, %s %s (%s ago)", p.Namespace, p.Name, allocation.KeyBindPhase, a.r.BindPhase,
			allocation.KeyBindTime, t.Format(time.RFC3339), a.now.Sub(t).Round(time.Second)))
		if t.After(latest) {
			latest = t
		}
	}
	fix := []string{recreateFix(p, ""), "or keep the pod: " + clearAnnotationsFix(p)}
	n := a.node(node)
	if n == nil {
		if _, unread := a.ev.ReadErrors["nodes"]; unread {
			return
		}
		a.add(Finding{Case: P7StaleAssignment, Severity: SeverityError, Code: CodeStaleAssignment,
			Summary:  fmt.Sprintf("HAMi's annotations assign the pod to node %s, which no longer exists; it was never bound, and HAMi's extender still counts the assignment", node),
			Evidence: append(ev, fmt.Sprintf("node %s: not found", node)), Fix: fix})
		return
	}
	ev = append(ev, readyEvidence(n))
	if v := a.lockOn(n); v == nil {
		ev = append(ev, fmt.Sprintf("node %s: no %s", node, nodelock.Key))
	}
	if c := readyCondition(n); c != nil && c.LastTransitionTime.After(filtered) {
		a.add(Finding{Case: P7StaleAssignment, Severity: SeverityError, Code: CodeNodeRestarted,
			Summary: fmt.Sprintf("node %s changed its Ready condition (restarted) %s after HAMi's filter assigned the pod to it; the pod was never bound and stays Pending while its annotations stand (#812, #1557)",
				node, c.LastTransitionTime.Sub(filtered).Round(time.Second)),
			Evidence: ev, Fix: fix})
		return
	}
	if a.now.Sub(latest) <= a.opts.AllocateWait {
		a.add(Finding{Case: P7StaleAssignment, Severity: SeverityInfo, Code: CodePodWaiting,
			Summary: fmt.Sprintf("filtered to node %s %s ago; waiting for the bind", node, age.Round(time.Second))})
		return
	}
	a.add(Finding{Case: P7StaleAssignment, Severity: SeverityError, Code: CodeStaleAssignment,
		Summary: fmt.Sprintf("HAMi's filter assigned the pod to node %s %s ago, but it was never bound; HAMi's extender still counts the assignment",
			node, age.Round(time.Second)),
		Evidence: ev, Fix: fix})
}
