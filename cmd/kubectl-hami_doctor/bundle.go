package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/hamireg/hamireg/diagnose"
)

const bundleUsage = `Usage:
  {cmd} bundle NODE [-f FILE] [flags]            a support bundle for a node
  {cmd} bundle NAMESPACE/POD [-f FILE] [flags]   a support bundle for a pod

It diagnoses the node or the pod, then writes one .tar.gz with the diagnosis (text and JSON),
the objects, their Events and the logs of the node's device plugin and of the leader scheduler
Pod (never Secrets; tokens and certificates redacted). What it may not read is listed in the
bundle's index. Default file: hami-doctor-<target>-<UTC time>.tar.gz in the current folder.
Exit status: 0 when written, 2 on errors.
`

// bundleResult is bundle's -o json and yaml form.
type bundleResult struct {
	File    string   `json:"file"`
	Files   []string `json:"files"`
	Missing []string `json:"missing,omitempty"`
}

func (c *cli) bundleCmd(args []string) int {
	fs, f := c.newClusterFlags("bundle", bundleUsage)
	monitorFlags(fs, f)
	file := fs.StringP("file", "f", "", "write the bundle to `FILE` (default hami-doctor-<target>-<UTC time>.tar.gz)")
	logLines := fs.Int64("log-lines", 500, "lines of each log to collect")
	if err := parse(fs, args); err != nil {
		return c.fail("bundle", fs, err)
	}
	arg, err := oneName(fs, "node or NAMESPACE/POD")
	if err != nil {
		return c.fail("bundle", fs, err)
	}
	target := bundleTarget{Node: arg}
	if ns, pod, ok := strings.Cut(arg, "/"); ok {
		if ns == "" || pod == "" || strings.Contains(pod, "/") {
			return c.fail("bundle", fs, fmt.Errorf("%w: %q: give NODE or NAMESPACE/POD", errUsage, arg))
		}
		target = bundleTarget{Namespace: ns, Pod: pod}
	}
	client, err := c.client(f)
	if err != nil {
		return c.fail("bundle", fs, err)
	}
	ctx, cancel := f.context(c.ctx)
	defer cancel()

	// The diagnosis first: it goes into the bundle as text and JSON.
	var report any
	var text bytes.Buffer
	if target.Node != "" {
		r, err := diagnose.Node(ctx, client, target.Node, f.opts)
		if err != nil {
			return c.fail("bundle", nil, err)
		}
		report = r
		printReport(&text, r)
	} else {
		r, err := diagnose.Pod(ctx, client, target.Namespace, target.Pod, f.opts)
		if err != nil {
			return c.fail("bundle", nil, err)
		}
		report = r
		printPodReport(&text, r)
	}
	js, err := json.MarshalIndent(report, "", "  ")
	if err != nil {
		return c.fail("bundle", nil, fmt.Errorf("encode the diagnosis: %w", err))
	}

	name := *file
	if name == "" {
		name = bundleFileName(target, c.clock.Now())
	}
	out, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return c.fail("bundle", nil, fmt.Errorf("create the bundle: %w (give another -f FILE)", err))
	}
	idx, err := c.api.writeBundle(ctx, client, target, out, bundleOptions{
		Options:  f.opts,
		LogLines: *logLines,
		Files: []bundleFile{
			{Name: "diagnosis.txt", Data: text.Bytes()},
			{Name: "diagnosis.json", Data: append(js, '\n')},
		},
	})
	if cerr := out.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("write the bundle %s: %w", name, cerr)
	}
	if err != nil {
		_ = os.Remove(name)
		return c.fail("bundle", nil, err)
	}
	res := bundleResult{File: name, Files: idx.Files, Missing: idx.Missing}
	if res.Files == nil {
		res.Files = []string{}
	}
	return c.show("bundle", f.output, document{kindBundleResult, res}, func() { printBundle(c.stdout, res) }, false)
}

// bundleFileName is the archive's default name, diagnose's Root + ".tar.gz":
// hami-doctor-<pod-namespace-name or node-name>-<UTC time>.tar.gz.
func bundleFileName(t bundleTarget, now time.Time) string {
	return t.Root(now) + ".tar.gz"
}

func printBundle(w io.Writer, res bundleResult) {
	fmt.Fprintf(w, "Wrote %s: %d file(s)\n", res.File, len(res.Files))
	for _, m := range res.Missing {
		fmt.Fprintf(w, "  missing: %s\n", m)
	}
}
