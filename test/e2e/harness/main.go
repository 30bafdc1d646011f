package harness

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/proc"
)

// ControlPlane is the test binary's control plane: envtest's, plus the helpers that take a
// testing.TB (CreateNode, GetNode).
type ControlPlane struct {
	*envtest.ControlPlane
}

// Main is the body of a test binary's TestMain: it starts one control plane for the whole
// binary, hands it to use (which typically stores it in a package variable), runs the tests
// and stops the control plane, then exits with the tests' status.
//
// If the control plane cannot start — the binaries are missing (see envtest.ErrBinariesMissing),
// a port or the namespace setup fails — the binary FAILS with the reason; it never skips.
// On SIGINT or SIGTERM the control plane is stopped and its folder removed before exiting.
// When tests fail, the last lines of the apiserver's and etcd's logs are printed.
//
// A test binary started by a process of envtest.WithHostname only sets its host name and
// executes the real program.
func Main(m *testing.M, opts envtest.Options, use func(*ControlPlane)) {
	if err := envtest.ExecIfHostnameChild(); err != nil { // a process run with a host name of its own execs here
		fmt.Fprintln(os.Stderr, err)
		os.Exit(127)
	}
	os.Exit(run(m, opts, use))
}

func run(m *testing.M, opts envtest.Options, use func(*ControlPlane)) int {
	ctx := context.Background()
	ecp, err := envtest.Start(ctx, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: start the e2e control plane: %v\n", err)
		return 1
	}
	cp := &ControlPlane{ControlPlane: ecp}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s, ok := <-sigs
		if !ok {
			return
		}
		fmt.Fprintf(os.Stderr, "harness: %v: stopping the control plane\n", s)
		_ = cp.Stop()
		os.Exit(2)
	}()
	defer func() {
		signal.Stop(sigs)
		close(sigs)
	}()

	use(cp)
	code := m.Run()
	if code != 0 {
		for _, name := range []string{"etcd", "kube-apiserver"} {
			fmt.Fprintf(os.Stderr, "--- last lines of %s.log:\n%s\n", name, proc.Tail(cp.LogPath(name), 40))
		}
	}
	if err := cp.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: stop the e2e control plane: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}
