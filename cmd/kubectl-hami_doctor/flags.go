package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/handshake"
)

// errUsage marks a usage error: exit status 2 and the verb's usage text.
var errUsage = errors.New("usage")

// clusterFlags are the flags shared by the verbs that read the cluster: kubectl's, where HAMi
// is installed, and the output format.
type clusterFlags struct {
	kube                                  *genericclioptions.ConfigFlags
	outputPtr                             *string
	output, vendor, resource, hamiVersion string
	nodeSelector                          string
	timeout                               time.Duration
	opts                                  diagnose.Options
}

// newFlags returns the verb's flag set with -o/--output; the verbs add their own.
func (c *cli) newFlags(verb, usageText string) (*pflag.FlagSet, *string) {
	fs := pflag.NewFlagSet(verb, pflag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.SortFlags = false
	output := fs.StringP("output", "o", "text", "output format: text, json or yaml")
	// pflag calls Usage only for -h/--help (ContinueOnError): help goes to stdout.
	fs.Usage = func() {
		fmt.Fprint(c.stdout, c.text(usageText), "\nFlags:\n", fs.FlagUsages())
	}
	return fs, output
}

// newClusterFlags returns the flag set of a cluster verb.
func (c *cli) newClusterFlags(verb, usageText string) (*pflag.FlagSet, *clusterFlags) {
	fs, output := c.newFlags(verb, usageText)
	f := &clusterFlags{kube: genericclioptions.NewConfigFlags(true)}
	f.kube.AddFlags(fs)
	fs.StringVar(&f.opts.Namespace, "hami-namespace", diagnose.DefaultNamespace, "namespace HAMi is installed in (-n is the pod's namespace, as in kubectl)")
	fs.StringVar(&f.opts.DaemonSet, "daemonset", diagnose.DefaultDaemonSet, "device plugin DaemonSet")
	fs.StringVar(&f.opts.PluginSelector, "plugin-selector", diagnose.DefaultPluginSelector, "label selector of the device plugin Pods (when the DaemonSet cannot be read)")
	fs.StringVar(&f.opts.PluginContainer, "plugin-container", diagnose.DefaultPluginContainer, "device plugin container name")
	fs.StringVar(&f.opts.Scheduler, "scheduler", diagnose.DefaultScheduler, "HAMi scheduler Deployment")
	fs.StringVar(&f.opts.SchedulerSelector, "scheduler-selector", diagnose.DefaultSchedulerSelector, "label selector of the scheduler Pods")
	fs.StringVar(&f.opts.Lease, "lease", diagnose.DefaultLease, "Lease held by the scheduler's kube-scheduler")
	fs.StringVar(&f.opts.SchedulerName, "scheduler-name", diagnose.DefaultSchedulerName, "HAMi's scheduler name in spec.schedulerName")
	fs.StringVar(&f.opts.SchedulerConfigMap, "scheduler-config", diagnose.DefaultSchedulerConfigMap, "ConfigMap with HAMi's KubeSchedulerConfiguration")
	fs.StringVar(&f.opts.Webhook, "webhook", diagnose.DefaultWebhook, "HAMi's MutatingWebhookConfiguration")
	fs.StringVar(&f.nodeSelector, "node-label-selector", "", "the extender's --node-label-selector, `KEY=VALUE[,KEY=VALUE]` (default read from the scheduler Deployment's args)")
	fs.StringVar(&f.vendor, "vendor", annotation.VendorNVIDIA, "HAMi vendor word to check")
	fs.StringVar(&f.resource, "resource", "", "extended resource name (default the vendor's, nvidia.com/gpu)")
	fs.StringVar(&f.hamiVersion, "hami-version", "master", "scheduler semantics: master or v2.9.0")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "overall time limit")
	f.outputPtr = output
	return fs, f
}

// parse parses args into fs; a parse error is a usage error.
func parse(fs *pflag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	return nil
}

// checkOutput checks -o.
func checkOutput(output string) error {
	switch output {
	case "text", "json", "yaml":
		return nil
	}
	return fmt.Errorf("%w: unknown output format %q (text, json or yaml)", errUsage, output)
}

// complete checks the flags and fills the options.
func (f *clusterFlags) complete() error {
	f.output = *f.outputPtr
	if err := checkOutput(f.output); err != nil {
		return err
	}
	vendor, ok := annotation.VendorByName(f.vendor)
	if !ok {
		vendor, ok = vendorByChip(f.vendor)
	}
	if !ok {
		return fmt.Errorf("%w: unknown vendor %q", errUsage, f.vendor)
	}
	f.opts.Vendor = vendor
	f.opts.ResourceName = f.resource
	v, err := parseHAMiVersion(f.hamiVersion)
	if err != nil {
		return err
	}
	f.opts.HAMiVersion = v
	return f.completeNodeSelector()
}

// completeNodeSelector reads --node-label-selector into the options: equality terms only,
// as the extender's flag takes them.
func (f *clusterFlags) completeNodeSelector() error {
	if f.nodeSelector == "" {
		return nil
	}
	sel, err := labels.ConvertSelectorToLabelsMap(f.nodeSelector)
	if err != nil {
		return fmt.Errorf("%w: --node-label-selector %q: %w (give KEY=VALUE[,KEY=VALUE])", errUsage, f.nodeSelector, err)
	}
	f.opts.NodeLabelSelector = sel
	return nil
}

// parseHAMiVersion reads --hami-version.
func parseHAMiVersion(s string) (handshake.Version, error) {
	switch s {
	case "master", "":
		return handshake.Version(0), nil
	case "v2.9.0", "2.9.0":
		return handshake.VersionV290, nil
	}
	return 0, fmt.Errorf("%w: unknown --hami-version %q (master or v2.9.0)", errUsage, s)
}

// podNamespace is the namespace of the pods: -n, else the kubeconfig context's (in a Pod,
// its own), else "default".
func (f *clusterFlags) podNamespace() (string, error) {
	if f.kube.Namespace != nil && *f.kube.Namespace != "" {
		return *f.kube.Namespace, nil
	}
	ns, _, err := f.kube.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return "", fmt.Errorf("read the namespace from the kubeconfig: %w (give -n NAMESPACE)", err)
	}
	return ns, nil
}

// context is the verb's context: parent, bounded by --timeout.
func (f *clusterFlags) context(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, f.timeout)
}

// connectREST makes the client from kubectl's flags.
func connectREST(kube *genericclioptions.ConfigFlags) (kubernetes.Interface, error) {
	cfg, err := kube.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w (give --kubeconfig or --context, or run in a Pod)", err)
	}
	cfg.UserAgent = "hamireg-doctor"
	return kubernetes.NewForConfig(cfg)
}

// client checks the flags and makes the client.
func (c *cli) client(f *clusterFlags) (kubernetes.Interface, error) {
	if err := f.complete(); err != nil {
		return nil, err
	}
	return c.connect(f.kube)
}

// write prints v as JSON or YAML (of its JSON form), or calls text.
// show writes v in the output format of the verb (text through text) and returns the exit
// status: exitCase when caseApplies, exitHealthy otherwise, exitError when the output fails.
func (c *cli) show(verb, output string, v any, text func(), caseApplies bool) int {
	if err := write(c.stdout, output, v, text); err != nil {
		return c.fail(verb, nil, err)
	}
	if caseApplies {
		return exitCase
	}
	return exitHealthy
}

func write(w io.Writer, output string, v any, text func()) error {
	switch output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			return fmt.Errorf("write JSON: %w", err)
		}
	case "yaml":
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("write YAML: %w", err)
		}
		y, err := yaml.JSONToYAML(b)
		if err != nil {
			return fmt.Errorf("write YAML: %w", err)
		}
		if _, err := w.Write(y); err != nil {
			return fmt.Errorf("write YAML: %w", err)
		}
	default:
		text()
	}
	return nil
}

// fail prints err for the verb and returns the exit status 2; a usage error also prints
// the verb's usage text, pflag.ErrHelp only the usage (exit 0).
func (c *cli) fail(verb string, fs *pflag.FlagSet, err error) int {
	if errors.Is(err, pflag.ErrHelp) {
		return exitHealthy
	}
	msg := err.Error()
	if rest, ok := cutUsage(err); ok {
		msg = rest
	}
	fmt.Fprintf(c.stderr, "%s %s: %s\n", c.name, verb, msg)
	if errors.Is(err, errUsage) && fs != nil {
		fmt.Fprintf(c.stderr, "Run \"%s %s -h\" for the flags.\n", c.name, verb)
	}
	return exitError
}

// cutUsage drops the "usage: " prefix errUsage puts in front of a message.
func cutUsage(err error) (string, bool) {
	s := err.Error()
	if len(s) > len(errUsage.Error())+2 && s[:len(errUsage.Error())+2] == errUsage.Error()+": " {
		return s[len(errUsage.Error())+2:], true
	}
	return s, false
}

// errorf prints a message of the program.
func (c *cli) errorf(format string, args ...any) {
	fmt.Fprintf(c.stderr, "%s: "+format, append([]any{c.name}, args...)...)
}
