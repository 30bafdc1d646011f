package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/hamireg/hamireg/diagnose"
)

const cordonUsage = `Usage:
  {cmd} cordon NODE GPU... [--yes] [flags]     keep new pods and claims off GPUs of a node
  {cmd} uncordon NODE GPU... [--yes] [flags]   undo cordon

A GPU is a UUID or an index. cordon adds each GPU's UUID to the node's hami.io/device-cordon
(HAMi's extender places no new pod on it; entries already there are kept) and, for a GPU that
a DRA driver (gpu.hamireg.io, hami-core-gpu.project-hami.io) publishes in a ResourceSlice of
the node, writes a DeviceTaintRule with the NoSchedule taint <driver>/cordoned on that device
(kube-scheduler gives it to no new claim). Pods and claims that hold the GPU keep it. uncordon
removes both; a UUID the node agent itself keeps in hami.io/device-cordon (a GPU DRA owns)
stays. Both are idempotent.

Without --yes, nothing is stored: the writes go to the API server as a dry run, which checks
them (RBAC included), and the result says what would change.
Needs: get, patch nodes; list resourceslices; get, list, create, update, delete
devicetaintrules (resource.k8s.io).
Exit status: 0 when done (or, without --yes, possible), 2 on errors.
`

func (c *cli) cordonCmd(args []string) int { return c.cordonVerb("cordon", args) }

func (c *cli) uncordonCmd(args []string) int { return c.cordonVerb("uncordon", args) }

func (c *cli) cordonVerb(verb string, args []string) int {
	fs, f := c.newClusterFlags(verb, cordonUsage)
	yes := fs.Bool("yes", false, "write (without it: a server-side dry run that shows what would change)")
	if err := parse(fs, args); err != nil {
		return c.fail(verb, fs, err)
	}
	if fs.NArg() < 2 {
		return c.fail(verb, fs, fmt.Errorf("%w: give a node and at least one GPU (UUID or index)", errUsage))
	}
	node, gpus := fs.Arg(0), fs.Args()[1:]
	client, err := c.client(f)
	if err != nil {
		return c.fail(verb, fs, err)
	}
	ctx, cancel := f.context(c.ctx)
	defer cancel()
	call := c.api.cordon
	if verb == "uncordon" {
		call = c.api.uncordon
	}
	res, err := call(ctx, client, node, gpus, diagnose.CordonOptions{DryRun: !*yes})
	if err != nil {
		if res != nil && len(res.GPUs) > 0 && f.output == "text" {
			c.printCordon(c.stderr, verb, res)
		}
		return c.fail(verb, nil, err)
	}
	return c.show(verb, f.output, document{kindCordonResult, res}, func() { c.printCordon(c.stdout, verb, res) }, false)
}

// printCordon prints what cordon or uncordon did per GPU.
func (c *cli) printCordon(w io.Writer, verb string, res *diagnose.CordonResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tINDEX\tUUID\tDEVICE-CORDON\tDEVICETAINTRULE")
	for _, g := range res.GPUs {
		index := "-"
		if g.Index >= 0 {
			index = fmt.Sprint(g.Index)
		}
		rules := "- (not published by a DRA driver)"
		if len(g.Rules) > 0 {
			var parts []string
			for _, r := range g.Rules {
				parts = append(parts, fmt.Sprintf("%s (%s/%s/%s): %s", r.Rule, r.Driver, r.Pool, r.Device, r.Action))
			}
			rules = strings.Join(parts, "; ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", g.GPU, index, g.UUID, g.Annotation, rules)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nhami.io/device-cordon on node %s: %q -> %q\n", res.Node, res.Before, res.After)
	if res.DryRun {
		fmt.Fprintf(w, "Dry run: nothing stored. To write it, rerun with --yes:\n  %s %s %s %s --yes\n", c.name, verb, res.Node, strings.Join(gpuArgs(res), " "))
	}
}

func gpuArgs(res *diagnose.CordonResult) []string {
	out := make([]string, 0, len(res.GPUs))
	for _, g := range res.GPUs {
		out = append(out, g.GPU)
	}
	return out
}
