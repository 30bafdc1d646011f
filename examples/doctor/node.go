package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/handshake"
)

// Exit statuses of node and nodes.
const (
	exitHealthy = 0
	exitCase    = 1
	exitError   = 2
)

const nodeUsage = `Usage:
  doctor node NAME [flags]   diagnose one node: the three channels, the case (1-5) and the fix
  doctor nodes [flags]       one line per GPU node

Exit status: 0 when healthy, 1 when a case applies, 2 on errors.
`

// clusterFlags are the flags shared by node and nodes.
type clusterFlags struct {
	kubeconfig, context, output, vendor, resource, hamiVersion string
	timeout                                                    time.Duration
	opts                                                       diagnose.Options
}

func newClusterFlags(name string, stderr io.Writer) (*flag.FlagSet, *clusterFlags) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &clusterFlags{}
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig `FILE` (default $KUBECONFIG, ~/.kube/config, then the in-cluster config)")
	fs.StringVar(&f.context, "context", "", "kubeconfig context to use")
	fs.StringVar(&f.output, "o", "text", "output format: text or json")
	fs.StringVar(&f.opts.Namespace, "namespace", diagnose.DefaultNamespace, "namespace HAMi is installed in")
	fs.StringVar(&f.opts.DaemonSet, "daemonset", diagnose.DefaultDaemonSet, "device plugin DaemonSet")
	fs.StringVar(&f.opts.PluginSelector, "plugin-selector", diagnose.DefaultPluginSelector, "label selector of the device plugin Pods (when the DaemonSet cannot be read)")
	fs.StringVar(&f.opts.PluginContainer, "plugin-container", diagnose.DefaultPluginContainer, "device plugin container name")
	fs.StringVar(&f.opts.Scheduler, "scheduler", diagnose.DefaultScheduler, "HAMi scheduler Deployment")
	fs.StringVar(&f.opts.SchedulerSelector, "scheduler-selector", diagnose.DefaultSchedulerSelector, "label selector of the scheduler Pods")
	fs.StringVar(&f.opts.Lease, "lease", diagnose.DefaultLease, "Lease held by the scheduler's kube-scheduler")
	fs.StringVar(&f.vendor, "vendor", annotation.VendorNVIDIA, "HAMi vendor word to check")
	fs.StringVar(&f.resource, "resource", "", "extended resource name (default the vendor's, nvidia.com/gpu)")
	fs.StringVar(&f.hamiVersion, "hami-version", "master", "scheduler semantics for the handshake: master or v2.9.0")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "overall time limit")
	return fs, f
}

func (f *clusterFlags) complete() error {
	if f.output != "text" && f.output != "json" {
		return fmt.Errorf("unknown output format %q (text or json)", f.output)
	}
	vendor, ok := annotation.VendorByName(f.vendor)
	if !ok {
		vendor, ok = vendorByChip(f.vendor)
	}
	if !ok {
		return fmt.Errorf("unknown vendor %q", f.vendor)
	}
	f.opts.Vendor = vendor
	f.opts.ResourceName = f.resource
	switch f.hamiVersion {
	case "master", "":
	case "v2.9.0", "2.9.0":
		f.opts.HAMiVersion = handshake.VersionV290
	default:
		return fmt.Errorf("unknown --hami-version %q (master or v2.9.0)", f.hamiVersion)
	}
	return nil
}

// connect checks the flags and makes the client.
func (f *clusterFlags) connect() (kubernetes.Interface, error) {
	if err := f.complete(); err != nil {
		return nil, err
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: f.context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w (give --kubeconfig, or run in a Pod)", err)
	}
	cfg.UserAgent = "hamireg-doctor"
	return kubernetes.NewForConfig(cfg)
}

func nodeCmd(args []string, stdout, stderr io.Writer) int {
	fs, f := newClusterFlags("node", stderr)
	fs.Usage = func() { fmt.Fprint(stderr, nodeUsage, "\nFlags:\n"); fs.PrintDefaults() }
	name, rest := "", args
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		name, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		return exitError
	}
	if name == "" && fs.NArg() == 1 {
		name = fs.Arg(0)
	} else if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "doctor node: unexpected arguments %q\n", fs.Args())
		return exitError
	}
	if name == "" {
		fmt.Fprint(stderr, "doctor node: no node name given\n\n", nodeUsage)
		return exitError
	}
	client, err := f.connect()
	if err != nil {
		fmt.Fprintf(stderr, "doctor node: %v\n", err)
		return exitError
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	r, err := diagnose.Node(ctx, client, name, f.opts)
	if err != nil {
		fmt.Fprintf(stderr, "doctor node: %v\n", err)
		return exitError
	}
	if f.output == "json" {
		if err := writeJSON(stdout, r); err != nil {
			fmt.Fprintf(stderr, "doctor node: %v\n", err)
			return exitError
		}
	} else {
		printReport(stdout, r)
	}
	if r.Case != diagnose.Healthy {
		return exitCase
	}
	return exitHealthy
}

func nodesCmd(args []string, stdout, stderr io.Writer) int {
	fs, f := newClusterFlags("nodes", stderr)
	fs.Usage = func() { fmt.Fprint(stderr, nodeUsage, "\nFlags:\n"); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		return exitError
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "doctor nodes: unexpected arguments %q\n", fs.Args())
		return exitError
	}
	client, err := f.connect()
	if err != nil {
		fmt.Fprintf(stderr, "doctor nodes: %v\n", err)
		return exitError
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	reports, err := diagnose.Nodes(ctx, client, f.opts)
	if err != nil {
		fmt.Fprintf(stderr, "doctor nodes: %v\n", err)
		return exitError
	}
	if f.output == "json" {
		if reports == nil {
			reports = []diagnose.Report{}
		}
		if err := writeJSON(stdout, reports); err != nil {
			fmt.Fprintf(stderr, "doctor nodes: %v\n", err)
			return exitError
		}
	} else {
		printNodes(stdout, reports, f.opts)
	}
	if len(reports) == 0 {
		return exitCase
	}
	for _, r := range reports {
		if r.Case != diagnose.Healthy {
			return exitCase
		}
	}
	return exitHealthy
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write JSON: %w", err)
	}
	return nil
}

func printNodes(w io.Writer, reports []diagnose.Report, opts diagnose.Options) {
	if len(reports) == 0 {
		fmt.Fprintf(w, "No node looks like a GPU node: none carries the register annotation, the resource, a device plugin Pod or the DaemonSet's nodeSelector labels (gpu=on in HAMi's chart).\n")
		fmt.Fprintf(w, "Label GPU nodes, e.g.: kubectl label node <node> gpu=on   (namespace checked: %s)\n", cmp.Or(opts.Namespace, diagnose.DefaultNamespace))
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tPLUGIN\tCOUNT\tSPEC\tHANDSHAKE\tCASE\tREASON")
	for _, r := range reports {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Node, r.Plugin.State, countCell(&r), r.Spec.State, r.Handshake.State, r.Case.Short(), r.Reason)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "\nDetails and fixes: doctor node NAME")
}

func countCell(r *diagnose.Report) string {
	return fmt.Sprintf("%s(%d)", r.Count.State, r.Count.Allocatable)
}

func printReport(w io.Writer, r *diagnose.Report) {
	fmt.Fprintf(w, "Node %s: %s\n", r.Node, r.Case)
	fmt.Fprintf(w, "  %s\n\n", r.Reason)

	fmt.Fprintln(w, "Channels")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  plugin\t%s\t%s\n", r.Plugin.State, pluginText(&r.Plugin))
	fmt.Fprintf(tw, "  count\t%s\t%s\n", r.Count.State, countText(&r.Count))
	fmt.Fprintf(tw, "  spec\t%s\t%s\n", r.Spec.State, specText(&r.Spec))
	fmt.Fprintf(tw, "  handshake\t%s\t%s\n", r.Handshake.State, handshakeText(&r.Handshake))
	fmt.Fprintf(tw, "  scheduler\t\t%s\n", schedulerText(&r.Scheduler))
	_ = tw.Flush()

	if len(r.Findings) == 0 {
		return
	}
	fmt.Fprintln(w, "\nFindings")
	for _, f := range r.Findings {
		where := ""
		if f.Case != diagnose.Healthy {
			where = " " + f.Case.Short()
		}
		fmt.Fprintf(w, "  [%s]%s %s: %s\n", f.Severity, where, f.Code, f.Summary)
		for _, e := range f.Evidence {
			fmt.Fprintf(w, "      evidence: %s\n", indentLines(e, "                "))
		}
		for _, c := range f.Fix {
			fmt.Fprintf(w, "      fix:      %s\n", indentLines(c, "                "))
		}
		if len(f.OnNode) > 0 {
			fmt.Fprintf(w, "      on node %s (not visible from the API server):\n", r.Node)
			for _, c := range f.OnNode {
				fmt.Fprintf(w, "                %s\n", c)
			}
		}
	}
}

func indentLines(s, indent string) string {
	return strings.ReplaceAll(s, "\n", "\n"+indent)
}

func pluginText(p *diagnose.PluginChannel) string {
	ds := p.DaemonSet
	if ds == "" {
		ds = "DaemonSet not found"
	} else {
		ds = "DaemonSet " + ds
	}
	if len(p.Pods) == 0 {
		return ds + ", no Pod on the node"
	}
	var pods []string
	for _, pod := range p.Pods {
		s := fmt.Sprintf("Pod %s %s", pod.Name, pod.Phase)
		if pod.Reason != "" {
			s += " (" + pod.Reason + ")"
		}
		if pod.Ready {
			s += ", ready"
		}
		if pod.Restarts > 0 {
			s += fmt.Sprintf(", %d restarts", pod.Restarts)
		}
		pods = append(pods, s)
	}
	return ds + ", " + strings.Join(pods, "; ")
}

func countText(c *diagnose.CountChannel) string {
	s := fmt.Sprintf("allocatable %s = %d (capacity %d)", c.Resource, c.Allocatable, c.Capacity)
	if c.Physical > 0 {
		s += fmt.Sprintf("; annotation: %d GPU(s) × split %d = %d", c.Physical, c.Split, c.Expected)
	}
	return s
}

func specText(s *diagnose.SpecChannel) string {
	switch {
	case !s.Present:
		return s.Key + " absent"
	case s.Error != "":
		return s.Key + ": " + s.Error
	}
	return fmt.Sprintf("%s: %d device(s), %d unhealthy", s.Key, len(s.Devices), s.Unhealthy)
}

func handshakeText(h *diagnose.HandshakeChannel) string {
	if h.Key == "" {
		return h.Reason
	}
	v := "absent"
	if h.Present {
		v = fmt.Sprintf("%q", h.Value)
	}
	s := fmt.Sprintf("%s %s (%s", h.Key, v, h.Parsed)
	if h.Age != 0 {
		s += fmt.Sprintf(", %v old", h.Age)
	}
	return s + "): " + h.Reason
}

func schedulerText(s *diagnose.SchedulerInfo) string {
	var parts []string
	if s.Deployment != "" {
		parts = append(parts, "Deployment "+s.Deployment)
	} else {
		parts = append(parts, "Deployment not found")
	}
	if len(s.NodeLabelSelector) > 0 {
		var kv []string
		for k, v := range s.NodeLabelSelector {
			kv = append(kv, k+"="+v)
		}
		slices.Sort(kv)
		parts = append(parts, "--node-label-selector "+strings.Join(kv, ","))
	}
	switch {
	case s.Lease == "":
		parts = append(parts, "no leader election")
	case s.Leader == "":
		parts = append(parts, "no leader (Lease "+s.Lease+" missing or unheld)")
	case s.LeaderPod != "":
		parts = append(parts, fmt.Sprintf("leader Pod %s (Lease valid: %v)", s.LeaderPod, s.LeaseValid))
	default:
		parts = append(parts, fmt.Sprintf("Lease holder %q (valid: %v)", s.Leader, s.LeaseValid))
	}
	return strings.Join(parts, ", ")
}
