package envtest

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/hamireg/hamireg/envtest/proc"
)

// envHostname carries the host name to the binary re-executed by [WithHostname];
// [ExecIfHostnameChild] sets it and executes the real program before anything else.
const envHostname = "HAMIREG_E2E_HOSTNAME"

// WithHostname returns opts changed so that the process runs in a UTS namespace of its own
// whose host name is host, as each pod of a Deployment has its own: kube-scheduler's
// leader-election identity is "<host name>_<uuid>" and HAMi's extender matches it by host
// name, so two replicas on one machine need two names. The calling binary (os.Executable) is
// started in the new namespace (CLONE_NEWUTS; as non-root also CLONE_NEWUSER, mapping the
// caller to root), sets the name and executes opts.Path with the same process id, so signals, Pid and the log work
// as without it. That binary must call [ExecIfHostnameChild] first: in a test binary's
// TestMain, or at the top of a program's main.
func WithHostname(opts proc.Options, host string) (proc.Options, error) {
	if host == "" {
		return opts, fmt.Errorf("with hostname: empty host name")
	}
	self, err := os.Executable()
	if err != nil {
		return opts, fmt.Errorf("with hostname: %w", err)
	}
	attr := &syscall.SysProcAttr{}
	if opts.SysProcAttr != nil {
		a := *opts.SysProcAttr
		attr = &a
	}
	attr.Cloneflags |= syscall.CLONE_NEWUTS
	if os.Geteuid() != 0 {
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}
	}
	env := opts.Env
	if env == nil {
		env = os.Environ()
	}
	opts.Env = append(slices.Clip(env), envHostname+"="+host)
	opts.Args = append([]string{opts.Path}, opts.Args...)
	opts.Path = self
	opts.SysProcAttr = attr
	return opts, nil
}

// ExecIfHostnameChild is the child side of [WithHostname]: in a process started by it, it sets
// the host name and executes the program in os.Args[1:], and so never returns unless that
// fails; it then returns the error, and the caller exits at once (127, as a shell does for a
// command it cannot run). Everywhere else it returns nil at once. A test binary (first thing
// in TestMain) or a program (first thing in main) that uses WithHostname, directly or through
// [SchedulerOptions.Hostname], must call it:
//
//	if err := envtest.ExecIfHostnameChild(); err != nil {
//		fmt.Fprintln(os.Stderr, err)
//		os.Exit(127)
//	}
func ExecIfHostnameChild() error {
	host, ok := os.LookupEnv(envHostname)
	if !ok {
		return nil
	}
	env := make([]string, 0, len(os.Environ()))
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, envHostname+"=") {
			env = append(env, e)
		}
	}
	err := syscall.Sethostname([]byte(host))
	if err == nil && len(os.Args) < 2 {
		err = errors.New("no program to run")
	}
	if err == nil {
		err = syscall.Exec(os.Args[1], os.Args[1:], env)
	}
	return fmt.Errorf("envtest: run %q with host name %q: %w", os.Args[1:], host, err)
}
