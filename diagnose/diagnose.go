package diagnose

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Node diagnoses one node: it reads the Node, the device plugin DaemonSet and its Pods on the
// node, the scheduler Deployment, its Lease and Pods, and asks the API server whether the
// plugin's ServiceAccount may patch nodes. Problems in the cluster are findings in the report;
// the error is non-nil only when the node cannot be read (errors.Is ErrNodeNotFound, ErrAPI) or
// the options are invalid (ErrInvalidOptions).
//
// The identity behind client needs the read-only rules of [ClusterRoleRules]; whatever it may
// not read becomes a "NotChecked" finding rather than an error.
func Node(ctx context.Context, client kubernetes.Interface, nodeName string, opts Options) (*Report, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("get node %s: %w (list them with: kubectl get nodes)", nodeName, ErrNodeNotFound)
		}
		return nil, fmt.Errorf("get node %s: %w: %w", nodeName, ErrAPI, err)
	}
	c := gather(ctx, client, opts, nodeName)
	r := c.analyze(ctx, node)
	return &r, nil
}

// Nodes diagnoses every node that looks like a GPU node: it carries the vendor's register or
// handshake annotation, has the resource in its capacity, matches the device plugin
// DaemonSet's nodeSelector, or runs a device plugin Pod. Reports are sorted by node name.
func Nodes(ctx context.Context, client kubernetes.Interface, opts Options) ([]Report, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w: %w", ErrAPI, err)
	}
	c := gather(ctx, client, opts, "")
	var out []Report
	for i := range list.Items {
		n := &list.Items[i]
		if !c.looksLikeGPUNode(n) {
			continue
		}
		out = append(out, c.analyze(ctx, n))
	}
	slices.SortFunc(out, func(a, b Report) int { return cmp.Compare(a.Node, b.Node) })
	return out, nil
}

func (c *cluster) looksLikeGPUNode(n *corev1.Node) bool {
	v := c.opts.Vendor
	if _, ok := n.Annotations[v.RegisterKey]; ok {
		return true
	}
	if _, ok := n.Annotations[v.HandshakeKey]; ok && v.HandshakeKey != "" {
		return true
	}
	if _, ok := n.Status.Capacity[corev1.ResourceName(c.opts.ResourceName)]; ok {
		return true
	}
	if len(c.podsOn(n.Name)) > 0 {
		return true
	}
	if c.ds != nil {
		sel := c.ds.Spec.Template.Spec.NodeSelector
		if len(sel) > 0 && len(matchesSelector(n.Labels, sel)) == 0 {
			return true
		}
	}
	return false
}

// analyze builds the report of one node from what was gathered.
func (c *cluster) analyze(ctx context.Context, node *corev1.Node) Report {
	r := Report{Node: node.Name, Vendor: c.opts.Vendor.Name, Checked: c.opts.Clock.Now()}
	a := &analysis{c: c, node: node, r: &r}
	a.observeSpec()
	a.observeCount()
	a.observeHandshake()
	a.checkPlugin(ctx)
	a.checkCount()
	a.checkSpec(ctx)
	a.checkScheduler()
	a.checkHandshake()
	a.finish()
	return r
}

type analysis struct {
	c    *cluster
	node *corev1.Node
	r    *Report

	pods       []corev1.Pod
	running    bool // a plugin Pod's plugin container is running
	notRunning bool // a plugin Pod exists and none runs
}

// add records f; a finding without a case is a note outside any case (Healthy).
func (a *analysis) add(f Finding) { a.r.Findings = append(a.r.Findings, f.withCase()) }

// finish orders the findings and sets the case and the reason.
func (a *analysis) finish() {
	rank := map[Severity]int{SeverityError: 0, SeverityWarning: 1, SeverityInfo: 2}
	slices.SortStableFunc(a.r.Findings, func(x, y Finding) int {
		if d := cmp.Compare(rank[x.Severity], rank[y.Severity]); d != 0 {
			return d
		}
		return cmp.Compare(x.Case.rank(), y.Case.rank())
	})
	for _, f := range a.r.Findings {
		if f.Severity == SeverityError {
			a.r.Case, a.r.Reason = f.Case, f.Summary
			return
		}
	}
	a.r.Case = Healthy
	healthy := len(a.r.Spec.Devices) - a.r.Spec.Unhealthy
	a.r.Reason = fmt.Sprintf("%s %d allocatable, %d healthy device(s) in %s, handshake %s",
		a.r.Count.Resource, a.r.Count.Allocatable, healthy, a.r.Spec.Key, a.r.Handshake.Parsed)
}

// errorIn reports whether an error finding of the case was recorded.
func (a *analysis) errorIn(cs Case) bool {
	return slices.ContainsFunc(a.r.Findings, func(f Finding) bool { return f.Severity == SeverityError && f.Case == cs })
}

// earlierError reports whether an error of a case before cs was recorded: then cs's channel
// is broken as a consequence, and its own findings would only repeat the cause.
func (a *analysis) earlierError(cs Case) bool {
	return slices.ContainsFunc(a.r.Findings, func(f Finding) bool { return f.Severity == SeverityError && f.Case.rank() < cs.rank() })
}
