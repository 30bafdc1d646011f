package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/hamireg/hamireg/diagnose"
)

const nodeUsage = `Usage:
  {cmd} node NAME [flags]   diagnose one node: the three channels, the case (1-5) and the fix
  {cmd} nodes [flags]       one line per GPU node

Exit status: 0 when healthy, 1 when a case applies, 2 on errors.
`

// oneName returns the single positional argument of a verb.
func oneName(fs *pflag.FlagSet, what string) (string, error) {
	switch fs.NArg() {
	case 1:
		return fs.Arg(0), nil
	case 0:
		return "", fmt.Errorf("%w: no %s given", errUsage, what)
	}
	return "", fmt.Errorf("%w: unexpected arguments %q (give one %s)", errUsage, fs.Args()[1:], what)
}

func (c *cli) nodeCmd(args []string) int {
	fs, f := c.newClusterFlags("node", nodeUsage)
	if err := parse(fs, args); err != nil {
		return c.fail("node", fs, err)
	}
	name, err := oneName(fs, "node name")
	if err != nil {
		return c.fail("node", fs, err)
	}
	client, err := c.client(f)
	if err != nil {
		return c.fail("node", fs, err)
	}
	ctx, cancel := f.context(c.ctx)
	defer cancel()
	r, err := diagnose.Node(ctx, client, name, f.opts)
	if err != nil {
		return c.fail("node", nil, err)
	}
	return c.show("node", f.output, document{kindNodeReport, r}, func() { printReport(c.stdout, r) }, r.Case != diagnose.Healthy)
}

func (c *cli) nodesCmd(args []string) int {
	fs, f := c.newClusterFlags("nodes", nodeUsage)
	if err := parse(fs, args); err != nil {
		return c.fail("nodes", fs, err)
	}
	if fs.NArg() > 0 {
		return c.fail("nodes", fs, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args()))
	}
	client, err := c.client(f)
	if err != nil {
		return c.fail("nodes", fs, err)
	}
	ctx, cancel := f.context(c.ctx)
	defer cancel()
	reports, err := diagnose.Nodes(ctx, client, f.opts)
	if err != nil {
		return c.fail("nodes", nil, err)
	}
	if reports == nil {
		reports = []diagnose.Report{}
	}
	// No GPU node at all is a case too: nothing registers.
	caseApplies := len(reports) == 0 || slices.ContainsFunc(reports, func(r diagnose.Report) bool { return r.Case != diagnose.Healthy })
	return c.show("nodes", f.output, list(kindNodeReportList, reports), func() { printNodes(c.stdout, c.name, reports, f.opts) }, caseApplies)
}

func printNodes(w io.Writer, name string, reports []diagnose.Report, opts diagnose.Options) {
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
	fmt.Fprintf(w, "\nDetails and fixes: %s node NAME\n", name)
}

func countCell(r *diagnose.Report) string {
	return fmt.Sprintf("%s(%d)", r.Count.State, r.Count.Allocatable)
}

func printReport(w io.Writer, r *diagnose.Report) {
	fmt.Fprintf(w, "Node %s: %s\n", r.Node, r.Case.Describe())
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
			where = f.Case.Short()
		}
		printFinding(w, f.Severity, where, f.Code, f.Summary, f.Evidence, f.Fix)
		if len(f.OnNode) > 0 {
			fmt.Fprintf(w, "      on node %s (not visible from the API server):\n", r.Node)
			for _, c := range f.OnNode {
				fmt.Fprintf(w, "                %s\n", c)
			}
		}
	}
}

// indentLines indents the second and later lines of s under the text of a finding's line.
func indentLines(s string) string {
	return strings.ReplaceAll(s, "\n", "\n                ")
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

// printFinding prints one finding of a node or a pod report: the severity, the case it
// belongs to ("" for none), the code and summary, then its evidence and fix lines.
func printFinding(w io.Writer, sev diagnose.Severity, where, code, summary string, evidence, fix []string) {
	if where != "" {
		where = " " + where
	}
	fmt.Fprintf(w, "  [%s]%s %s: %s\n", sev, where, code, summary)
	for _, e := range evidence {
		fmt.Fprintf(w, "      evidence: %s\n", indentLines(e))
	}
	for _, c := range fix {
		fmt.Fprintf(w, "      fix:      %s\n", indentLines(c))
	}
}
