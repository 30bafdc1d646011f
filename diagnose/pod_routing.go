package diagnose

import (
	"cmp"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/hamireg/hamireg/allocation"
)

// HAMi's Event reasons on pods (package extender records the same; diagnose does not import it).
const (
	eventFilteringSucceed = "FilteringSucceed"
	eventFilteringFailed  = "FilteringFailed"
	eventBindingSucceed   = "BindingSucceed"
	eventBindingFailed    = "BindingFailed"
	eventFailedScheduling = "FailedScheduling"
)

// Other words the routing checks read.
const (
	// eventScheduled is the Event a scheduler records when it binds a pod.
	eventScheduled = "Scheduled"
	// defaultSchedulerName is kube-scheduler's own profile, which HAMi's webhook rewrites.
	defaultSchedulerName = "default-scheduler"
	// webhookHookName is the webhook's name in HAMi's MutatingWebhookConfiguration.
	webhookHookName = "vgpu.hami.io"
	// webhookPath is the path HAMi's webhook serves on the scheduler Service.
	webhookPath = "/webhook"
	// labelWebhookIgnore is the label both of the webhook's selectors exclude.
	labelWebhookIgnore = "hami.io/webhook"
	// envDisableControl turns HAMi-core's limits off inside a container.
	envDisableControl = "CUDA_DISABLE_CONTROL"
	// noBindingPod is the device plugin's Allocate error for a pod HAMi never bound.
	noBindingPod = "no binding pod found on node"
	// eventTTL is how long the API server keeps Events by default (--event-ttl).
	eventTTL = time.Hour
)

// checkRouting (P1) explains why the pod is not scheduled by HAMi's scheduler.
func (a *podAnalysis) checkRouting() {
	p := a.pod
	name := cmp.Or(p.Spec.SchedulerName, defaultSchedulerName)
	f := Finding{Case: P1NotRoutedToHAMi, Severity: SeverityError, Code: CodeOtherScheduler,
		Evidence: []string{fmt.Sprintf("pod %s/%s: spec.schedulerName %q (HAMi's is %q)", p.Namespace, p.Name, name, a.opts.SchedulerName)},
		Fix:      []string{recreateFix(p, fmt.Sprintf(".spec.schedulerName=%q", a.opts.SchedulerName))}}
	f.Summary = fmt.Sprintf("pod %s/%s is not scheduled by HAMi's scheduler: spec.schedulerName is %q, not %q", p.Namespace, p.Name, name, a.opts.SchedulerName)
	for _, e := range a.eventsWith(eventFailedScheduling) {
		if src := eventSource(e); src != a.opts.SchedulerName {
			f.Evidence = append(f.Evidence, fmt.Sprintf("pod %s/%s: Event FailedScheduling from %s: \"%s\"", p.Namespace, p.Name, cmp.Or(src, "a scheduler"), e.Message))
			break
		}
	}
	if msg, ok := a.noBindingPodFailure(); ok {
		f.Summary = fmt.Sprintf("pod %s/%s failed with UnexpectedAdmissionError %q because it never went through HAMi's scheduler (spec.schedulerName %q, no HAMi annotations): HAMi's device plugin finds no binding pod for it (P1, HAMi #653, #710)",
			p.Namespace, p.Name, noBindingPod, name)
		f.Evidence = append(f.Evidence, fmt.Sprintf("pod %s/%s: %s", p.Namespace, p.Name, msg),
			fmt.Sprintf("pod %s/%s: no %s or %s annotation", p.Namespace, p.Name, allocation.KeyNode, allocation.KeyBindPhase))
	}
	var causes []Finding
	if name != defaultSchedulerName {
		f.Summary += fmt.Sprintf("; the pod names scheduler %q itself, and HAMi's webhook leaves such a pod unchanged", name)
	} else {
		causes = a.webhookCauses()
		if a.readError("mutatingwebhookconfigurations") == nil && !slices.ContainsFunc(causes, func(c Finding) bool { return c.Severity == SeverityError }) {
			f.Summary += "; HAMi's webhook would route it now: the pod was created before the webhook was installed, or while it was unreachable"
		}
	}
	causes = append(causes, a.placementCauses()...)
	a.add(f)
	for _, c := range causes {
		a.add(c)
	}
}

// eventSource names who recorded an Event.
func eventSource(e corev1.Event) string { return cmp.Or(e.Source.Component, e.ReportingController) }

// noBindingPodFailure returns the kubelet's admission failure "no binding pod found on node",
// from the pod's status or its Events.
func (a *podAnalysis) noBindingPodFailure() (string, bool) {
	p := a.pod
	if strings.Contains(p.Status.Message, noBindingPod) {
		return fmt.Sprintf("status.reason %s, status.message \"%s\"", p.Status.Reason, p.Status.Message), true
	}
	for _, e := range a.events {
		if strings.Contains(e.Message, noBindingPod) {
			return fmt.Sprintf("Event %s from %s: \"%s\"", e.Reason, cmp.Or(eventSource(e), "the kubelet"), e.Message), true
		}
	}
	return "", false
}

// hamiHook is HAMi's webhook found in the MutatingWebhookConfigurations.
type hamiHook struct {
	config string
	hook   *admissionregistrationv1.MutatingWebhook
}

// hamiHooks finds HAMi's webhook: the configuration named Options.Webhook, a webhook named
// vgpu.hami.io, or one calling path /webhook of the scheduler Service.
func (a *podAnalysis) hamiHooks() []hamiHook {
	var out []hamiHook
	for i := range a.ev.Webhooks {
		w := &a.ev.Webhooks[i]
		var mine []hamiHook
		for j := range w.Webhooks {
			h := &w.Webhooks[j]
			svc := h.ClientConfig.Service
			callsScheduler := svc != nil && svc.Name == a.opts.Scheduler && svc.Namespace == a.opts.Namespace &&
				(svc.Path == nil || *svc.Path == webhookPath)
			if h.Name == webhookHookName || callsScheduler {
				mine = append(mine, hamiHook{config: w.Name, hook: h})
			}
		}
		if len(mine) == 0 && w.Name == a.opts.Webhook {
			for j := range w.Webhooks {
				mine = append(mine, hamiHook{config: w.Name, hook: &w.Webhooks[j]})
			}
		}
		out = append(out, mine...)
	}
	return out
}

// helmFix is the Helm hint that installs HAMi's webhook again.
func (a *podAnalysis) helmFix() string {
	return fmt.Sprintf("helm upgrade hami hami-charts/hami -n %s --reuse-values    # the chart installs the MutatingWebhookConfiguration %s", a.opts.Namespace, a.opts.Webhook)
}

// webhookFix lists the commands that bring the endpoints of HAMi's webhook back.
func (a *podAnalysis) webhookFix() []string {
	o := a.opts
	return []string{
		fmt.Sprintf("kubectl -n %s get endpointslices -l %s=%s", o.Namespace, discoveryv1.LabelServiceName, o.Scheduler),
		fmt.Sprintf("kubectl -n %s rollout restart deployment %s", o.Namespace, o.Scheduler),
		a.helmFix(),
	}
}

// webhookCauses says why HAMi's webhook did not set the pod's schedulerName.
func (a *podAnalysis) webhookCauses() []Finding {
	p := a.pod
	recreate := recreateFix(p, fmt.Sprintf(".spec.schedulerName=%q", a.opts.SchedulerName))
	hooks := a.hamiHooks()
	if len(hooks) == 0 {
		if err := a.readError("mutatingwebhookconfigurations"); err != nil {
			return nil // the read error is a NotChecked finding already
		}
		var names []string
		for _, w := range a.ev.Webhooks {
			names = append(names, w.Name)
		}
		return []Finding{{Case: P1NotRoutedToHAMi, Severity: SeverityError, Code: CodeWebhookMissing,
			Summary: fmt.Sprintf("HAMi's admission webhook is not installed: no MutatingWebhookConfiguration %s and no webhook %s, so nothing sets spec.schedulerName %q on GPU pods", a.opts.Webhook, webhookHookName, a.opts.SchedulerName),
			Evidence: []string{fmt.Sprintf("mutatingwebhookconfigurations: %s (none is %s, none has webhook %s or calls Service %s/%s path %s)",
				cmp.Or(strings.Join(names, ", "), "none"), a.opts.Webhook, webhookHookName, a.opts.Namespace, a.opts.Scheduler, webhookPath)},
			Fix: []string{a.helmFix(), recreate}}}
	}
	var out []Finding
	for _, h := range hooks {
		out = append(out, a.hookCauses(h, recreate)...)
	}
	return out
}

// hookCauses checks one webhook against the pod: rules, selectors and endpoints.
func (a *podAnalysis) hookCauses(h hamiHook, recreate string) []Finding {
	p := a.pod
	var out []Finding
	obj := fmt.Sprintf("mutatingwebhookconfiguration %s webhook %s", h.config, h.hook.Name)
	if !hookCreatesPods(h.hook.Rules) {
		out = append(out, Finding{Case: P1NotRoutedToHAMi, Severity: SeverityError, Code: CodeWebhookExcludes,
			Summary:  fmt.Sprintf("HAMi's webhook %s does not handle CREATE of pods: its rules leave pod %s/%s out", h.hook.Name, p.Namespace, p.Name),
			Evidence: []string{fmt.Sprintf("%s: rules %s", obj, rulesString(h.hook.Rules))},
			Fix:      []string{a.helmFix(), recreate}})
	}
	if f, ok := a.selectorCause(h, obj, "namespaceSelector", h.hook.NamespaceSelector, a.namespaceLabels(), recreate); ok {
		out = append(out, f)
	}
	if f, ok := a.selectorCause(h, obj, "objectSelector", h.hook.ObjectSelector, p.Labels, recreate); ok {
		out = append(out, f)
	}
	if f, ok := a.endpointCause(h, obj, recreate); ok {
		out = append(out, f)
	}
	return out
}

// hookCreatesPods reports whether the rules send CREATE of pods to the webhook.
func hookCreatesPods(rules []admissionregistrationv1.RuleWithOperations) bool {
	for _, r := range rules {
		ops := slices.ContainsFunc(r.Operations, func(o admissionregistrationv1.OperationType) bool {
			return o == admissionregistrationv1.Create || o == admissionregistrationv1.OperationAll
		})
		res := slices.ContainsFunc(r.Resources, func(s string) bool { return s == "pods" || s == "*" })
		if ops && res {
			return true
		}
	}
	return false
}

// rulesString renders webhook rules as "CREATE pods; UPDATE deployments".
func rulesString(rules []admissionregistrationv1.RuleWithOperations) string {
	var parts []string
	for _, r := range rules {
		var ops []string
		for _, o := range r.Operations {
			ops = append(ops, string(o))
		}
		parts = append(parts, strings.Join(ops, ",")+" "+strings.Join(r.Resources, ","))
	}
	return cmp.Or(strings.Join(parts, "; "), "none")
}

// namespaceLabels are the labels of the pod's namespace, nil when it was not read.
func (a *podAnalysis) namespaceLabels() map[string]string {
	if a.ev.Namespace == nil {
		return nil
	}
	return a.ev.Namespace.Labels
}

// selectorCause evaluates one of the webhook's label selectors on the namespace's or the
// pod's labels.
func (a *podAnalysis) selectorCause(h hamiHook, obj, field string, sel *metav1.LabelSelector, set map[string]string, recreate string) (Finding, bool) {
	p := a.pod
	if sel == nil {
		return Finding{}, false
	}
	target := fmt.Sprintf("pod %s/%s", p.Namespace, p.Name)
	if field == "namespaceSelector" {
		if a.ev.Namespace == nil {
			return Finding{}, false // not read: a NotChecked finding says so
		}
		target = "namespace " + p.Namespace
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return Finding{Case: P1NotRoutedToHAMi, Severity: SeverityWarning, Code: CodePodNotChecked,
			Summary:  fmt.Sprintf("the %s of HAMi's webhook %s cannot be evaluated", field, h.hook.Name),
			Evidence: []string{fmt.Sprintf("%s: %s: %v", obj, field, err)}}, true
	}
	if s.Matches(labels.Set(set)) {
		return Finding{}, false
	}
	ev := []string{
		fmt.Sprintf("%s: %s %s", obj, field, s.String()),
		fmt.Sprintf("%s: labels %s", target, cmp.Or(labels.Set(set).String(), "none")),
	}
	if set[labelWebhookIgnore] == "ignore" {
		fix := []string{recreateFix(p, fmt.Sprintf(".spec.schedulerName=%q | del(.metadata.labels[%q])", a.opts.SchedulerName, labelWebhookIgnore))}
		if field == "namespaceSelector" {
			fix = []string{fmt.Sprintf("kubectl label namespace %s %s-", p.Namespace, labelWebhookIgnore), recreate}
		}
		return Finding{Case: P1NotRoutedToHAMi, Severity: SeverityError, Code: CodeWebhookIgnoreLabel,
			Summary:  fmt.Sprintf("%s has the label %s=ignore: HAMi's webhook skips it, so the pod keeps its own schedulerName", target, labelWebhookIgnore),
			Evidence: ev, Fix: fix}, true
	}
	var fix []string
	if field == "namespaceSelector" {
		for _, k := range sortedKeys(sel.MatchLabels) {
			if set[k] != sel.MatchLabels[k] {
				fix = append(fix, fmt.Sprintf("kubectl label namespace %s %s=%s --overwrite", p.Namespace, k, sel.MatchLabels[k]))
			}
		}
		if len(fix) == 0 {
			fix = append(fix, fmt.Sprintf("kubectl label namespace %s KEY=VALUE    # so that %s matches %s", p.Namespace, field, s.String()))
		}
		fix = append(fix, recreate)
	} else {
		edits := fmt.Sprintf(".spec.schedulerName=%q", a.opts.SchedulerName)
		for _, k := range sortedKeys(sel.MatchLabels) {
			if set[k] != sel.MatchLabels[k] {
				edits += fmt.Sprintf(" | .metadata.labels[%q]=%q", k, sel.MatchLabels[k])
			}
		}
		fix = append(fix, recreateFix(p, edits)+fmt.Sprintf("    # the pod's labels must match %s %s", field, s.String()))
	}
	return Finding{Case: P1NotRoutedToHAMi, Severity: SeverityError, Code: CodeWebhookExcludes,
		Summary:  fmt.Sprintf("the %s of HAMi's webhook %s does not match %s: the webhook never sees the pod", field, h.hook.Name, target),
		Evidence: ev, Fix: fix}, true
}

// endpointCause says whether the webhook's Service has no ready endpoint.
func (a *podAnalysis) endpointCause(h hamiHook, obj, recreate string) (Finding, bool) {
	svc := h.hook.ClientConfig.Service
	if svc == nil {
		return Finding{}, false // a URL webhook: its endpoints are not in the API
	}
	if a.readError("endpointslices of Service "+svc.Namespace+"/"+svc.Name) != nil {
		return Finding{}, false
	}
	ready, total := 0, 0
	for _, s := range a.ev.EndpointSlices {
		if s.Namespace != svc.Namespace || s.Labels[discoveryv1.LabelServiceName] != svc.Name {
			continue
		}
		for _, e := range s.Endpoints {
			total++
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				ready++
			}
		}
	}
	if ready > 0 {
		return Finding{}, false
	}
	policy := admissionregistrationv1.Fail
	if h.hook.FailurePolicy != nil {
		policy = *h.hook.FailurePolicy
	}
	ev := []string{
		fmt.Sprintf("%s: failurePolicy %s, Service %s/%s", obj, policy, svc.Namespace, svc.Name),
		fmt.Sprintf("endpointslices of Service %s/%s: %d endpoints, none ready", svc.Namespace, svc.Name, total),
	}
	if policy != admissionregistrationv1.Ignore {
		return Finding{Case: P1NotRoutedToHAMi, Severity: SeverityWarning, Code: CodeWebhookNoEndpoints,
			Summary:  fmt.Sprintf("HAMi's webhook Service %s/%s has no ready endpoint: with failurePolicy %s the API server refuses every new pod the webhook handles", svc.Namespace, svc.Name, policy),
			Evidence: ev, Fix: a.webhookFix()}, true
	}
	return Finding{Case: P1NotRoutedToHAMi, Severity: SeverityError, Code: CodeWebhookNoEndpoints,
		Summary:  fmt.Sprintf("HAMi's webhook Service %s/%s has no ready endpoint and failurePolicy is Ignore: the API server admits GPU pods unchanged, with schedulerName %q", svc.Namespace, svc.Name, defaultSchedulerName),
		Evidence: ev, Fix: append(a.webhookFix(), recreate)}, true
}

// placementCauses explains a pod with spec.nodeName that HAMi did not bind: set at creation
// or bound by another scheduler.
func (a *podAnalysis) placementCauses() []Finding {
	p := a.pod
	if p.Spec.NodeName == "" {
		return nil
	}
	recreate := recreateFix(p, fmt.Sprintf(".spec.schedulerName=%q", a.opts.SchedulerName))
	if e := a.lastEvent(eventScheduled); e != nil {
		src := cmp.Or(eventSource(*e), "a scheduler")
		return []Finding{{Case: P1NotRoutedToHAMi, Severity: SeverityError, Code: CodeDefaultScheduled,
			Summary: fmt.Sprintf("pod %s/%s was placed on node %s by %s, not by HAMi's scheduler: it carries no HAMi annotations, so HAMi's device plugin cannot allocate its GPUs", p.Namespace, p.Name, p.Spec.NodeName, src),
			Evidence: []string{fmt.Sprintf("pod %s/%s: Event Scheduled from %s: \"%s\"", p.Namespace, p.Name, src, e.Message),
				fmt.Sprintf("pod %s/%s: spec.nodeName %s", p.Namespace, p.Name, p.Spec.NodeName)},
			Fix: []string{recreate}}}
	}
	if a.readError("events of the pod") != nil {
		return nil
	}
	summary := fmt.Sprintf("pod %s/%s had spec.nodeName %s set at creation: no scheduler bound it (no Scheduled Event), so neither HAMi's webhook route nor its scheduler applies", p.Namespace, p.Name, p.Spec.NodeName)
	if !p.CreationTimestamp.IsZero() && a.now.Sub(p.CreationTimestamp.Time) > eventTTL {
		summary += fmt.Sprintf(" (or its Scheduled Event expired: the pod is %v old and Events live 1 h)", a.now.Sub(p.CreationTimestamp.Time).Round(time.Minute))
	}
	return []Finding{{Case: P1NotRoutedToHAMi, Severity: SeverityError, Code: CodeNodeNameAtCreation, Summary: summary,
		Evidence: []string{fmt.Sprintf("pod %s/%s: spec.nodeName %s, no Scheduled Event among its %d Events", p.Namespace, p.Name, p.Spec.NodeName, len(a.events))},
		Fix:      []string{recreateFix(p, fmt.Sprintf(".spec.schedulerName=%q | del(.spec.nodeName)", a.opts.SchedulerName))}}}
}

// readError returns the read error recorded for the resource (a key of
// PodEvidence.ReadErrors or its prefix), nil when it was read.
func (a *podAnalysis) readError(what string) error {
	for k, err := range a.ev.ReadErrors {
		if k == what || strings.HasPrefix(k, what) {
			return err
		}
	}
	return nil
}

// Words of kube-scheduler's FailedScheduling message when it cannot call the extender.
var (
	extenderWords    = []string{"/filter", "/bind", "extender"}
	unreachableWords = []string{"connection refused", "timeout", "deadline exceeded", "no such host", "eof", "503", "connection reset"}
)

// extenderUnreachable reports whether a kube-scheduler message says the extender cannot be
// called.
func extenderUnreachable(msg string) bool {
	m := strings.ToLower(msg)
	has := func(words []string) bool {
		return slices.ContainsFunc(words, func(w string) bool { return strings.Contains(m, w) })
	}
	return has(extenderWords) && has(unreachableWords)
}

// schedulingEventReasons are the Event reasons that show a scheduler looked at the pod.
var schedulingEventReasons = []string{eventFailedScheduling, eventScheduled, eventFilteringFailed, eventFilteringSucceed, eventBindingFailed, eventBindingSucceed}

// checkScheduler (P2) checks that kube-scheduler can reach the extender.
func (a *podAnalysis) checkScheduler() {
	p, o := a.pod, a.opts
	var failing *corev1.Event
	if e := a.lastEvent(eventFailedScheduling); e != nil && extenderUnreachable(e.Message) && !a.extenderAnsweredAfter(eventTime(*e)) {
		failing = e
	}
	noEvents := a.readError("events of the pod") == nil &&
		!slices.ContainsFunc(a.events, func(e corev1.Event) bool { return slices.Contains(schedulingEventReasons, e.Reason) })

	causes, unhealthy := a.schedulerHealth()
	causes = append(causes, a.extenderURLCauses()...)
	watch := fmt.Sprintf("kubectl -n %s get events --field-selector involvedObject.name=%s -w    # kube-scheduler retries pod %s/%s once the extender answers", p.Namespace, p.Name, p.Namespace, p.Name)
	severity := SeverityWarning
	if failing != nil || (noEvents && unhealthy) {
		severity = SeverityError
	}
	if failing != nil {
		a.add(Finding{Case: P2SchedulerUnreachable, Severity: SeverityError, Code: CodeExtenderUnreachable,
			Summary:  fmt.Sprintf("kube-scheduler cannot call HAMi's extender for pod %s/%s: \"%s\"", p.Namespace, p.Name, failing.Message),
			Evidence: []string{fmt.Sprintf("pod %s/%s: Event FailedScheduling from %s: \"%s\"", p.Namespace, p.Name, cmp.Or(eventSource(*failing), "kube-scheduler"), failing.Message)},
			Fix:      append(a.schedulerFix(), watch)})
	}
	for _, c := range causes {
		if c.Code != CodePodNotChecked {
			c.Severity = severity
			c.Fix = append(c.Fix, watch)
		}
		a.add(c)
	}
	if noEvents && !unhealthy {
		a.add(Finding{Case: Healthy, Severity: SeverityInfo, Code: CodeNoEvents,
			Summary:  fmt.Sprintf("pod %s/%s has no scheduling Event yet while HAMi's scheduler is ready: it was just created, or its Events expired (they live 1 h)", p.Namespace, p.Name),
			Evidence: []string{fmt.Sprintf("pod %s/%s: %d Events, none of %s", p.Namespace, p.Name, len(a.events), strings.Join(schedulingEventReasons, ", "))},
			Fix:      []string{fmt.Sprintf("kubectl -n %s describe pod %s", p.Namespace, p.Name), fmt.Sprintf("kubectl -n %s logs deployment/%s -c kube-scheduler --tail=100", o.Namespace, o.Scheduler)}})
	}
}

// extenderAnsweredAfter reports whether HAMi's extender recorded a filter or bind Event on
// the pod after t: it answered since kube-scheduler failed to call it.
func (a *podAnalysis) extenderAnsweredAfter(t time.Time) bool {
	for _, reason := range []string{eventFilteringFailed, eventFilteringSucceed, eventBindingFailed, eventBindingSucceed} {
		if e := a.lastEvent(reason); e != nil && eventTime(*e).After(t) {
			return true
		}
	}
	return false
}

// schedulerFix are the commands that repair HAMi's scheduler.
func (a *podAnalysis) schedulerFix() []string {
	o := a.opts
	logs := fmt.Sprintf("kubectl -n %s logs deployment/%s -c %s --tail=100", o.Namespace, o.Scheduler, o.ExtenderContainer)
	if leader := a.leaderPod(); leader != nil {
		logs = fmt.Sprintf("kubectl -n %s logs %s -c %s --tail=100    # the leader", o.Namespace, leader.Name, o.ExtenderContainer)
	}
	return []string{
		fmt.Sprintf("kubectl -n %s rollout restart deployment %s", o.Namespace, o.Scheduler),
		fmt.Sprintf("kubectl -n %s get lease %s -o yaml", o.Namespace, o.Lease),
		logs,
	}
}

// leaderPod is the scheduler Pod that holds the Lease, nil when none does.
func (a *podAnalysis) leaderPod() *corev1.Pod {
	l := a.ev.Lease
	if l == nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return nil
	}
	holder := *l.Spec.HolderIdentity
	for i := range a.ev.SchedulerPods {
		sp := &a.ev.SchedulerPods[i]
		if holder == sp.Name || strings.HasPrefix(holder, sp.Name+"_") {
			return sp
		}
	}
	return nil
}

// podReady reports whether the Pod's Ready condition is True.
func podReady(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
}

// podState renders a Pod's phase and the reason its containers wait.
func podState(p *corev1.Pod) string {
	s := fmt.Sprintf("pod %s/%s: phase %s", p.Namespace, p.Name, cmp.Or(string(p.Status.Phase), "unknown"))
	if !podReady(p) {
		s += ", not Ready"
	}
	for _, c := range p.Status.ContainerStatuses {
		if w := c.State.Waiting; w != nil {
			s += fmt.Sprintf(", container %s waiting: %s", c.Name, w.Reason)
		}
	}
	return s
}

// schedulerHealth checks HAMi's scheduler Pods and Lease; unhealthy says kube-scheduler in
// them cannot schedule now.
func (a *podAnalysis) schedulerHealth() (causes []Finding, unhealthy bool) {
	o := a.opts
	deploy := fmt.Sprintf("deployment %s/%s", o.Namespace, o.Scheduler)
	switch {
	case a.readError("scheduler pods") != nil:
	case !slices.ContainsFunc(a.ev.SchedulerPods, func(p corev1.Pod) bool { return podReady(&p) }):
		unhealthy = true
		f := Finding{Case: P2SchedulerUnreachable, Code: CodeSchedulerNotReady, Fix: a.schedulerFix()}
		switch {
		case a.ev.Scheduler != nil:
			f.Evidence = append(f.Evidence, fmt.Sprintf("%s: %d/%d replicas ready", deploy, a.ev.Scheduler.Status.ReadyReplicas, a.ev.Scheduler.Status.Replicas))
		case a.readError("deployment") == nil:
			f.Evidence = append(f.Evidence, deploy+": not found")
			f.Fix = append(f.Fix[:0], fmt.Sprintf("helm upgrade --install hami hami-charts/hami -n %s --reuse-values    # installs %s", o.Namespace, deploy))
		}
		for i := range a.ev.SchedulerPods {
			f.Evidence = append(f.Evidence, podState(&a.ev.SchedulerPods[i]))
		}
		if len(a.ev.SchedulerPods) == 0 {
			f.Evidence = append(f.Evidence, fmt.Sprintf("pods -n %s -l %s: none", o.Namespace, o.SchedulerSelector))
		}
		f.Summary = fmt.Sprintf("no Pod of HAMi's scheduler (%s) is Ready: no kube-scheduler serves schedulerName %q and no extender answers", deploy, o.SchedulerName)
		causes = append(causes, f)
	}
	if f, ok := a.leaseCause(); ok {
		unhealthy = true
		causes = append(causes, f)
	}
	return causes, unhealthy
}

// leaseCause checks the Lease HAMi's kube-scheduler holds: missing, expired, or held by a
// Pod that is gone or not Ready.
func (a *podAnalysis) leaseCause() (Finding, bool) {
	o := a.opts
	if cfg, ok := a.schedulerConfig(); ok && cfg.LeaderElection.LeaderElect != nil && !*cfg.LeaderElection.LeaderElect {
		return Finding{}, false // leader election off: every kube-scheduler schedules
	}
	name := fmt.Sprintf("lease %s/%s", o.Namespace, o.Lease)
	f := Finding{Case: P2SchedulerUnreachable, Code: CodeSchedulerLease, Fix: a.schedulerFix()}
	l := a.ev.Lease
	if l == nil {
		if a.readError("lease") != nil {
			return Finding{}, false
		}
		f.Summary = fmt.Sprintf("%s not found: HAMi's kube-scheduler has never led, so it schedules no pod", name)
		f.Evidence = []string{name + ": not found"}
		return f, true
	}
	holder, renewed, dur := leaseState(l)
	f.Evidence = []string{fmt.Sprintf("%s: holderIdentity %q, renewTime %s, leaseDurationSeconds %d", name, holder, timeOrNever(renewed), int(dur/time.Second))}
	if holder == "" || renewed.IsZero() || !a.now.Before(renewed.Add(dur)) {
		f.Summary = fmt.Sprintf("%s expired (held by %q, renewed %s): no HAMi kube-scheduler leads, so none schedules the pod", name, holder, ago(a.now, renewed))
		return f, true
	}
	if a.readError("scheduler pods") != nil {
		return Finding{}, false
	}
	leader := a.leaderPod()
	switch {
	case leader == nil:
		f.Summary = fmt.Sprintf("%s is held by %q, which is no scheduler Pod (gone?): until it expires no live kube-scheduler leads", name, holder)
	case !podReady(leader):
		f.Summary = fmt.Sprintf("%s is held by Pod %s, which is not Ready: the leader cannot call its extender", name, leader.Name)
		f.Evidence = append(f.Evidence, podState(leader))
	default:
		return Finding{}, false
	}
	return f, true
}

// timeOrNever renders a time as RFC 3339, or "never".
func timeOrNever(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format(time.RFC3339)
}

// ago renders how long ago t was, or "never".
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return now.Sub(t).Round(time.Second).String() + " ago"
}

// schedulerConfiguration is the part of a KubeSchedulerConfiguration (or a legacy Policy) the
// pod diagnosis reads.
type schedulerConfiguration struct {
	Kind           string `json:"kind"`
	LeaderElection struct {
		LeaderElect *bool `json:"leaderElect"`
	} `json:"leaderElection"`
	Extenders []struct {
		URLPrefix  string `json:"urlPrefix"`
		FilterVerb string `json:"filterVerb"`
		BindVerb   string `json:"bindVerb"`
	} `json:"extenders"`
}

// schedulerConfig parses the ConfigMap's configuration: the first data value that has
// extenders or is a KubeSchedulerConfiguration.
func (a *podAnalysis) schedulerConfig() (schedulerConfiguration, bool) {
	cfg, key, err := parseSchedulerConfig(a.ev.SchedulerConfig)
	return cfg, key != "" && err == nil
}

// parseSchedulerConfig returns the configuration and the data key it came from ("" when the
// ConfigMap holds none), or the error of the first value that does not parse.
func parseSchedulerConfig(cm *corev1.ConfigMap) (schedulerConfiguration, string, error) {
	if cm == nil {
		return schedulerConfiguration{}, "", nil
	}
	var firstErr error
	errKey := ""
	for _, k := range sortedKeys(cm.Data) {
		var cfg schedulerConfiguration
		if err := yaml.Unmarshal([]byte(cm.Data[k]), &cfg); err != nil {
			if firstErr == nil && (strings.Contains(cm.Data[k], "urlPrefix") || strings.Contains(cm.Data[k], "KubeSchedulerConfiguration")) {
				firstErr, errKey = err, k
			}
			continue
		}
		if len(cfg.Extenders) > 0 || cfg.Kind == "KubeSchedulerConfiguration" {
			return cfg, k, nil
		}
	}
	return schedulerConfiguration{}, errKey, firstErr
}

// extenderURLCauses compares the extender URL kube-scheduler calls with the port the
// extender container listens on.
func (a *podAnalysis) extenderURLCauses() []Finding {
	o := a.opts
	cm := a.ev.SchedulerConfig
	if cm == nil {
		return nil
	}
	obj := fmt.Sprintf("configmap %s/%s", cm.Namespace, cm.Name)
	cfg, key, err := parseSchedulerConfig(cm)
	if err != nil {
		return []Finding{{Case: P2SchedulerUnreachable, Severity: SeverityWarning, Code: CodePodNotChecked,
			Summary:  fmt.Sprintf("the KubeSchedulerConfiguration in %s key %s does not parse, so its extender URL was not checked", obj, key),
			Evidence: []string{fmt.Sprintf("%s key %s: %v", obj, key, err)},
			Fix:      []string{fmt.Sprintf("kubectl -n %s get configmap %s -o yaml", cm.Namespace, cm.Name)}}}
	}
	c := a.extenderContainer()
	if c == nil {
		return nil
	}
	ports, from := listenPorts(c)
	if len(ports) == 0 {
		return nil
	}
	var out []Finding
	for _, e := range cfg.Extenders {
		port, ok := urlPort(e.URLPrefix)
		if !ok {
			out = append(out, Finding{Case: P2SchedulerUnreachable, Code: CodeExtenderURL,
				Summary:  fmt.Sprintf("kube-scheduler's extender urlPrefix %q is not a URL with a host and port: it cannot call the extender", e.URLPrefix),
				Evidence: []string{fmt.Sprintf("%s key %s: extenders[].urlPrefix %q", obj, key, e.URLPrefix)},
				Fix:      []string{fmt.Sprintf("kubectl -n %s edit configmap %s    # urlPrefix: https://127.0.0.1:%d", cm.Namespace, cm.Name, ports[0])}})
			continue
		}
		if slices.Contains(ports, port) {
			continue
		}
		out = append(out, Finding{Case: P2SchedulerUnreachable, Code: CodeExtenderURL,
			Summary: fmt.Sprintf("kube-scheduler calls the extender at %s (port %d) but container %s listens on port %s: every filter and bind fails",
				e.URLPrefix, port, c.Name, joinInts(ports)),
			Evidence: []string{
				fmt.Sprintf("%s key %s: extenders[].urlPrefix %q", obj, key, e.URLPrefix),
				fmt.Sprintf("deployment %s/%s container %s: %s", o.Namespace, o.Scheduler, c.Name, from),
			},
			Fix: []string{
				fmt.Sprintf("kubectl -n %s edit configmap %s    # set urlPrefix to port %d, then:", cm.Namespace, cm.Name, ports[0]),
				fmt.Sprintf("kubectl -n %s rollout restart deployment %s", o.Namespace, o.Scheduler),
			}})
	}
	return out
}

// extenderContainer is the extender's container in the scheduler Deployment (or a scheduler
// Pod when the Deployment was not read), nil when absent.
func (a *podAnalysis) extenderContainer() *corev1.Container {
	var specs []*corev1.PodSpec
	if a.ev.Scheduler != nil {
		specs = append(specs, &a.ev.Scheduler.Spec.Template.Spec)
	}
	for i := range a.ev.SchedulerPods {
		specs = append(specs, &a.ev.SchedulerPods[i].Spec)
	}
	for _, s := range specs {
		for i := range s.Containers {
			if s.Containers[i].Name == a.opts.ExtenderContainer {
				return &s.Containers[i]
			}
		}
	}
	return nil
}

// listenPorts are the ports the extender listens on: its --http_bind (or --listen) argument,
// else its containerPorts; from says where they came from.
func listenPorts(c *corev1.Container) (ports []int, from string) {
	args := append(slices.Clone(c.Command), c.Args...)
	for i, arg := range args {
		for _, flag := range []string{"--http_bind", "-http_bind", "--listen", "--listen-address"} {
			v, ok := strings.CutPrefix(arg, flag+"=")
			if !ok && arg == flag && i+1 < len(args) {
				v, ok = args[i+1], true
			}
			if !ok {
				continue
			}
			if _, p, err := net.SplitHostPort(v); err == nil {
				if n, err := strconv.Atoi(p); err == nil {
					return []int{n}, fmt.Sprintf("%s %s", flag, v)
				}
			}
		}
	}
	for _, p := range c.Ports {
		ports = append(ports, int(p.ContainerPort))
	}
	return ports, "containerPorts " + joinInts(ports)
}

// urlPort is the port of an extender URL, the scheme's default when it names none.
func urlPort(s string) (int, bool) {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return 0, false
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		return n, err == nil
	}
	switch u.Scheme {
	case "https":
		return 443, true
	case "http":
		return 80, true
	}
	return 0, false
}

// joinInts renders ints as "80, 443".
func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}

// checkLimits (P8) checks that a running pod runs with HAMi's limits.
func (a *podAnalysis) checkLimits() {
	p := a.pod
	for i, r := range a.req.Containers {
		if r.Count == 0 {
			continue
		}
		if f, ok := a.controlDisabled(i); ok {
			a.add(f)
		}
	}
	if !a.req.Any() {
		return
	}
	if _, ok := p.Annotations[a.opts.Vendor.AllocatedKey]; !ok {
		f := Finding{Case: P8RunningWithoutLimits, Severity: SeverityError, Code: CodeLimitsNotEnforced,
			Summary: fmt.Sprintf("pod %s/%s runs with %s but never went through HAMi's scheduler (no %s): its GPU memory and core limits are not enforced, and HAMi does not count its GPUs",
				p.Namespace, p.Name, a.opts.Allocation.ResourceCount, a.opts.Vendor.AllocatedKey),
			Evidence: []string{fmt.Sprintf("pod %s/%s: spec.schedulerName %q, no annotation %s", p.Namespace, p.Name, cmp.Or(p.Spec.SchedulerName, defaultSchedulerName), a.opts.Vendor.AllocatedKey)},
			Fix:      []string{recreateFix(p, fmt.Sprintf(".spec.schedulerName=%q", a.opts.SchedulerName))}}
		a.add(f)
	}
	if f, ok := a.foreignPlugin(); ok {
		a.add(f)
	}
}

// controlDisabled checks the i-th container's env for CUDA_DISABLE_CONTROL.
func (a *podAnalysis) controlDisabled(i int) (Finding, bool) {
	p := a.pod
	c, ok := allocation.ContainerAt(p, i)
	if !ok {
		return Finding{}, false
	}
	for _, e := range c.Env {
		if e.Name != envDisableControl {
			continue
		}
		obj := fmt.Sprintf("pod %s/%s container %s", p.Namespace, p.Name, c.Name)
		if e.ValueFrom != nil {
			return Finding{Case: P8RunningWithoutLimits, Severity: SeverityWarning, Code: CodeControlDisabled,
				Summary:  fmt.Sprintf("%s sets %s from a reference: when it is true, HAMi-core enforces no limit in it", obj, envDisableControl),
				Evidence: []string{fmt.Sprintf("%s: env %s valueFrom (not readable from the pod spec)", obj, envDisableControl)},
				Fix:      []string{fmt.Sprintf("kubectl -n %s exec %s -c %s -- printenv %s", p.Namespace, p.Name, c.Name, envDisableControl)}}, true
		}
		if !truthy(e.Value) {
			return Finding{}, false
		}
		return Finding{Case: P8RunningWithoutLimits, Severity: SeverityError, Code: CodeControlDisabled,
			Summary:  fmt.Sprintf("%s sets %s=%s: HAMi-core enforces no GPU memory or core limit in it", obj, envDisableControl, e.Value),
			Evidence: []string{fmt.Sprintf("%s: env %s=%q", obj, envDisableControl, e.Value)},
			Fix: []string{recreateFix(p, fmt.Sprintf(`del(.spec.containers[].env[]? | select(.name == %q))`, envDisableControl)) +
				"    # the environment cannot be read from the API beyond the pod spec"}}, true
	}
	return Finding{}, false
}

// truthy reports whether an environment value means true.
func truthy(v string) bool {
	if b, err := strconv.ParseBool(strings.TrimSpace(v)); err == nil {
		return b
	}
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "yes", "on", "y":
		return true
	}
	return false
}

// foreignPlugin reports a pod whose node runs no Pod of HAMi's device plugin: the node's GPUs
// come from another plugin, which enforces no HAMi limit.
func (a *podAnalysis) foreignPlugin() (Finding, bool) {
	p, o := a.pod, a.opts
	node := p.Spec.NodeName
	if node == "" || a.readError("device plugin pods") != nil {
		return Finding{}, false
	}
	for _, pp := range a.ev.PluginPods {
		if pp.Spec.NodeName == node && pp.Status.Phase == corev1.PodRunning {
			return Finding{}, false
		}
	}
	ds := fmt.Sprintf("daemonset %s/%s", o.Namespace, o.DaemonSet)
	ev := []string{fmt.Sprintf("%s: no Running Pod on node %s", ds, node)}
	if a.ev.PluginDaemonSet == nil {
		ev[0] = fmt.Sprintf("%s: not found, no Pod of HAMi's device plugin (%s) on node %s", ds, o.PluginSelector, node)
	}
	if n := a.node(node); n != nil {
		if q, ok := n.Status.Allocatable[corev1.ResourceName(o.ResourceName)]; ok {
			ev = append(ev, fmt.Sprintf("node %s: allocatable %s = %s, advertised by another device plugin", node, o.ResourceName, q.String()))
		}
	}
	return Finding{Case: P8RunningWithoutLimits, Severity: SeverityError, Code: CodeForeignPlugin,
		Summary: fmt.Sprintf("node %s runs no Pod of HAMi's device plugin: its %s comes from another plugin, which does not apply HAMi's limits to pod %s/%s (the container env cannot be read from the API beyond the pod spec)",
			node, o.ResourceName, p.Namespace, p.Name),
		Evidence: ev,
		Fix: []string{
			fmt.Sprintf("kubectl get pods -A -o wide --field-selector spec.nodeName=%s | grep -i -E 'nvidia|gpu|device'", node),
			fmt.Sprintf("kubectl label node %s gpu=on --overwrite    # the chart's nodeSelector for %s; remove the other plugin from the node", node, ds),
			recreateFix(p, ""),
		}}, true
}

// checkHandOver hands a pod stopped before S1 without FilteringFailed over to the node
// diagnosis of the candidate nodes.
func (a *podAnalysis) checkHandOver() {
	if a.lastEvent(eventFilteringFailed) != nil || len(a.r.Errors()) > 0 || len(a.ev.NodeReports) == 0 {
		return
	}
	var bad []Report
	for _, r := range a.ev.NodeReports {
		if r.Case == Healthy {
			return // a node registers: the hand-over has nothing to say
		}
		bad = append(bad, r)
	}
	p := a.pod
	var parts, ev, fix []string
	for _, r := range bad {
		parts = append(parts, fmt.Sprintf("%s %s: %s", r.Node, r.Case.Short(), r.Reason))
		ev = append(ev, fmt.Sprintf("node %s: %s (%s)", r.Node, r.Case.Short(), r.Case.Describe()))
		if errs := r.Errors(); len(errs) > 0 && len(errs[0].Fix) > 0 {
			fix = append(fix, errs[0].Fix[0])
		}
	}
	fix = append(fix, fmt.Sprintf("kubectl -n %s describe pod %s    # HAMi's scheduler retries the pod once a node registers", p.Namespace, p.Name))
	a.r.Nodes = bad
	a.add(Finding{Case: P0NodeNotRegistered, Severity: SeverityError, Code: CodeHandOver,
		Summary:  "no GPU node registers with HAMi's scheduler: " + strings.Join(parts, "; "),
		Evidence: ev, Fix: fix})
}

// notFoundOnly reports whether err is absent or says "not found" (the object is absent, not
// unreadable).
func notFoundOnly(err error) bool { return err == nil || apierrors.IsNotFound(err) }

// clusterReadErrors records the failed reads of the objects shared with the node diagnosis
// (a missing object is not a failure: it is nil in the evidence).
func (g *podGather) clusterReadErrors(into map[string]error) {
	o := g.opts
	for what, err := range map[string]error{
		"deployment " + o.Namespace + "/" + o.Scheduler: g.c.deployErr,
		"lease " + o.Namespace + "/" + o.Lease:          g.c.leaseErr,
		"scheduler pods (" + o.SchedulerSelector + ")":  g.c.schedPodsErr,
		"device plugin pods":                            g.c.podsErr,
		"daemonset " + o.Namespace + "/" + o.DaemonSet:  g.c.dsErr,
	} {
		if !notFoundOnly(err) {
			into[what] = err
		}
	}
}
