package diagnose

import (
	"archive/tar"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/hamireg/hamireg/allocation"
)

// Defaults and bounds of a support bundle.
const (
	// DefaultBundleLogLines is how many of the last lines of each log a bundle holds, as the
	// troubleshooting guide asks ("the last 500 log lines").
	DefaultBundleLogLines = 500
	// MaxBundleLogBytes caps each log in a bundle; a longer log keeps its end.
	MaxBundleLogBytes = 2 << 20
	// maxFallbackLogs caps how many scheduler Pods' logs are taken when the leader is unknown.
	maxFallbackLogs = 5
)

// lastApplied is kubectl's copy of an applied object: a duplicate of what the bundle holds,
// dropped.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// BundleTarget is what a bundle is about: a node (Node), or a pod (Namespace and Pod). For a
// pod, Node may be left empty: the pod's spec.nodeName, or else its hami.io/vgpu-node
// annotation, is the node; a Node that is set wins.
type BundleTarget struct {
	Node      string `json:"node,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
}

// String is "pod <namespace>/<name>" or "node <name>".
func (t BundleTarget) String() string {
	if t.Pod != "" {
		return "pod " + t.Namespace + "/" + t.Pod
	}
	return "node " + t.Node
}

// Root is the bundle's top folder for a bundle created at created:
// "hami-doctor-pod-<namespace>-<name>-<UTC time>" or "hami-doctor-node-<name>-<UTC time>",
// the time as 20060102-150405. A program names the archive Root + ".tar.gz".
func (t BundleTarget) Root(created time.Time) string {
	what := "node-" + t.Node
	if t.Pod != "" {
		what = "pod-" + t.Namespace + "-" + t.Pod
	}
	return "hami-doctor-" + safeName(what) + "-" + created.UTC().Format("20060102-150405")
}

// BundleFile is a file the caller adds to a bundle, e.g. the diagnosis as text and JSON.
type BundleFile struct {
	// Name is the file's path under diagnosis/ ("report.txt"); a relative, clean path.
	Name string
	// Data is the file's content; it is redacted like everything else.
	Data []byte
}

// BundleOptions says where HAMi is installed (the embedded [Options]: Namespace, DaemonSet,
// PluginSelector, PluginContainer, Scheduler, SchedulerSelector, ExtenderContainer, Lease,
// SchedulerConfigMap, Webhook, Clock, LogTimeout) and what else goes into a bundle.
type BundleOptions struct {
	Options
	// LogLines is how many of the last lines of each log are collected; negative collects no
	// log. Default 500.
	LogLines int64
	// Files are added under diagnosis/, redacted.
	Files []BundleFile
}

// BundleIndex lists what a bundle holds and what could not be collected; the bundle holds it
// as index.txt and index.json.
type BundleIndex struct {
	// Target is the bundle's target, with the node resolved for a pod.
	Target BundleTarget `json:"target"`
	// Created is when the bundle was made (Options.Clock).
	Created time.Time `json:"created"`
	// Root is the archive's top folder (Target.Root(Created)).
	Root string `json:"root"`
	// Files are the paths in the archive, in archive order (index.txt and index.json first).
	Files []string `json:"files"`
	// Missing has one line per object or log not collected and why, e.g.
	// "pods/log kube-system/hami-device-plugin-x: ... forbidden ... (grant get pods/log)".
	Missing []string `json:"missing,omitempty"`
}

// Text renders the index as index.txt holds it.
func (x *BundleIndex) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "HAMi doctor support bundle\ntarget: %s", x.Target)
	if x.Target.Pod != "" {
		fmt.Fprintf(&b, " (node %s)", cmp.Or(x.Target.Node, "none"))
	}
	fmt.Fprintf(&b, "\ncreated: %s\n\nfiles:\n", x.Created.UTC().Format(time.RFC3339))
	for _, f := range x.Files {
		fmt.Fprintf(&b, "  %s\n", f)
	}
	if len(x.Missing) == 0 {
		b.WriteString("\nnot collected: nothing\n")
		return b.String()
	}
	b.WriteString("\nnot collected:\n")
	for _, m := range x.Missing {
		fmt.Fprintf(&b, "  %s\n", m)
	}
	return b.String()
}

// WriteBundle writes a support bundle about target to w as one .tar.gz, everything under
// the folder target.Root(created):
//
//   - nodes/<node>.yaml and events/nodes/<node>.yaml: the Node and its Events;
//   - pods/<namespace>/<pod>.yaml and events/pods/<namespace>/<pod>.yaml: the target Pod
//     and its Events; the node's device plugin Pod and the leader scheduler Pod as well;
//   - daemonsets/, deployments/, leases/, configmaps/, mutatingwebhookconfigurations/: the
//     device plugin DaemonSet, the scheduler Deployment, its Lease, the
//     KubeSchedulerConfiguration ConfigMap and HAMi's MutatingWebhookConfiguration;
//   - logs/<namespace>/<pod>/<container>.log: the last LogLines lines of the device plugin
//     on the node (PluginContainer; <container>.previous.log too after a restart) and of the
//     leader scheduler Pod (ExtenderContainer), the one the Lease's holder names; when the
//     leader is unknown, of every scheduler Pod;
//   - monitor/<namespace>/<pod>.json: for a Running GPU pod, what the node monitor of its
//     node serves about it (a [MonitorScrape]; json.Unmarshal it into PodEvidence.Monitor
//     to analyse it again with [AnalyzePod]), with the read failure when there was one;
//   - diagnosis/<name>: the caller's Files;
//   - index.txt and index.json: the [BundleIndex].
//
// Objects are YAML without managedFields and kubectl's last-applied copy; a ConfigMap loses
// its binaryData; the literal values of environment variables named like credentials
// (…TOKEN, …PASSWORD, …SECRET…, …KEY…) become "[REDACTED]". Everything is passed through
// [Redact]. Secrets are never read.
//
// What cannot be read (a missing permission, an object not found, a log the kubelet does
// not serve) is a line in BundleIndex.Missing, not an error. The error is non-nil only when
// target cannot be read (errors.Is ErrNodeNotFound, ErrPodNotFound, ErrAPI), target or opts
// are invalid (ErrInvalidOptions), or w fails; nothing is written to w before every read is
// done. The identity behind client needs [BundleClusterRoleRules].
func WriteBundle(ctx context.Context, client kubernetes.Interface, target BundleTarget, w io.Writer, opts BundleOptions) (*BundleIndex, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := validateBundle(target, opts.Files); err != nil {
		return nil, err
	}
	b := &bundle{client: client, opts: o, lines: cmp.Or(opts.LogLines, DefaultBundleLogLines), files: map[string][]byte{}}
	created := o.Clock.Now()
	if err := b.collect(ctx, &target); err != nil {
		return nil, err
	}
	for _, f := range opts.Files {
		b.add(path.Join("diagnosis", f.Name), f.Data)
	}
	idx := &BundleIndex{Target: target, Created: created, Root: target.Root(created), Missing: b.missing}
	if err := idx.write(w, b.files); err != nil {
		return idx, err
	}
	return idx, nil
}

// validateBundle checks the target and the caller's file names.
func validateBundle(t BundleTarget, files []BundleFile) error {
	switch {
	case t.Pod != "" && t.Namespace == "":
		return fmt.Errorf("%w: BundleTarget.Namespace is empty for pod %s", ErrInvalidOptions, t.Pod)
	case t.Pod == "" && t.Node == "":
		return fmt.Errorf("%w: BundleTarget names neither a node nor a pod", ErrInvalidOptions)
	}
	seen := map[string]bool{}
	for _, f := range files {
		n := f.Name
		if n == "" || path.IsAbs(n) || path.Clean(n) != n || n == ".." || strings.HasPrefix(n, "../") || strings.Contains(n, "\\") {
			return fmt.Errorf("%w: bundle file name %q must be a clean relative path (e.g. report.txt)", ErrInvalidOptions, n)
		}
		if seen[n] {
			return fmt.Errorf("%w: bundle file %q given twice", ErrInvalidOptions, n)
		}
		seen[n] = true
	}
	return nil
}

// bundle is what is collected for one archive: files by path under the root, and what
// could not be collected.
type bundle struct {
	client  kubernetes.Interface
	opts    Options
	lines   int64
	files   map[string][]byte
	missing []string
}

// collect reads the target and everything around it; target.Node is resolved for a pod.
func (b *bundle) collect(ctx context.Context, target *BundleTarget) error {
	core := b.client.CoreV1()
	if target.Pod != "" {
		pod, err := core.Pods(target.Namespace).Get(ctx, target.Pod, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("get pod %s/%s: %w (list them with: kubectl get pods -n %s)", target.Namespace, target.Pod, ErrPodNotFound, target.Namespace)
			}
			return fmt.Errorf("get pod %s/%s: %w: %w", target.Namespace, target.Pod, ErrAPI, err)
		}
		b.object(podPath(pod), pod, "v1", "Pod")
		b.podEvents(ctx, pod)
		if wantsMonitor(pod, b.opts) {
			b.monitor(ctx, pod)
		}
		target.Node = cmp.Or(target.Node, pod.Spec.NodeName, pod.Annotations[allocation.KeyNode])
		if target.Node == "" {
			b.missing = append(b.missing, fmt.Sprintf("nodes: pod %s/%s names no node (no spec.nodeName, no %s): no Node, node Events or device plugin log", pod.Namespace, pod.Name, allocation.KeyNode))
		}
	}
	if target.Node != "" {
		node, err := core.Nodes().Get(ctx, target.Node, metav1.GetOptions{})
		switch {
		case err == nil:
			b.object("nodes/"+node.Name+".yaml", node, "v1", "Node")
		case target.Pod != "":
			b.miss("get", "nodes", target.Node, err)
		case apierrors.IsNotFound(err):
			return fmt.Errorf("get node %s: %w (list them with: kubectl get nodes)", target.Node, ErrNodeNotFound)
		default:
			return fmt.Errorf("get node %s: %w: %w", target.Node, ErrAPI, err)
		}
		b.nodeEvents(ctx, target.Node)
	}
	b.plugin(ctx, target.Node)
	b.scheduler(ctx)
	b.config(ctx)
	return nil
}

// plugin collects the device plugin DaemonSet and, on the node, its Pod and log.
func (b *bundle) plugin(ctx context.Context, node string) {
	o := b.opts
	selector := o.PluginSelector
	ds, err := b.client.AppsV1().DaemonSets(o.Namespace).Get(ctx, o.DaemonSet, metav1.GetOptions{})
	if err != nil {
		b.miss("get", "daemonsets", o.Namespace+"/"+o.DaemonSet, err)
	} else {
		b.object(path.Join("daemonsets", ds.Namespace, ds.Name+".yaml"), ds, "apps/v1", "DaemonSet")
		if s, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector); err == nil && !s.Empty() {
			selector = s.String()
		}
	}
	if node == "" {
		return
	}
	list, err := b.client.CoreV1().Pods(o.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector,
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		b.miss("list", "pods", o.Namespace+" ("+selector+")", err)
		return
	}
	var pods []corev1.Pod
	for _, p := range list.Items {
		if p.Spec.NodeName == node {
			pods = append(pods, p)
		}
	}
	if len(pods) == 0 {
		b.missing = append(b.missing, fmt.Sprintf("pods/log %s/<device plugin Pod on %s>: no Pod of %s on node %s (selector %s)", o.Namespace, node, o.DaemonSet, node, selector))
		return
	}
	// The newest, as the node diagnosis takes it.
	slices.SortFunc(pods, func(x, y corev1.Pod) int { return x.CreationTimestamp.Compare(y.CreationTimestamp.Time) })
	p := &pods[len(pods)-1]
	b.object(podPath(p), p, "v1", "Pod")
	b.logs(ctx, p, o.PluginContainer, "PluginContainer")
}

// scheduler collects the scheduler Deployment, its Lease, and the leader Pod with its log.
func (b *bundle) scheduler(ctx context.Context) {
	o := b.opts
	selector := o.SchedulerSelector
	d, err := b.client.AppsV1().Deployments(o.Namespace).Get(ctx, o.Scheduler, metav1.GetOptions{})
	if err != nil {
		b.miss("get", "deployments", o.Namespace+"/"+o.Scheduler, err)
	} else {
		b.object(path.Join("deployments", d.Namespace, d.Name+".yaml"), d, "apps/v1", "Deployment")
		if s, err := metav1.LabelSelectorAsSelector(d.Spec.Selector); err == nil && !s.Empty() {
			selector = s.String()
		}
	}
	holder, why := "", ""
	lease, err := b.client.CoordinationV1().Leases(o.Namespace).Get(ctx, o.Lease, metav1.GetOptions{})
	if err != nil {
		b.miss("get", "leases", o.Namespace+"/"+o.Lease, err)
		why = "the Lease could not be read"
	} else {
		b.object(path.Join("leases", lease.Namespace, lease.Name+".yaml"), lease, "coordination.k8s.io/v1", "Lease")
		if lease.Spec.HolderIdentity != nil {
			holder = *lease.Spec.HolderIdentity
		}
		why = fmt.Sprintf("Lease %s/%s holder %q is none of them", o.Namespace, o.Lease, holder)
	}
	list, err := b.client.CoreV1().Pods(o.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		b.miss("list", "pods", o.Namespace+" ("+selector+")", err)
		return
	}
	pods := list.Items
	slices.SortFunc(pods, func(x, y corev1.Pod) int { return cmp.Compare(x.Name, y.Name) })
	if len(pods) == 0 {
		b.missing = append(b.missing, fmt.Sprintf("pods/log %s/<scheduler Pod>: no Pod matches %s", o.Namespace, selector))
		return
	}
	if i := slices.IndexFunc(pods, func(p corev1.Pod) bool { return isHolder(holder, p.Name) }); i >= 0 {
		b.object(podPath(&pods[i]), &pods[i], "v1", "Pod")
		b.logs(ctx, &pods[i], o.ExtenderContainer, "ExtenderContainer")
		return
	}
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	if len(pods) > maxFallbackLogs {
		pods = pods[:maxFallbackLogs]
	}
	b.missing = append(b.missing, fmt.Sprintf("the leader scheduler Pod: %s (%s); the logs of %d scheduler Pod(s) are collected instead",
		why, strings.Join(names, ", "), len(pods)))
	for i := range pods {
		b.object(podPath(&pods[i]), &pods[i], "v1", "Pod")
		b.logs(ctx, &pods[i], o.ExtenderContainer, "ExtenderContainer")
	}
}

// isHolder reports whether the Lease holder identity names the Pod: kube-scheduler writes
// "<hostname>_<uuid>", and a Pod's host name is its name.
func isHolder(holder, pod string) bool {
	return holder != "" && (holder == pod || strings.HasPrefix(holder, pod+"_"))
}

// config collects HAMi's KubeSchedulerConfiguration ConfigMap and its webhook configuration.
func (b *bundle) config(ctx context.Context) {
	o := b.opts
	cm, err := b.client.CoreV1().ConfigMaps(o.Namespace).Get(ctx, o.SchedulerConfigMap, metav1.GetOptions{})
	if err != nil {
		b.miss("get", "configmaps", o.Namespace+"/"+o.SchedulerConfigMap, err)
	} else {
		cm.BinaryData = nil
		b.object(path.Join("configmaps", cm.Namespace, cm.Name+".yaml"), cm, "v1", "ConfigMap")
	}
	wh, err := b.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, o.Webhook, metav1.GetOptions{})
	if err != nil {
		b.miss("get", "mutatingwebhookconfigurations", o.Webhook, err)
		return
	}
	b.object(path.Join("mutatingwebhookconfigurations", wh.Name+".yaml"), wh, "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration")
}

// podEvents collects the Events about the pod (this pod, not an earlier one of that name).
func (b *bundle) podEvents(ctx context.Context, pod *corev1.Pod) {
	list, err := b.client.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
		"involvedObject.kind": "Pod", "involvedObject.name": pod.Name, "involvedObject.namespace": pod.Namespace,
	}.String()})
	if err != nil {
		b.miss("list", "events", pod.Namespace+" (pod "+pod.Name+")", err)
		return
	}
	b.events(path.Join("events", "pods", pod.Namespace, pod.Name+".yaml"), list.Items, func(e *corev1.Event) bool {
		r := e.InvolvedObject
		return r.Kind == "Pod" && r.Name == pod.Name && r.Namespace == pod.Namespace && (r.UID == "" || r.UID == pod.UID)
	})
}

// nodeEvents collects the Events about the node (the kubelet writes them in "default").
func (b *bundle) nodeEvents(ctx context.Context, node string) {
	list, err := b.client.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
		"involvedObject.kind": "Node", "involvedObject.name": node,
	}.String()})
	if err != nil {
		b.miss("list", "events", "(node "+node+")", err)
		return
	}
	b.events(path.Join("events", "nodes", node+".yaml"), list.Items, func(e *corev1.Event) bool {
		return e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == node
	})
}

// events writes the events that keep holds as an EventList, oldest first.
func (b *bundle) events(p string, items []corev1.Event, keep func(*corev1.Event) bool) {
	list := &corev1.EventList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "EventList"}}
	for i := range items {
		if keep(&items[i]) {
			e := items[i].DeepCopy()
			e.ManagedFields = nil
			e.APIVersion, e.Kind = "v1", "Event"
			list.Items = append(list.Items, *e)
		}
	}
	slices.SortStableFunc(list.Items, func(x, y corev1.Event) int {
		return cmp.Or(eventTime(x).Compare(eventTime(y)), cmp.Compare(x.Namespace, y.Namespace), cmp.Compare(x.Name, y.Name))
	})
	b.marshal(p, list)
}

// logs collects the container's log, and its previous log after a restart.
func (b *bundle) logs(ctx context.Context, pod *corev1.Pod, container, option string) {
	key := pod.Namespace + "/" + pod.Name
	if b.lines < 0 {
		b.missing = append(b.missing, fmt.Sprintf("pods/log %s: log collection disabled (LogLines < 0)", key))
		return
	}
	if !slices.ContainsFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == container }) {
		var names []string
		for _, c := range pod.Spec.Containers {
			names = append(names, c.Name)
		}
		b.missing = append(b.missing, fmt.Sprintf("pods/log %s: no container %q (containers: %s); set %s", key, container, strings.Join(names, ", "), option))
		return
	}
	b.log(ctx, pod, container, false)
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == container && s.RestartCount > 0 {
			b.log(ctx, pod, container, true)
		}
	}
}

func (b *bundle) log(ctx context.Context, pod *corev1.Pod, container string, previous bool) {
	ctx, cancel := context.WithTimeout(ctx, b.opts.LogTimeout)
	defer cancel()
	lines, limit := b.lines, int64(MaxBundleLogBytes)
	raw, err := b.client.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{
		Container: container, TailLines: &lines, LimitBytes: &limit, Previous: previous,
	}).DoRaw(ctx)
	name := container + ".log"
	what := pod.Namespace + "/" + pod.Name + " container " + container
	if previous {
		name, what = container+".previous.log", what+" (previous)"
	}
	if err != nil {
		b.miss("get", "pods/log", what, err)
		return
	}
	if len(raw) > MaxBundleLogBytes {
		raw = append([]byte("[… truncated to the last bytes]\n"), raw[len(raw)-MaxBundleLogBytes:]...)
	}
	b.add(path.Join("logs", pod.Namespace, pod.Name, name), raw)
}

// object writes a copy of obj as YAML, with its type, without managedFields and kubectl's
// last-applied copy.
func (b *bundle) object(p string, obj runtime.Object, apiVersion, kind string) {
	obj = obj.DeepCopyObject()
	obj.GetObjectKind().SetGroupVersionKind(schema.FromAPIVersionAndKind(apiVersion, kind))
	switch o := obj.(type) {
	case *corev1.Pod:
		redactEnv(&o.Spec)
	case *appsv1.DaemonSet:
		redactEnv(&o.Spec.Template.Spec)
	case *appsv1.Deployment:
		redactEnv(&o.Spec.Template.Spec)
	}
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
		if a := m.GetAnnotations(); a[lastApplied] != "" {
			delete(a, lastApplied)
			m.SetAnnotations(a)
		}
	}
	b.marshal(p, obj)
}

// secretEnv matches the names of environment variables that hold credentials.
var secretEnv = regexp.MustCompile(`(?i)token|passw|secret|credential|key`)

// redactEnv replaces the literal values of the spec's credential variables (HF_TOKEN,
// DB_PASSWORD, AWS_SECRET_ACCESS_KEY); references (valueFrom) stay.
func redactEnv(spec *corev1.PodSpec) {
	for _, ctrs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range ctrs {
			for j := range ctrs[i].Env {
				if e := &ctrs[i].Env[j]; e.Value != "" && secretEnv.MatchString(e.Name) {
					e.Value = Redacted
				}
			}
		}
	}
}

func (b *bundle) marshal(p string, obj any) {
	data, err := yaml.Marshal(obj)
	if err != nil {
		b.missing = append(b.missing, fmt.Sprintf("%s: encode as YAML: %v", p, err))
		return
	}
	b.add(p, data)
}

// add stores a file, redacted.
func (b *bundle) add(p string, data []byte) { b.files[p] = Redact(data) }

// miss records what could not be read and, for a missing permission, the rule to grant.
func (b *bundle) miss(verb, resource, key string, err error) {
	// The API server's own words, without the transport's wrapping (Get "https://…": …).
	var status *apierrors.StatusError
	if errors.As(err, &status) {
		err = status
	}
	line := fmt.Sprintf("%s %s: %v", resource, key, err)
	switch {
	case apierrors.IsForbidden(err):
		line += fmt.Sprintf(" (grant %s %s)", verb, resource)
	case apierrors.IsNotFound(err):
		line += " (if HAMi is installed under another namespace or name, set the doctor's options)"
	}
	b.missing = append(b.missing, line)
}

// monitor stores what the node monitor serves about a Running GPU pod, as the JSON of a
// [MonitorScrape] (the evidence [AnalyzePod] reads in PodEvidence.Monitor).
func (b *bundle) monitor(ctx context.Context, pod *corev1.Pod) {
	m := readMonitor(ctx, b.client, b.opts, pod, nil)
	p := path.Join("monitor", pod.Namespace, pod.Name+".json")
	if m.Err != nil && m.PluginPod == "" {
		b.missing = append(b.missing, fmt.Sprintf("%s: %v", p, m.Err))
		return
	}
	if m.Err != nil {
		b.miss("get", "pods/proxy", m.PluginPod+":"+strconv.Itoa(int(m.Port))+"/metrics", m.Err)
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		b.missing = append(b.missing, fmt.Sprintf("%s: encode as JSON: %v", p, err))
		return
	}
	b.add(p, append(data, '\n'))
}

func podPath(p *corev1.Pod) string { return path.Join("pods", p.Namespace, p.Name+".yaml") }

// write writes the archive: index.txt and index.json first, then the files by path.
func (x *BundleIndex) write(w io.Writer, files map[string][]byte) error {
	for i, m := range x.Missing {
		x.Missing[i] = string(Redact([]byte(m)))
	}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	paths = append([]string{"index.txt", "index.json"}, paths...)
	x.Files = make([]string, len(paths))
	for i, p := range paths {
		x.Files[i] = x.Root + "/" + p
	}
	js, err := json.MarshalIndent(x, "", "  ")
	if err != nil {
		return fmt.Errorf("encode bundle index: %w", err)
	}
	files["index.txt"], files["index.json"] = []byte(x.Text()), append(js, '\n')

	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	gz.ModTime = x.Created
	tw := tar.NewWriter(gz)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: x.Root + "/", Mode: 0o755, ModTime: x.Created}); err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	for i, p := range paths {
		data := files[p]
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: x.Files[i], Mode: 0o644, Size: int64(len(data)), ModTime: x.Created}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("write bundle: %w", err)
		}
		if _, err := tw.Write(data); err != nil {
			return fmt.Errorf("write bundle: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	if err := gz.Close(); err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	if _, err := w.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	return nil
}

// safeName keeps letters, digits, '.', '-' and '_' of s and turns the rest into '_'.
func safeName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
			return r
		}
		return '_'
	}, s)
}

// BundleClusterRoleRules returns the read-only RBAC rules [WriteBundle] needs for a complete
// bundle: get nodes; get and list pods and get their logs; get pods/proxy (the node
// monitor's /metrics for a Running GPU pod); list events; get configmaps, the device plugin
// DaemonSet, the scheduler Deployment, its Lease and MutatingWebhookConfigurations. No rule on secrets. Without one of them the bundle says in
// its index what it could not collect; only the rule on the target (nodes, or pods) is
// indispensable.
//
// As a manifest:
//
//	apiVersion: rbac.authorization.k8s.io/v1
//	kind: ClusterRole
//	metadata:
//	  name: hami-doctor-bundle
//	rules:
//	- apiGroups: [""]
//	  resources: [nodes, configmaps]
//	  verbs: [get]
//	- apiGroups: [""]
//	  resources: [pods]
//	  verbs: [get, list]
//	- apiGroups: [""]
//	  resources: [pods/log, pods/proxy]
//	  verbs: [get]
//	- apiGroups: [""]
//	  resources: [events]
//	  verbs: [list]
//	- apiGroups: [apps]
//	  resources: [daemonsets, deployments]
//	  verbs: [get]
//	- apiGroups: [coordination.k8s.io]
//	  resources: [leases]
//	  verbs: [get]
//	- apiGroups: [admissionregistration.k8s.io]
//	  resources: [mutatingwebhookconfigurations]
//	  verbs: [get]
func BundleClusterRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes", "configmaps"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{""}, Resources: []string{"pods/log", "pods/proxy"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"list"}},
		{APIGroups: []string{"apps"}, Resources: []string{"daemonsets", "deployments"}, Verbs: []string{"get"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get"}},
		{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"mutatingwebhookconfigurations"}, Verbs: []string{"get"}},
	}
}
