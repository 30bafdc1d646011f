package diagnose

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
)

// cluster is what is read once for any number of nodes.
type cluster struct {
	opts   Options
	client kubernetes.Interface

	ds    *appsv1.DaemonSet
	dsErr error

	// podsByNode holds the device plugin Pods (of every node, or of the one node asked for)
	// by node name, oldest first.
	podsByNode map[string][]corev1.Pod
	podsErr    error

	deploy    *appsv1.Deployment
	deployErr error
	// selector is the scheduler's --node-label-selector; selectorFrom names where it came
	// from; leaderElect is false when the extender runs with --leader-elect=false.
	selector     map[string]string
	selectorFrom string
	selectorErr  error
	leaderElect  bool

	lease    *coordinationv1.Lease
	leaseErr error

	schedPods    []corev1.Pod
	schedPodsErr error

	runtimeClasses map[string]string // name → handler
	rcErr          error

	// readLog reads a container's previous log: previousLog, or a stand-in in tests (the
	// fake clientset's log is a fixed text).
	readLog func(ctx context.Context, pod *corev1.Pod, container string) (string, error)

	// sar caches the "patch nodes" answer for the plugin's ServiceAccount.
	sarDone    bool
	sarAllowed bool
	sarReason  string
	sarErr     error
}

// gather reads the cluster-wide objects. Failures are kept per object and become findings;
// only node reads fail the whole diagnosis.
func gather(ctx context.Context, client kubernetes.Interface, opts Options, nodeName string) *cluster {
	c := &cluster{opts: opts, client: client, leaderElect: true}
	c.readLog = c.previousLog
	ns := opts.Namespace

	c.ds, c.dsErr = client.AppsV1().DaemonSets(ns).Get(ctx, opts.DaemonSet, metav1.GetOptions{})
	if c.dsErr != nil {
		c.ds = nil
	}

	selector := opts.PluginSelector
	if c.ds != nil && c.ds.Spec.Selector != nil {
		if s, err := metav1.LabelSelectorAsSelector(c.ds.Spec.Selector); err == nil && !s.Empty() {
			selector = s.String()
		}
	}
	listOpts := metav1.ListOptions{LabelSelector: selector}
	if nodeName != "" {
		listOpts.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
	}
	if list, err := client.CoreV1().Pods(ns).List(ctx, listOpts); err != nil {
		c.podsErr = err
	} else {
		c.podsByNode = map[string][]corev1.Pod{}
		for _, p := range list.Items {
			c.podsByNode[p.Spec.NodeName] = append(c.podsByNode[p.Spec.NodeName], p)
		}
		for _, pods := range c.podsByNode {
			slices.SortFunc(pods, func(a, b corev1.Pod) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
		}
	}

	c.deploy, c.deployErr = client.AppsV1().Deployments(ns).Get(ctx, opts.Scheduler, metav1.GetOptions{})
	if c.deployErr != nil {
		c.deploy = nil
	}
	switch {
	case opts.NodeLabelSelector != nil:
		c.selector, c.selectorFrom = opts.NodeLabelSelector, "the NodeLabelSelector option"
	case c.deploy != nil:
		c.selector, c.leaderElect, c.selectorErr = schedulerArgs(c.deploy, opts.ExtenderContainer)
		c.selectorFrom = fmt.Sprintf("--node-label-selector of Deployment %s/%s", ns, opts.Scheduler)
	}

	c.lease, c.leaseErr = client.CoordinationV1().Leases(ns).Get(ctx, opts.Lease, metav1.GetOptions{})
	if c.leaseErr != nil {
		c.lease = nil
	}
	if list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: opts.SchedulerSelector}); err != nil {
		c.schedPodsErr = err
	} else {
		c.schedPods = list.Items
	}

	if list, err := client.NodeV1().RuntimeClasses().List(ctx, metav1.ListOptions{}); err != nil {
		c.rcErr = err
	} else {
		c.runtimeClasses = make(map[string]string, len(list.Items))
		for _, rc := range list.Items {
			c.runtimeClasses[rc.Name] = rc.Handler
		}
	}
	return c
}

// podsOn returns the plugin Pods bound to the node, oldest first.
func (c *cluster) podsOn(node string) []corev1.Pod { return c.podsByNode[node] }

// serviceAccount is the plugin's ServiceAccount name.
func (c *cluster) serviceAccount() string {
	if c.ds != nil && c.ds.Spec.Template.Spec.ServiceAccountName != "" {
		return c.ds.Spec.Template.Spec.ServiceAccountName
	}
	return c.opts.ServiceAccount
}

// canPatchNodes asks the API server whether the plugin's ServiceAccount may patch nodes.
func (c *cluster) canPatchNodes(ctx context.Context) (allowed bool, reason string, err error) {
	if c.sarDone {
		return c.sarAllowed, c.sarReason, c.sarErr
	}
	c.sarDone = true
	user := "system:serviceaccount:" + c.opts.Namespace + ":" + c.serviceAccount()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + c.opts.Namespace, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: "patch", Resource: "nodes", Version: "v1",
		},
	}}
	got, err := c.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		c.sarErr = err
		return false, "", err
	}
	c.sarAllowed, c.sarReason = got.Status.Allowed, got.Status.Reason
	if got.Status.EvaluationError != "" {
		c.sarReason = strings.TrimSpace(c.sarReason + " " + got.Status.EvaluationError)
	}
	return c.sarAllowed, c.sarReason, nil
}

// previousLog reads the tail of the container's previous (crashed) log; the API server
// proxies this to the node's kubelet, so it fails where the kubelet cannot be reached.
func (c *cluster) previousLog(ctx context.Context, pod *corev1.Pod, container string) (string, error) {
	if c.opts.LogTail < 0 {
		return "", errors.New("log reads disabled")
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.LogTimeout)
	defer cancel()
	tail := c.opts.LogTail
	b, err := c.client.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{
		Container: container, Previous: true, TailLines: &tail,
	}).DoRaw(ctx)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// schedulerArgs reads --node-label-selector and --leader-elect from the scheduler
// Deployment's extender container (or from every container when that one is absent).
func schedulerArgs(d *appsv1.Deployment, extender string) (selector map[string]string, leaderElect bool, err error) {
	containers := d.Spec.Template.Spec.Containers
	if i := slices.IndexFunc(containers, func(c corev1.Container) bool { return c.Name == extender }); i >= 0 {
		containers = containers[i : i+1]
	}
	leaderElect = true
	for _, ctr := range containers {
		args := append(slices.Clone(ctr.Command), ctr.Args...)
		for i := 0; i < len(args); i++ {
			name, value, hasValue := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
			if !strings.HasPrefix(args[i], "-") {
				continue
			}
			switch name {
			case "node-label-selector":
				if !hasValue && i+1 < len(args) {
					i++
					value = args[i]
				}
				m, perr := parseStringToString(value)
				if perr != nil {
					return nil, leaderElect, fmt.Errorf("container %s: --node-label-selector=%q: %w", ctr.Name, value, perr)
				}
				if selector == nil {
					selector = map[string]string{}
				}
				for k, v := range m {
					selector[k] = v
				}
			case "leader-elect":
				if hasValue && strings.EqualFold(value, "false") {
					leaderElect = false
				}
			}
		}
	}
	return selector, leaderElect, nil
}

// parseStringToString reads "k=v,k2=v2" the way pflag's StringToString does (HAMi's flag type).
func parseStringToString(s string) (map[string]string, error) {
	s = strings.Trim(s, `"'`)
	out := map[string]string{}
	if s == "" {
		return out, nil
	}
	for _, pair := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(pair, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("%q is not key=value", pair)
		}
		out[k] = v
	}
	return out, nil
}

// matchesSelector reports whether labels carry every key=value of sel, and which do not.
func matchesSelector(nodeLabels, sel map[string]string) (missing []string) {
	for _, k := range sortedKeys(sel) {
		if got, ok := nodeLabels[k]; !ok || got != sel[k] {
			missing = append(missing, k+"="+sel[k])
		}
	}
	return missing
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// notChecked turns a read failure into a finding that says what could not be seen and why.
func notChecked(what, resource string, err error) Finding {
	f := Finding{Severity: SeverityInfo, Code: CodeNotChecked,
		Summary:  "could not read " + what,
		Evidence: []string{err.Error()}}
	if apierrors.IsForbidden(err) {
		f.Fix = []string{"grant the doctor's identity read access: kubectl auth can-i get " + resource + " -n <namespace>"}
	}
	return f
}

// selectorString renders a label map as k=v,k2=v2 in key order.
func selectorString(m map[string]string) string {
	return labels.SelectorFromSet(m).String()
}

// leaseState reads a Lease as leader election does: its holder, when it was last renewed
// (or acquired) and how long that holds (15 s, client-go's default, when unset).
func leaseState(l *coordinationv1.Lease) (holder string, renewed time.Time, dur time.Duration) {
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	dur = 15 * time.Second
	if l.Spec.LeaseDurationSeconds != nil {
		dur = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	switch {
	case l.Spec.RenewTime != nil:
		renewed = l.Spec.RenewTime.Time
	case l.Spec.AcquireTime != nil:
		renewed = l.Spec.AcquireTime.Time
	}
	return holder, renewed, dur
}
