package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/hamireg/hamireg/diagnose"
)

const podUsage = `Usage:
  {cmd} pod NAME [-n NAMESPACE] [flags]   diagnose one GPU pod: stage S0-S4, case P1-P12, fixes
  {cmd} pod NAMESPACE/NAME [flags]
  {cmd} pods [-n NAMESPACE | -A] [flags]  one line per GPU pod that is not running

-n is the pod's namespace (default the kubeconfig context's); --hami-namespace is where HAMi
is installed. For a Running pod, pod also shows its GPU usage against its limits, read from
the node monitor's /metrics on the device plugin Pod of its node through the API server's pod
proxy (needs get pods/proxy): the Pod's container port named metrics or monitor, else 9394,
or --monitor-port (-1 reads no monitor).
Exit status: 0 when no case applies, 1 when one does, 2 on errors.
`

// monitorFlags adds the flags that say where the node monitor listens.
func monitorFlags(fs *pflag.FlagSet, f *clusterFlags) {
	fs.Int32Var(&f.opts.MonitorPort, "monitor-port", 0, "node monitor port on the device plugin Pod (default its port named metrics or monitor, else 9394; -1: do not read it)")
	fs.DurationVar(&f.opts.MonitorTimeout, "monitor-timeout", diagnose.DefaultMonitorTimeout, "time limit of the node monitor read")
}

// podTarget splits "NAMESPACE/NAME" or "NAME" (in the namespace of -n or the kubeconfig).
func podTarget(f *clusterFlags, arg string) (namespace, name string, err error) {
	ns, name, qualified := strings.Cut(arg, "/")
	if !qualified {
		ns, name = "", arg
	}
	if name == "" || (qualified && ns == "") || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("%w: pod %q: give NAME or NAMESPACE/NAME", errUsage, arg)
	}
	if qualified {
		if f.kube.Namespace != nil && *f.kube.Namespace != "" && *f.kube.Namespace != ns {
			return "", "", fmt.Errorf("%w: pod %q is in namespace %s, but -n says %s: give one of them", errUsage, arg, ns, *f.kube.Namespace)
		}
		return ns, name, nil
	}
	ns, err = f.podNamespace()
	return ns, name, err
}

func (c *cli) podCmd(args []string) int {
	fs, f := c.newClusterFlags("pod", podUsage)
	monitorFlags(fs, f)
	if err := parse(fs, args); err != nil {
		return c.fail("pod", fs, err)
	}
	arg, err := oneName(fs, "pod name")
	if err != nil {
		return c.fail("pod", fs, err)
	}
	ns, name, err := podTarget(f, arg)
	if err != nil {
		return c.fail("pod", fs, err)
	}
	client, err := c.client(f)
	if err != nil {
		return c.fail("pod", fs, err)
	}
	ctx, cancel := f.context(c.ctx)
	defer cancel()
	r, err := diagnose.Pod(ctx, client, ns, name, f.opts)
	if err != nil {
		return c.fail("pod", nil, err)
	}
	return c.show("pod", f.output, document{kindPodReport, r}, func() { printPodReport(c.stdout, r) }, r.Case != diagnose.Healthy)
}

func (c *cli) podsCmd(args []string) int {
	fs, f := c.newClusterFlags("pods", podUsage)
	all := fs.BoolP("all-namespaces", "A", false, "every namespace (instead of -n or the kubeconfig's)")
	if err := parse(fs, args); err != nil {
		return c.fail("pods", fs, err)
	}
	if fs.NArg() > 0 {
		return c.fail("pods", fs, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args()))
	}
	ns := ""
	if !*all {
		var err error
		if ns, err = f.podNamespace(); err != nil {
			return c.fail("pods", fs, err)
		}
	} else if f.kube.Namespace != nil && *f.kube.Namespace != "" {
		return c.fail("pods", fs, fmt.Errorf("%w: give -n NAMESPACE or -A, not both", errUsage))
	}
	client, err := c.client(f)
	if err != nil {
		return c.fail("pods", fs, err)
	}
	ctx, cancel := f.context(c.ctx)
	defer cancel()
	reports, err := diagnose.Pods(ctx, client, ns, f.opts)
	if err != nil {
		return c.fail("pods", nil, err)
	}
	if reports == nil {
		reports = []diagnose.PodReport{}
	}
	caseApplies := slices.ContainsFunc(reports, func(r diagnose.PodReport) bool { return r.Case != diagnose.Healthy })
	return c.show("pods", f.output, list(kindPodReportList, reports), func() { printPods(c.stdout, c.name, ns, reports) }, caseApplies)
}

// printPods prints one line per pod: NAMESPACE NAME PHASE STAGE CASE REASON.
func printPods(w io.Writer, name, namespace string, reports []diagnose.PodReport) {
	if len(reports) == 0 {
		where := "in namespace " + namespace
		if namespace == "" {
			where = "in any namespace"
		}
		fmt.Fprintf(w, "No GPU pod %s that is not Running or Succeeded.\n", where)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tNAME\tPHASE\tSTAGE\tCASE\tREASON")
	for _, r := range reports {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Namespace, r.Name, orDash(r.Phase), r.Stage, r.Case, r.Reason)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nDetails and fixes: %s pod NAMESPACE/NAME\n", name)
}

// printPodReport prints a pod's diagnosis, then the node diagnoses it hands over to in the
// format of the node verb.
func printPodReport(w io.Writer, r *diagnose.PodReport) {
	fmt.Fprintf(w, "Pod %s/%s: %s\n", r.Namespace, r.Name, r.Case)
	fmt.Fprintf(w, "  %s\n\n", r.Reason)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  phase\t%s\n", orDash(r.Phase))
	fmt.Fprintf(tw, "  scheduler\t%s\n", orDash(r.SchedulerName))
	fmt.Fprintf(tw, "  node\t%s (assigned %s, bind-phase %s)\n", orDash(r.Node), orDash(r.AssignedNode), orDash(r.BindPhase))
	fmt.Fprintf(tw, "  stage\t%s\n", cmp.Or(r.StageText, r.Stage.Describe()))
	fmt.Fprintf(tw, "  case\t%s: %s\n", r.Case, r.Reason)
	_ = tw.Flush()

	if len(r.Asks) > 0 {
		fmt.Fprintln(w, "\nAsks")
		for _, a := range r.Asks {
			fmt.Fprintf(w, "  %s\n", a)
		}
	}
	if len(r.Claims) > 0 {
		printClaims(w, r.Claims)
	}
	if r.Lock != nil {
		fmt.Fprintln(w, "\nLock")
		fmt.Fprintf(w, "  %s\n", lockLine(r.Lock))
	}
	if r.Fit != nil {
		printFit(w, r.Fit)
	}
	if r.Usage != nil {
		printUsage(w, r.Usage)
	}
	if len(r.Findings) > 0 {
		fmt.Fprintln(w, "\nFindings")
		for _, f := range r.Findings {
			where := ""
			if f.Case != diagnose.Healthy {
				where = f.Case.Short()
			}
			printFinding(w, f.Severity, where, f.Code, f.Summary, f.Evidence, f.Fix)
			if len(f.OnNode) > 0 {
				fmt.Fprintf(w, "      on node %s (not visible from the API server):\n", orDash(r.Node))
				for _, c := range f.OnNode {
					fmt.Fprintf(w, "                %s\n", c)
				}
			}
		}
	}
	for i := range r.Nodes {
		fmt.Fprintf(w, "\n--- handed over to the node diagnosis of %s ---\n", r.Nodes[i].Node)
		printReport(w, &r.Nodes[i])
	}
}

// printUsage prints a Running pod's GPU usage: one row per container and GPU, then one row
// per process the monitor's per-process families name.
func printUsage(w io.Writer, u *diagnose.UsageReport) {
	fmt.Fprintf(w, "\nGPU usage (node monitor %s on node %s)\n", orDash(u.PluginPod), orDash(u.Node))
	if u.Error != "" {
		fmt.Fprintln(w, "  not read: see the NotChecked finding")
		return
	}
	if len(u.GPUs) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  CONTAINER\tGPU\tUUID\tUSED\tLIMIT\tUSED %\tSM %\tLAST KERNEL")
		for _, g := range u.GPUs {
			if !g.Reported {
				fmt.Fprintf(tw, "  %s\t%s\t%s\t-\t%s\t-\t-\tnot reported\n", g.Container, orDash(g.Index), g.UUID, allocatedLimit(g))
				continue
			}
			limit := "none"
			if g.LimitBytes > 0 {
				limit = fmt.Sprintf("%d MiB", g.LimitMiB())
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d MiB\t%s\t%s\t%s\t%s\n", g.Container, orDash(g.Index), g.UUID, g.UsedMiB(), limit,
				percent(g.UsedPercent), percent(g.SMPercent), seconds(g.LastKernelSeconds))
		}
		_ = tw.Flush()
	}
	if len(u.Processes) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  CONTAINER\tGPU\tHOST PID\tHAMI-CORE\tNVML\tDRIFT")
		for _, p := range u.Processes {
			drift := "-"
			if p.Drift != nil {
				drift = fmt.Sprintf("%+.1f %%", *p.Drift*100)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", p.Container, orDash(p.Index), p.HostPID, mibOf(p.HAMiCoreBytes), mibOf(p.NVMLBytes), drift)
		}
		_ = tw.Flush()
	}
	if !u.OptIn {
		fmt.Fprintln(w, "  per-process checks (accounting drift, processes without a HAMi-core slot): not served by this monitor")
	}
}

// allocatedLimit is the limit column of a GPU the monitor does not report: the allocation.
func allocatedLimit(g diagnose.GPUUsage) string {
	if g.AllocatedMiB > 0 {
		return fmt.Sprintf("%d MiB (allocated)", g.AllocatedMiB)
	}
	return "-"
}

// percent renders a percentage, "-" when absent.
func percent(p *float64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%.0f %%", *p)
}

// seconds renders seconds as a duration, "-" when absent.
func seconds(s *float64) string {
	if s == nil {
		return "-"
	}
	if *s < 0 || *s > 1e8 { // beyond what a Duration rounds well
		return fmt.Sprintf("%.0fs ago", *s)
	}
	return (time.Duration(*s * float64(time.Second))).Round(time.Second).String() + " ago"
}

// mibOf renders bytes in MiB, "-" when absent.
func mibOf(b *int64) string {
	if b == nil {
		return "-"
	}
	return fmt.Sprintf("%d MiB", *b>>20)
}

// printFit prints the recomputed fit: one row per candidate node.
func printFit(w io.Writer, fit *diagnose.FitExplanation) {
	fmt.Fprintln(w, "\nFit")
	if fit.Shortage != "" {
		fmt.Fprintf(w, "  %s\n", fit.Shortage)
	}
	if fit.Fits != "" {
		fmt.Fprintf(w, "  fits now on node %s\n", fit.Fits)
	}
	if len(fit.Nodes) == 0 {
		fmt.Fprintln(w, "  no candidate node")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  NODE\tREASON\tFREE GPUS\tHOLDERS")
	for _, n := range fit.Nodes {
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\n", n.Node, cmp.Or(n.Reason, "fits"), n.FreeGPUs, orDash(strings.Join(holders(n.GPUs), ",")))
	}
	_ = tw.Flush()
}

// holders lists the pods holding a node's GPUs, each once, in order.
func holders(gpus []diagnose.GPUFree) []string {
	seen := map[string]bool{}
	var out []string
	for _, g := range gpus {
		for _, h := range g.HeldBy {
			if !seen[h] {
				seen[h] = true
				out = append(out, h)
			}
		}
	}
	return out
}

// lockLine is one line about a node lock: the value, its holder and whether it is stale.
func lockLine(l *diagnose.LockState) string {
	s := fmt.Sprintf("node %s: hami.io/mutex.lock = %q", l.Node, l.Value)
	var parts []string
	if l.Holder != "" {
		holder := "holder " + l.Holder
		switch {
		case !l.HolderExists:
			holder += " (gone)"
		default:
			holder += fmt.Sprintf(" (on node %s, bind-phase %s)", orDash(l.HolderNode), orDash(l.HolderBindPhase))
		}
		parts = append(parts, holder)
	}
	if age := lockAge(l); age > 0 {
		parts = append(parts, fmt.Sprintf("%v old", age))
	}
	switch {
	case l.Error != "":
		parts = append(parts, "malformed: "+l.Error)
	case l.Stale != "":
		parts = append(parts, "stale: "+l.Stale)
	default:
		parts = append(parts, "live")
	}
	return s + " (" + strings.Join(parts, "; ") + ")"
}

// lockAge is the lock's age, from Age or, after JSON, AgeSeconds.
func lockAge(l *diagnose.LockState) time.Duration {
	if l.Age > 0 {
		return l.Age.Round(time.Second)
	}
	return time.Duration(l.AgeSeconds) * time.Second
}

// printClaims prints a claim-based pod's claims and their devices, as kubectl describe
// would: one row per claim, then its devices with their health and taints.
func printClaims(w io.Writer, claims []diagnose.ClaimState) {
	fmt.Fprintln(w, "\nClaims (DRA)")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  POD CLAIM\tRESOURCECLAIM\tDRIVER\tSTATE")
	for _, c := range claims {
		name := orDash(c.Claim)
		if c.Template != "" {
			name += " (template " + c.Template + ")"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", c.PodClaim, name, orDash(strings.Join(c.Drivers, ",")), c.State)
	}
	_ = tw.Flush()
	var devs []string
	for _, c := range claims {
		for _, d := range c.Devices {
			line := fmt.Sprintf("  %s/%s: %s/%s/%s", c.PodClaim, d.Request, d.Driver, d.Pool, d.Device)
			if d.Health != "" {
				line += "  health " + d.Health
				if d.Message != "" {
					line += " (" + d.Message + ")"
				}
			}
			if len(d.Taints) > 0 {
				line += "  taints " + strings.Join(d.Taints, ", ")
			}
			devs = append(devs, line)
		}
	}
	if len(devs) > 0 {
		fmt.Fprintln(w, "\nAllocated devices")
		for _, l := range devs {
			fmt.Fprintln(w, l)
		}
	}
}
