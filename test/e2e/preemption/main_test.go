// Package preemption_test runs kube-scheduler with the HAMiGPU framework plugin (the
// examples/scheduler program, started by harness.StartHAMiScheduler) against real peers —
// kube-apiserver and etcd on 127.0.0.1 — and proves what an extender cannot do: a GPU pod of
// high priority preempts exactly the lower-priority GPU pods whose memory it needs, and a pod
// that waits for GPU memory is bound soon after its blocker goes. The same pods go through
// the SDK's extender (examples/extender with a stock kube-scheduler) as the baseline, and
// through a stock kube-scheduler without GPU requests ("plain").
//
// No kubelet runs. Nodes are API objects whose devices a register.Writer registers (register
// annotation and handshake) and whose status carries nvidia.com/gpu allocatable. Two small
// loops stand in for the kubelet of those nodes (see cluster in helpers_test.go):
//
//   - the allocator plays HAMi's device plugin through allocationtest.Plugin (the SDK's
//     stand-in of HAMi's Allocate): once the pod named by a node's lock is bound, it consumes
//     the pod's to-allocate list, sets bind-phase success and releases the node lock, so that
//     the next GPU pod of that node can bind;
//   - the reaper force-deletes (grace 0) pods of the test's namespaces that carry a
//     deletionTimestamp. kube-scheduler deletes a victim with empty DeleteOptions, so the
//     victim's terminationGracePeriodSeconds decides: with a grace period the API server
//     only marks a bound pod Terminating and waits for its kubelet, which never comes here —
//     the victim would keep its GPU memory and the preemptor would wait for ever; with 0
//     (every pod of these tests: preemption "with grace 0") it is removed at once
//     (TestDeleteWithoutKubelet shows both). The reaper is the kubelet's confirmation, a
//     safety net for pods deleted with a grace period.
//
// Pods that the tests need in a fixed place (preemption victims) are created already bound,
// with the annotations HAMi's scheduler and device plugin leave on an allocated pod: where
// a victim lies is then known, so the minimum set of victims is too.
package preemption_test

import (
	"path/filepath"
	"testing"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

var (
	// cp is the control plane shared by every test and benchmark of this binary.
	cp *harness.ControlPlane
	// extenderBin is the examples/extender binary (the baseline); errBuild says why it is
	// missing.
	extenderBin string
	errBuild    error
)

func TestMain(m *testing.M) {
	harness.Main(m, envtest.Options{}, func(c *harness.ControlPlane) {
		cp = c
		extenderBin, errBuild = harness.BuildProgram(filepath.Join(c.Dir(), "extender"), "./examples/extender", race)
	})
}
