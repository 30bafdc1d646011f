// Command acmeplugin is a HAMi-compatible device plugin for a made-up accelerator, the ACME
// NPU, to show what a vendor other than NVIDIA writes on package nodeagent: a device source,
// an Allocate answer, and nodeagent.New + Run. It has no driver library: the NPUs are the
// device nodes <dev-root>/acme0, acme1, ..., each --device-memory MiB, 100 % cores and split
// --device-split-count ways. It registers them with the kubelet (acme.example/npu) and in the
// Node annotation hami.io/node-acme-register, and answers the kubelet's Allocate for the
// NPUs HAMi's scheduler chose with their device nodes (/dev/acmeK in the container) and
// ACME_VISIBLE_DEVICES=<ids>, ACME_MEMORY_LIMIT_<i>=<MiB>. Deploy it with the manifests in
// deploy/.
//
//	acmeplugin [--dev-root /dev] [--simulate 0] [--device-split-count 10] [--device-memory 16384]
//	           [--kubelet-root-dir /var/lib/kubelet] [--kubeconfig FILE] [--metrics-bind-address :9396] [-v 2]
//
// --simulate N creates N device nodes (empty files) in --dev-root, or in a new temporary
// folder when --dev-root is not given, so that the plugin runs on a machine without NPUs:
//
//	NODE_NAME=$(hostname) acmeplugin --simulate 4 --kubeconfig admin.kubeconfig -v 2
//
// --metrics-bind-address (default :9396; "" or "0" turns it off) serves, on one HTTP server
// with HAMi master's monitor timeouts, GET /metrics (the agent's hamireg_nodeagent_* and
// hamireg_register_* families, vendor="ACME"), /healthz and /readyz (nodeagent's Agent.Healthy
// and Agent.Ready: 200, or 503 and what is wrong), which deploy/daemonset.yaml probes. An
// address that does not parse exits 2, one that cannot be bound 1.
//
// The node name comes from NODE_NAME (the DaemonSet sets it from spec.nodeName). Without
// --kubeconfig the in-cluster configuration is used. Exit status: 0 after SIGTERM or SIGINT,
// 1 when the plugin cannot run (the error says why), 2 on bad flags or a missing node name.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/register"
)

// acme is the vendor: HAMi's annotation keys for the vendor word "ACME" and the kubelet
// resource acme.example/npu.
var acme = annotation.NewVendor("ACME", "acme.example/npu")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stderr, os.Getenv, nil)
	stop()
	os.Exit(code)
}

// run is the command; it returns the exit status. client, when not nil, replaces the
// clientset of --kubeconfig (tests).
func run(ctx context.Context, args []string, stderr io.Writer, getenv func(string) string, client kubernetes.Interface) int {
	flags := flag.NewFlagSet("acmeplugin", flag.ContinueOnError)
	flags.SetOutput(stderr)
	devRoot := flags.String("dev-root", "", "folder of the device nodes acme0, acme1, ... (default /dev, or a new temporary folder with --simulate)")
	simulate := flags.Int("simulate", 0, "create `N` device nodes in --dev-root instead of using the driver's")
	split := flags.Int("device-split-count", 10, "tasks that may share one NPU")
	memory := flags.Int("device-memory", 16384, "memory of one NPU in MiB")
	rootDir := flags.String("kubelet-root-dir", "/var/lib/kubelet", "the kubelet's --root-dir; the plugin socket goes to <dir>/device-plugins")
	kubeconfig := flags.String("kubeconfig", "", "kubeconfig `FILE` (default: the in-cluster configuration)")
	metricsBind := flags.String("metrics-bind-address", defaultMetricsBindAddress, "serve /metrics, /healthz and /readyz on this `address`; \"\" or \"0\" = off")
	verbosity := flags.Int("v", 0, "log verbosity")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	fail := func(code int, err error) int {
		fmt.Fprintf(stderr, "acmeplugin: %v\n", err)
		return code
	}
	metricsAddr, err := nodeagent.ParseMetricsAddress(*metricsBind)
	if err != nil {
		return fail(2, fmt.Errorf("--metrics-bind-address: %w", err))
	}
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(*verbosity), textlogger.Output(stderr)))
	ctx = klog.NewContext(ctx, logger)
	nodeName, err := register.NodeNameFromEnv(ctx, getenv)
	if err != nil {
		return fail(2, err)
	}
	npus, cleanup, err := newNPUs(nodeName, *devRoot, *simulate, *split, *memory)
	if err != nil {
		return fail(2, err)
	}
	defer cleanup()
	if client == nil {
		cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
		if err == nil {
			client, err = kubernetes.NewForConfig(cfg)
		}
		if err != nil {
			return fail(1, fmt.Errorf("connect to the API server: %w (outside a cluster, give --kubeconfig)", err))
		}
	}

	// snippet: README
	reg := prometheus.NewRegistry() // served on --metrics-bind-address
	agent, err := nodeagent.New(client, nodeName, npus, nodeagent.Options{
		Vendor:     acme,
		Kubelet:    kubeletplugin.Options{PluginDir: kubeletplugin.PluginDirFromRootDir(*rootDir)},
		Registerer: reg,
	})
	if err != nil {
		return fail(2, err)
	}
	if err := agent.RunServing(ctx, metricsAddr, reg); err != nil {
		return fail(1, err)
	}
	// end snippet
	return 0
}
