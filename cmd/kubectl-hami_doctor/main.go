// Command kubectl-hami_doctor explains why a GPU node does not register with HAMi's scheduler
// and why a GPU pod does not run. It is a kubectl plugin: installed as kubectl-hami_doctor on
// $PATH, it runs as "kubectl hami-doctor" (kubectl maps the dash to the underscore):
//
//	go install github.com/hamireg/hamireg/cmd/kubectl-hami_doctor@v0.1.0
//	kubectl krew install --manifest=cmd/kubectl-hami_doctor/krew/hami-doctor.yaml
//	cd cmd/kubectl-hami_doctor && go build -o ~/bin/ .   # from a checkout (go.work: the tree's SDK)
//
// Offline, from an annotation value alone:
//
//	kubectl hami-doctor explain '[{"id":"GPU-a","count":10,"devmem":23028,"health":true}]'
//	kubectl hami-doctor explain -f annotation.json
//	kubectl get node gpu-1 -o jsonpath='{.metadata.annotations.hami\.io/node-nvidia-register}' | kubectl hami-doctor explain -
//
// It prints the devices as a table and what HAMi's scheduler concludes, with the exact message
// HAMi logs. With --handshake (and --allocatable) it also interprets the liveness handshake.
// Exit status: 0 when the node would register, 1 when it would not, 2 on usage errors.
//
// From a live cluster (package diagnose):
//
//	kubectl hami-doctor pod NAMESPACE/NAME      # stage S0-S4, case P1-P12, findings and fixes; GPU usage when Running
//	kubectl hami-doctor pods -A                 # one line per GPU pod that does not run
//	kubectl hami-doctor node gpu-7              # channels, case 1-5, findings and fixes
//	kubectl hami-doctor nodes                   # one line per GPU node
//	kubectl hami-doctor unlock gpu-7 [--yes]    # remove a stale hami.io/mutex.lock
//	kubectl hami-doctor cordon gpu-7 3 [--yes]  # keep new pods and DRA claims off GPU 3
//	kubectl hami-doctor uncordon gpu-7 3 [--yes]
//	kubectl hami-doctor bundle ns/pod           # a support bundle (.tar.gz)
//
// The cluster verbs take kubectl's flags (--kubeconfig, --context, -n/--namespace, --as,
// --as-group, --cluster, --user, --request-timeout, ...); -n is the pod's namespace, as in
// kubectl, and --hami-namespace is where HAMi is installed (default kube-system). Every verb
// prints -o text (default), json or yaml. Exit status: 0 when healthy (or done), 1 when a case
// applies, 2 on errors. unlock, cordon and uncordon are the verbs that write, and only with
// --yes (without it cordon and uncordon send their writes as the API server's dry run).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"

	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
)

// Exit statuses of every verb.
const (
	exitHealthy = 0
	exitCase    = 1
	exitError   = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := newCLI(ctx, os.Args[0], os.Stdin, os.Stdout, os.Stderr).run(os.Args[1:])
	stop()
	os.Exit(code)
}

// cli is one invocation: its name in usage texts, its streams, and how it reaches the cluster.
type cli struct {
	// ctx is the program's context; clock its source of time.
	ctx   context.Context
	clock clock.PassiveClock
	// name is "kubectl hami-doctor" when run as a kubectl plugin, else "doctor".
	name           string
	stdin          io.Reader
	stdout, stderr io.Writer
	// connect makes the client from kubectl's flags; tests replace it with a fake clientset.
	connect func(*genericclioptions.ConfigFlags) (kubernetes.Interface, error)
	// api is the part of package diagnose the repair and bundle verbs call.
	api diagnoseAPI
	// buildInfo reads the binary's build information (debug.ReadBuildInfo) for version.
	buildInfo func() (*debug.BuildInfo, bool)
}

// newCLI returns the command line for argv0 (os.Args[0]) and the streams, on the real clock.
func newCLI(ctx context.Context, argv0 string, stdin io.Reader, stdout, stderr io.Writer) *cli {
	return &cli{ctx: ctx, clock: clock.RealClock{}, name: commandName(argv0), stdin: stdin, stdout: stdout, stderr: stderr, connect: connectREST, api: defaultAPI(), buildInfo: debug.ReadBuildInfo}
}

// commandName is how usage texts call the program: "kubectl hami-doctor" when the binary is
// installed as a kubectl plugin (kubectl-hami_doctor), else "doctor".
func commandName(argv0 string) string {
	base := filepath.Base(argv0)
	if rest, ok := strings.CutPrefix(base, "kubectl-"); ok {
		return "kubectl " + strings.ReplaceAll(strings.TrimSuffix(rest, ".exe"), "_", "-")
	}
	return "doctor"
}

const usage = `Usage:
  {cmd} pod [NAMESPACE/]NAME [-n NS]    diagnose one GPU pod: stage S0-S4, case P1-P12, fixes
  {cmd} pods [-n NS | -A]               one line per GPU pod that is not running
  {cmd} node NAME                       diagnose one node: the three channels, case 1-5, fixes
  {cmd} nodes                           one line per GPU node
  {cmd} unlock NODE [--yes]             remove a stale node lock (hami.io/mutex.lock)
  {cmd} cordon NODE GPU... [--yes]      keep new pods and DRA claims off GPUs (UUID or index)
  {cmd} uncordon NODE GPU... [--yes]    undo cordon
  {cmd} bundle NODE|NAMESPACE/POD [-f FILE]   write a support bundle (.tar.gz)
  {cmd} explain [flags] VALUE|-f FILE|-       explain a register annotation value, offline
  {cmd} version [-o json|yaml]          the doctor's version, its Go and its SDK
  {cmd} help                            this text

Every verb prints -o text (default), json or yaml (documents with apiVersion
doctor.hamireg.io/v1alpha1 and a kind). The cluster verbs take kubectl's flags
(--kubeconfig, --context, -n/--namespace for the pod's namespace, --as, ...) and
--hami-namespace (where HAMi is installed, default kube-system).
Exit status: 0 healthy or done, 1 a case applies (explain: the node would not register),
2 errors and usage errors. Run "{cmd} VERB -h" for a verb's flags.
`

// text renders a usage text with the program's name.
func (c *cli) text(s string) string { return strings.ReplaceAll(s, "{cmd}", c.name) }

func (c *cli) run(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(c.stderr, c.text(usage))
		return exitError
	}
	switch args[0] {
	case "explain":
		return c.explain(args[1:])
	case "node":
		return c.nodeCmd(args[1:])
	case "nodes":
		return c.nodesCmd(args[1:])
	case "pod":
		return c.podCmd(args[1:])
	case "pods":
		return c.podsCmd(args[1:])
	case "unlock":
		return c.unlockCmd(args[1:])
	case "bundle":
		return c.bundleCmd(args[1:])
	case "cordon":
		return c.cordonCmd(args[1:])
	case "uncordon":
		return c.uncordonCmd(args[1:])
	case "version":
		return c.versionCmd(args[1:])
	case "help", "-h", "--help":
		fmt.Fprint(c.stdout, c.text(usage))
		return exitHealthy
	default:
		c.errorf("unknown command %q\n\n%s", args[0], c.text(usage))
		return exitError
	}
}
