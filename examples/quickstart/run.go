package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
)

// options are the command's flags.
type options struct {
	keep      bool
	mig       bool
	k8sBin    string
	repo      string
	programs  string
	node      string
	verbosity int
	timeout   time.Duration
}

// exit codes.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitInterrupted = 130
)

// run is the command; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runWith(ctx, args, stdout, stderr, nil)
}

// runWith is run whose klog global logger writes to klogOut (nil: the logger is not main's).
func runWith(ctx context.Context, args []string, stdout, stderr io.Writer, klogOut *lateWriter) int {
	fs := flag.NewFlagSet("quickstart", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.BoolVar(&o.keep, "keep", false, "leave the cluster running after the steps, until Ctrl-C")
	fs.BoolVar(&o.mig, "mig", true, "after the doctor, also start a second node in MIG mode (examples/deviceplugin --simulate dgxa100 --mig) and place a MIG pod on it; --mig=false skips it")
	fs.StringVar(&o.k8sBin, "k8s-bin", os.Getenv(envtest.EnvBinDir), "folder with kube-apiserver, kube-scheduler and etcd (default $"+envtest.EnvBinDir+"; empty: build them with hack/k8sbins/build.sh)")
	fs.StringVar(&o.repo, "repo", "", "the hamireg checkout whose examples run (default: the folder above the working directory that holds its go.mod)")
	fs.StringVar(&o.programs, "programs", "", "folder to build examples/extender, deviceplugin and doctor into (default: <user cache>/hamireg/quickstart/bin)")
	fs.StringVar(&o.node, "node", "gpu-node-1", "name of the simulated GPU node")
	fs.IntVar(&o.verbosity, "v", 2, "log verbosity of the programs (their logs are in the work folder)")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Minute, "how long each step may take")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return exitOK
	} else if err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "quickstart: unexpected arguments %q\n", fs.Args())
		return exitUsage
	}
	if o.timeout <= 0 {
		fmt.Fprintf(stderr, "quickstart: --timeout %v must be positive\n", o.timeout)
		return exitUsage
	}
	repo, err := findRepo(o.repo)
	if err != nil {
		fmt.Fprintf(stderr, "quickstart: %v\n", err)
		return exitUsage
	}
	o.repo = repo

	p := newPrinter(stdout)
	q := &quickstart{opts: o, out: p, start: time.Now(), klogOut: klogOut}
	err = q.run(ctx)
	stopErr := q.stop()
	switch {
	case err != nil && ctx.Err() != nil:
		p.linef("quickstart: interrupted: %d process(es) stopped, %s removed", q.stopped, q.work)
		return exitInterrupted
	case err != nil:
		p.linef("")
		p.linef("quickstart: FAILED: %s", explain(err))
		if stopErr != nil {
			p.linef("quickstart: also while stopping: %v", stopErr)
		}
		return exitFailed
	case stopErr != nil:
		p.linef("quickstart: FAILED to stop cleanly: %v", stopErr)
		return exitFailed
	}
	p.linef("quickstart: done in %v: %d process(es) stopped, %s removed", q.since(), q.stopped, q.work)
	return exitOK
}

// explain turns the errors a newcomer can meet into what to do.
func explain(err error) string {
	switch {
	case errors.Is(err, kubeletpeer.ErrNamespace):
		return err.Error() + "\n\n" + namespaceHelp
	case errors.Is(err, envtest.ErrBinariesMissing):
		return err.Error() + "\n\nRun `make quickstart` from the repository root, which builds them, or give --k8s-bin DIR."
	}
	return err.Error()
}

// namespaceHelp says what to do where the kubelet's device manager cannot be hosted.
const namespaceHelp = `The kubelet's device manager writes to the hard-coded /var/lib/kubelet/device-plugins, so the
quickstart runs it in a private mount namespace (a tmpfs over /var/lib, this run's folder
bind-mounted there; the host's /var/lib is never touched). This machine allows neither a mount
namespace as this user nor an unprivileged user namespace. Instead, run one of:

  sudo -E env "PATH=$PATH" make quickstart          # as root: a mount namespace needs no user namespace
  sudo sysctl -w kernel.unprivileged_userns_clone=1  # Debian/Ubuntu kernels that restrict user namespaces
  sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0   # Ubuntu 24.04 and later
  sudo sysctl -w user.max_user_namespaces=15000      # where the limit is 0

In a container, run it with --privileged (or with CAP_SYS_ADMIN and an unconfined seccomp
profile). Without any of these, the offline part still works:
  cd cmd/kubectl-hami_doctor && go run . explain '[{"id":"GPU-a","count":10,"devmem":23028,"health":true}]'`
