package diagnose

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/nodelock"
)

// PodEvidence is everything a pod diagnosis reads, as recorded objects: [Pod] and [Pods]
// gather it through the API server, a test or a support bundle can fill it by hand and call
// [AnalyzePod]. Objects that could not be read are nil or empty, with the failure in
// ReadErrors.
type PodEvidence struct {
	// Pod is the pod to diagnose.
	Pod *corev1.Pod
	// Events are the pod's Events (involvedObject the pod), in any order.
	Events []corev1.Event
	// Namespace is the pod's Namespace (its labels decide the webhook's namespaceSelector).
	Namespace *corev1.Namespace
	// Nodes are the cluster's Nodes: the candidates of the fit and the pod's node.
	Nodes []corev1.Node
	// Pods are the cluster's pods that hold or may hold GPUs (every pod with HAMi's
	// annotations, and the holders of node locks), for usage and lock holders.
	Pods []corev1.Pod
	// Quotas are the ResourceQuotas of the pod's namespace.
	Quotas []corev1.ResourceQuota
	// Webhooks are the cluster's MutatingWebhookConfigurations.
	Webhooks []admissionregistrationv1.MutatingWebhookConfiguration
	// EndpointSlices are the EndpointSlices of the Services the webhooks call.
	EndpointSlices []discoveryv1.EndpointSlice
	// Scheduler is HAMi's scheduler Deployment, SchedulerPods its Pods, Lease the Lease its
	// kube-scheduler holds, SchedulerConfig the ConfigMap with its KubeSchedulerConfiguration.
	Scheduler       *appsv1.Deployment
	SchedulerPods   []corev1.Pod
	Lease           *coordinationv1.Lease
	SchedulerConfig *corev1.ConfigMap
	// PluginDaemonSet is the device plugin DaemonSet, PluginPods its Pods (every node).
	PluginDaemonSet *appsv1.DaemonSet
	PluginPods      []corev1.Pod
	// NodeReports are node diagnoses ([Node]) of the pod's node and of the candidate nodes;
	// the analysis hands over to them.
	NodeReports []Report
	// Monitor is what the node monitor of the pod's node serves about a Running GPU pod
	// (its GPU usage against its limits, accounting drift, processes without a HAMi-core
	// slot), with the read failure in it; nil when it was not read (the pod does not run,
	// or Options.MonitorPort is negative).
	Monitor *MonitorScrape
	// Claims are the ResourceClaims and ClaimTemplates of the pod's namespace; DeviceClasses,
	// ResourceSlices and DeviceTaintRules the cluster's (resource.k8s.io/v1): a pod whose GPU
	// comes from a claim of the SDK's or HAMi-DRA's driver is diagnosed from them.
	Claims           []resourcev1.ResourceClaim
	ClaimTemplates   []resourcev1.ResourceClaimTemplate
	DeviceClasses    []resourcev1.DeviceClass
	ResourceSlices   []resourcev1.ResourceSlice
	DeviceTaintRules []resourcev1.DeviceTaintRule
	// ReadErrors holds what could not be read, by resource ("events", "nodes", …).
	ReadErrors map[string]error
}

// Pod diagnoses one GPU pod: it reads the pod, its Events, the Nodes and the pods holding
// GPUs, the namespace's ResourceQuotas, the MutatingWebhookConfigurations and their
// endpoints, HAMi's scheduler (Deployment, Pods, Lease, configuration) and the device plugin
// Pods, for a Running pod the node monitor's /metrics on its node's device plugin Pod
// (through the API server's pod proxy; [PodReport].Usage), diagnoses the pod's node (and, for a pod stopped before S1 without FilteringFailed,
// every GPU node) with [Node]'s analysis, and returns the stage reached, the case P1–P8 that
// stops it and the findings. Problems in the cluster are findings; the error is non-nil only
// when the pod cannot be read (errors.Is ErrPodNotFound, ErrAPI) or the options are invalid.
//
// The identity behind client needs the read-only rules of [PodClusterRoleRules]; whatever it
// may not read becomes a NotChecked finding.
func Pod(ctx context.Context, client kubernetes.Interface, namespace, name string, opts Options) (*PodReport, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	pod, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("get pod %s/%s: %w (list them with: kubectl get pods -n %s)", namespace, name, ErrPodNotFound, namespace)
		}
		return nil, fmt.Errorf("get pod %s/%s: %w: %w", namespace, name, ErrAPI, err)
	}
	g := gatherPods(ctx, client, opts, namespace)
	ev := g.evidence(ctx, pod)
	r := analyzePod(ev, opts)
	return &r, nil
}

// Pods diagnoses every GPU pod of the namespace (every namespace when it is "") that is not
// Running or Succeeded (a pod with HAMi's resources or annotations, or with a claim of the
// SDK's or HAMi-DRA's DRA driver), reading the shared objects once. Reports are sorted by namespace and
// name.
func Pods(ctx context.Context, client kubernetes.Interface, namespace string, opts Options) ([]PodReport, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	list, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list pods: %w: %w", ErrAPI, err)
	}
	g := gatherPods(ctx, client, opts, namespace)
	var out []PodReport
	for i := range list.Items {
		p := &list.Items[i]
		if p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodSucceeded {
			continue
		}
		asks := allocation.Requests(p, opts.Allocation).Any() || hasHAMiAnnotations(p)
		if !asks && len(p.Spec.ResourceClaims) == 0 {
			continue
		}
		r := analyzePod(g.evidence(ctx, p), opts)
		if !asks && len(r.Claims) == 0 {
			continue // claims of other drivers only: not a GPU pod
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b PodReport) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out, nil
}

// AnalyzePod diagnoses a pod from recorded objects, as [Pod] does after reading them; it
// reads nothing and changes nothing.
func AnalyzePod(ev PodEvidence, opts Options) (PodReport, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return PodReport{}, err
	}
	if ev.Pod == nil {
		return PodReport{}, fmt.Errorf("%w: PodEvidence.Pod is nil", ErrInvalidOptions)
	}
	return analyzePod(ev, opts), nil
}

// hasHAMiAnnotations reports whether a HAMi scheduler wrote to the pod.
func hasHAMiAnnotations(p *corev1.Pod) bool {
	_, node := p.Annotations[allocation.KeyNode]
	_, phase := p.Annotations[allocation.KeyBindPhase]
	return node || phase
}

// podAnalysis is the state of one pod's diagnosis.
type podAnalysis struct {
	ev   *PodEvidence
	opts Options
	r    *PodReport
	now  time.Time
	pod  *corev1.Pod
	req  allocation.PodRequest
	// hami says spec.schedulerName is HAMi's scheduler.
	hami bool
	// events are the pod's Events, newest first.
	events []corev1.Event
}

// add records f; a finding without a case is a note outside any case (Healthy).
func (a *podAnalysis) add(f Finding) { a.r.Findings = append(a.r.Findings, f.withCase()) }

// analyzePod runs the checks of the stage the pod reached; opts has its defaults.
func analyzePod(ev PodEvidence, opts Options) PodReport {
	pod := ev.Pod
	r := PodReport{
		Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID),
		Phase: string(pod.Status.Phase), SchedulerName: pod.Spec.SchedulerName, Node: pod.Spec.NodeName,
		AssignedNode: pod.Annotations[allocation.KeyNode], BindPhase: pod.Annotations[allocation.KeyBindPhase],
		Checked: opts.Clock.Now(),
	}
	a := &podAnalysis{ev: &ev, opts: opts, r: &r, now: opts.Clock.Now(), pod: pod,
		req: allocation.Requests(pod, opts.Allocation), hami: pod.Spec.SchedulerName == opts.SchedulerName}
	a.events = slices.Clone(ev.Events)
	slices.SortStableFunc(a.events, func(x, y corev1.Event) int { return eventTime(y).Compare(eventTime(x)) })
	for i, c := range a.req.Containers {
		if c.Count > 0 {
			r.Asks = append(r.Asks, asksString(a.containerName(i), c.Count, c.Memory, c.MemoryPercentage, c.Cores))
		}
	}
	for what, err := range ev.ReadErrors {
		a.add(Finding{Severity: SeverityInfo, Code: CodePodNotChecked, Summary: "could not read " + what, Evidence: []string{err.Error()}, Fix: rbacFix(what, err)})
	}
	if claims := a.draClaims(); len(claims) > 0 {
		r.Claims = claims
		a.checkDRA()
		a.finish()
		return r
	}
	r.Stage = a.stage()
	a.dispatch()
	a.finish()
	return r
}

// containerName names the i-th entry of the request (init containers first).
func (a *podAnalysis) containerName(i int) string {
	if c, ok := allocation.ContainerAt(a.pod, i); ok {
		return c.Name
	}
	return fmt.Sprintf("container %d", i)
}

// stage is the last stage the pod reached, from its phase, annotations and Events.
func (a *podAnalysis) stage() Stage {
	p := a.pod
	switch {
	case p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodSucceeded:
		return StageRunning
	case a.r.BindPhase == string(allocation.PhaseSuccess):
		return StageAllocated
	case p.Spec.NodeName != "" && a.hami && a.r.BindPhase != "":
		return StageBound
	case a.r.AssignedNode != "" || a.lastEvent(eventFilteringSucceed) != nil:
		return StageFiltered
	case a.hami:
		return StageAdmitted
	}
	return StageNotAdmitted
}

// dispatch runs the checks for the pod's phase and stage, in the order of the cases.
func (a *podAnalysis) dispatch() {
	p := a.pod
	if !a.req.Any() && !hasHAMiAnnotations(p) {
		a.add(Finding{Severity: SeverityInfo, Code: CodePodNoGPU,
			Summary:  fmt.Sprintf("the pod asks for no %s: it is not a GPU pod, HAMi has nothing to do with it", a.opts.Allocation.ResourceCount),
			Evidence: []string{fmt.Sprintf("pod %s/%s: no container has a %s limit", p.Namespace, p.Name, a.opts.Allocation.ResourceCount)}})
		return
	}
	switch {
	case p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodSucceeded:
		a.checkLimits()
		a.checkUsage()
	case p.Status.Phase == corev1.PodFailed:
		if !a.hami && !hasHAMiAnnotations(p) {
			a.checkRouting()
		}
		a.checkAdmission()
	case !a.hami:
		a.checkRouting()
	case a.r.BindPhase == string(allocation.PhaseFailed):
		a.checkAdmission()
	case a.r.Stage == StageAllocated:
		// Allocated, waiting for the runtime: nothing of HAMi's is left to do.
	case a.r.Stage == StageBound:
		a.checkAllocateWait()
	case a.r.Stage == StageFiltered:
		a.checkLock()
		a.checkStaleAssignment()
	default:
		a.checkLock()
		a.checkScheduler()
		a.checkFit()
		a.checkHandOver()
	}
}

// finish orders the findings and sets the case and the reason.
func (a *podAnalysis) finish() {
	rank := map[Severity]int{SeverityError: 0, SeverityWarning: 1, SeverityInfo: 2}
	slices.SortStableFunc(a.r.Findings, func(x, y Finding) int {
		return cmp.Compare(rank[x.Severity], rank[y.Severity])
	})
	for _, f := range a.r.Findings {
		if f.Severity == SeverityError {
			a.r.Case, a.r.Reason = f.Case, f.Summary
			return
		}
	}
	a.r.Case = Healthy
	if a.r.Reason == "" {
		a.r.Reason = fmt.Sprintf("%s: %s", cmp.Or(a.r.StageText, a.r.Stage.Describe()), a.progress())
	}
}

// progress says where a pod without a case stands.
func (a *podAnalysis) progress() string {
	for _, f := range a.r.Findings {
		if f.Code == CodePodWaiting || f.Code == CodePodNoGPU {
			return f.Summary
		}
	}
	if len(a.r.Claims) > 0 && a.r.Stage >= StageAllocated {
		return "its claims' devices are prepared and healthy as far as the kubelet reports"
	}
	switch a.r.Stage {
	case StageRunning:
		return "running, with HAMi's limits"
	case StageAllocated:
		return "allocated; the container runtime starts it"
	default:
		return "nothing stops it"
	}
}

// eventTime is when an Event last happened.
func eventTime(e corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	case !e.FirstTimestamp.IsZero():
		return e.FirstTimestamp.Time
	}
	return e.CreationTimestamp.Time
}

// lastEvent returns the newest Event with the reason, nil when none.
func (a *podAnalysis) lastEvent(reason string) *corev1.Event {
	for i := range a.events {
		if a.events[i].Reason == reason {
			return &a.events[i]
		}
	}
	return nil
}

// eventsWith returns the Events with the reason, newest first.
func (a *podAnalysis) eventsWith(reason string) []corev1.Event {
	var out []corev1.Event
	for _, e := range a.events {
		if e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// node returns the Node with the name, nil when it was not read.
func (a *podAnalysis) node(name string) *corev1.Node {
	for i := range a.ev.Nodes {
		if a.ev.Nodes[i].Name == name {
			return &a.ev.Nodes[i]
		}
	}
	return nil
}

// podByKey returns the pod "namespace/name" from the evidence, nil when absent.
func (a *podAnalysis) podByKey(key string) *corev1.Pod {
	ns, name, _ := strings.Cut(key, "/")
	if a.pod.Namespace == ns && a.pod.Name == name {
		return a.pod
	}
	for i := range a.ev.Pods {
		if a.ev.Pods[i].Namespace == ns && a.ev.Pods[i].Name == name {
			return &a.ev.Pods[i]
		}
	}
	return nil
}

// nodeReport returns the node diagnosis of the node, nil when none was made.
func (a *podAnalysis) nodeReport(name string) *Report {
	for i := range a.ev.NodeReports {
		if a.ev.NodeReports[i].Node == name {
			return &a.ev.NodeReports[i]
		}
	}
	return nil
}

// podGather is what is read once for any number of pods.
type podGather struct {
	c         *cluster
	client    kubernetes.Interface
	opts      Options
	namespace string

	nodes       []corev1.Node
	pods        []corev1.Pod
	webhooks    []admissionregistrationv1.MutatingWebhookConfiguration
	slices      []discoveryv1.EndpointSlice
	schedConfig *corev1.ConfigMap
	errs        map[string]error

	nodeReports map[string]Report
	namespaces  map[string]*corev1.Namespace
	quotas      map[string][]corev1.ResourceQuota

	dra draGather
}

// gatherPods reads the cluster-wide objects a pod diagnosis needs.
func gatherPods(ctx context.Context, client kubernetes.Interface, opts Options, namespace string) *podGather {
	g := &podGather{c: gather(ctx, client, opts, ""), client: client, opts: opts, namespace: namespace,
		errs: map[string]error{}, nodeReports: map[string]Report{}, namespaces: map[string]*corev1.Namespace{},
		quotas: map[string][]corev1.ResourceQuota{}}
	if list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		g.errs["nodes"] = err
	} else {
		g.nodes = list.Items
	}
	if list, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); err != nil {
		g.errs["pods in every namespace (GPU usage, lock holders)"] = err
	} else {
		holders := lockHolders(g.nodes)
		for _, p := range list.Items {
			if hasHAMiAnnotations(&p) || allocation.Requests(&p, opts.Allocation).Any() || holders[p.Namespace+"/"+p.Name] {
				g.pods = append(g.pods, p)
			}
		}
	}
	if list, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{}); err != nil {
		g.errs["mutatingwebhookconfigurations"] = err
	} else {
		g.webhooks = list.Items
	}
	seen := map[string]bool{}
	for _, w := range g.webhooks {
		for _, h := range w.Webhooks {
			svc := h.ClientConfig.Service
			if svc == nil || seen[svc.Namespace+"/"+svc.Name] {
				continue
			}
			seen[svc.Namespace+"/"+svc.Name] = true
			list, err := client.DiscoveryV1().EndpointSlices(svc.Namespace).List(ctx, metav1.ListOptions{
				LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
			if err != nil {
				g.errs["endpointslices of Service "+svc.Namespace+"/"+svc.Name] = err
				continue
			}
			g.slices = append(g.slices, list.Items...)
		}
	}
	g.gatherDRA(ctx)
	if cm, err := client.CoreV1().ConfigMaps(opts.Namespace).Get(ctx, opts.SchedulerConfigMap, metav1.GetOptions{}); err != nil {
		if !apierrors.IsNotFound(err) {
			g.errs["configmap "+opts.Namespace+"/"+opts.SchedulerConfigMap] = err
		}
	} else {
		g.schedConfig = cm
	}
	return g
}

// lockHolders returns the pods ("namespace/name") the nodes' locks name: a holder is
// evidence even when it asks for no GPU (a lock left by a pod whose request changed, or
// written by hand), else it would read as gone.
func lockHolders(nodes []corev1.Node) map[string]bool {
	out := map[string]bool{}
	for i := range nodes {
		l, present, err := nodelock.FromAnnotations(nodes[i].Annotations)
		if !present || err != nil {
			continue
		}
		if owner, named := l.Owner(); named {
			out[owner.String()] = true
		}
	}
	return out
}

// evidence completes the shared objects with the pod's own: its Events, namespace, quotas
// and the node diagnoses it needs.
func (g *podGather) evidence(ctx context.Context, pod *corev1.Pod) PodEvidence {
	ev := PodEvidence{
		Pod: pod, Nodes: g.nodes, Pods: g.pods, Webhooks: g.webhooks, EndpointSlices: g.slices,
		Scheduler: g.c.deploy, SchedulerPods: g.c.schedPods, Lease: g.c.lease, SchedulerConfig: g.schedConfig,
		PluginDaemonSet: g.c.ds, ReadErrors: map[string]error{},
	}
	for _, pods := range g.c.podsByNode {
		ev.PluginPods = append(ev.PluginPods, pods...)
	}
	for k, err := range g.errs {
		ev.ReadErrors[k] = err
	}
	g.clusterReadErrors(ev.ReadErrors)
	events, err := g.client.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
		"involvedObject.kind": "Pod", "involvedObject.name": pod.Name, "involvedObject.namespace": pod.Namespace,
	}.String()})
	if err != nil {
		ev.ReadErrors["events of the pod"] = err
	} else {
		for _, e := range events.Items {
			o := e.InvolvedObject
			if o.Name == pod.Name && o.Namespace == pod.Namespace && (o.UID == "" || o.UID == pod.UID) {
				ev.Events = append(ev.Events, e)
			}
		}
	}
	if ns, ok := g.namespaces[pod.Namespace]; ok {
		ev.Namespace = ns
	} else if got, err := g.client.CoreV1().Namespaces().Get(ctx, pod.Namespace, metav1.GetOptions{}); err != nil {
		ev.ReadErrors["namespace "+pod.Namespace] = err
		g.namespaces[pod.Namespace] = nil
	} else {
		ev.Namespace, g.namespaces[pod.Namespace] = got, got
	}
	if qs, ok := g.quotas[pod.Namespace]; ok {
		ev.Quotas = qs
	} else if list, err := g.client.CoreV1().ResourceQuotas(pod.Namespace).List(ctx, metav1.ListOptions{}); err != nil {
		ev.ReadErrors["resourcequotas of namespace "+pod.Namespace] = err
		g.quotas[pod.Namespace] = nil
	} else {
		ev.Quotas, g.quotas[pod.Namespace] = list.Items, list.Items
	}
	// The node diagnoses: the pod's node, the filter's choice, and, for a pod before S1,
	// every GPU node (the candidates of a hand-over).
	want := map[string]bool{}
	for _, n := range []string{pod.Spec.NodeName, pod.Annotations[allocation.KeyNode]} {
		if n != "" {
			want[n] = true
		}
	}
	if pod.Spec.NodeName == "" && pod.Annotations[allocation.KeyNode] == "" {
		for i := range g.nodes {
			if g.c.looksLikeGPUNode(&g.nodes[i]) {
				want[g.nodes[i].Name] = true
			}
		}
	}
	for i := range g.nodes {
		n := &g.nodes[i]
		if !want[n.Name] {
			continue
		}
		r, ok := g.nodeReports[n.Name]
		if !ok {
			r = g.c.analyze(ctx, n)
			g.nodeReports[n.Name] = r
		}
		ev.NodeReports = append(ev.NodeReports, r)
	}
	slices.SortFunc(ev.NodeReports, func(x, y Report) int { return cmp.Compare(x.Node, y.Node) })
	g.draEvidence(ctx, pod, &ev)
	if wantsMonitor(pod, g.opts) {
		ev.Monitor = readMonitor(ctx, g.client, g.opts, pod, ev.PluginPods)
	}
	return ev
}

// hamiPodAnnotations are the annotations HAMi's scheduler and device plugin write on a pod;
// a pod created again from its manifest must not carry them.
var hamiPodAnnotations = []string{
	allocation.KeyNode, allocation.KeyTime, allocation.KeyBindPhase, allocation.KeyBindTime,
	"hami.io/vgpu-devices-to-allocate", "hami.io/vgpu-devices-allocated", "hami.io/vgpu-mig-allocations",
}

// recreateFix is the command that creates the pod again: a pod owned by a controller is
// deleted (the controller creates it anew); a bare pod is replaced from its own manifest
// without status, node, HAMi's annotations and with the edits, a jq expression applied to
// the pod's JSON (e.g. `.spec.schedulerName="hami-scheduler"`; "" for none).
func recreateFix(p *corev1.Pod, edits string) string {
	if len(p.OwnerReferences) > 0 && edits == "" {
		o := p.OwnerReferences[0]
		return fmt.Sprintf("kubectl -n %s delete pod %s    # %s %s creates it again", p.Namespace, p.Name, o.Kind, o.Name)
	}
	var del []string
	for _, k := range hamiPodAnnotations {
		del = append(del, fmt.Sprintf(".metadata.annotations[%q]", k))
	}
	expr := "del(.status, .spec.nodeName, .metadata.resourceVersion, .metadata.uid, .metadata.creationTimestamp, " + strings.Join(del, ", ") + ")"
	if edits != "" {
		expr += " | " + edits
	}
	cmd := fmt.Sprintf("kubectl -n %s get pod %s -o json | jq '%s' | kubectl replace --force -f -", p.Namespace, p.Name, expr)
	if len(p.OwnerReferences) > 0 {
		o := p.OwnerReferences[0]
		cmd = fmt.Sprintf("kubectl -n %s edit %s %s    # apply the same change to the pod template (%s), then: kubectl -n %s delete pod %s",
			p.Namespace, strings.ToLower(o.Kind), o.Name, edits, p.Namespace, p.Name)
	}
	return cmd
}
