// Package extender_test runs examples/extender, the scheduler program on package extender,
// as a process against real peers: kube-apiserver and etcd (harness) and a real
// kube-scheduler configured from the example's own deploy/scheduler-config.yaml, whose
// extender entry is pointed at the process. GPU Nodes are registered by register.Writer;
// no kubelet runs, so bound pods never start: the tests check bindings, HAMi's pod
// annotations, the node lock, the scheduler's FailedScheduling events and, after a SIGKILL
// of the extender, that usage is rebuilt from the pods' annotations. A small plugin
// emulator plays HAMi's device plugin after Allocate (bind-phase success, lock released),
// so that HAMi's node lock (one pod per node between bind and Allocate) does not hold
// every other bind for the lock timeout. The quota tests put ResourceQuota objects on GPU
// memory and cores in namespaces of their own and follow every bind there with an informer
// (quotaWatch): no bind takes a namespace over its limits. BenchmarkScheduleThroughput compares the pods per
// second bound through the extender with kube-scheduler alone.
package extender_test

import (
	"path/filepath"
	"testing"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

var (
	// cp is the control plane shared by every test and benchmark of this binary.
	cp *harness.ControlPlane
	// extenderBin is the examples/extender binary, built into cp.Dir() (removed with it);
	// errBuild says why it is missing.
	extenderBin string
	errBuild    error
)

func TestMain(m *testing.M) {
	harness.Main(m, envtest.Options{APIServerFlags: []string{"--request-timeout=5s"}}, func(c *harness.ControlPlane) {
		cp = c
		extenderBin, errBuild = harness.BuildProgram(filepath.Join(c.Dir(), "extender"), "./examples/extender", race)
	})
}
