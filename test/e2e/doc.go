// Package e2e holds the hamireg tests against real peers, in a module of its own so that
// k8s.io/kubernetes (and its 31 staging replace directives) never reaches the SDK's
// go.mod. The peers are run by the library module envtest (../../envtest): the control
// plane (etcd, kube-apiserver, kube-scheduler), envtest/proc, which starts the processes so
// that none outlives its starter, and envtest/kubeletpeer, the kubelet's device-plugin
// registration server and device manager and its DRA manager; examples/quickstart runs them
// too.
//
//   - harness: the testing.TB layer over envtest, one control plane per test binary
//     (harness.Main), Eventually, CreateNode, StartDeviceManagerForTest, ShortTempDir, ...
//   - controlplane, kubelet, scheduler: tests proving the peers behave like a cluster's.
//   - register, kubeletplugin, schedcache, nodelock, diagnose: the SDK's components against
//     those peers.
//   - nodeagent: examples/deviceplugin against the kubelet's device manager, HAMi's Allocate
//     protocol, and the full loop with kube-scheduler and examples/extender.
//   - extender: examples/extender called by a real kube-scheduler: placement, over-commit,
//     rejection reasons, a restart, throughput.
//   - mig: MIG end to end: kube-scheduler, examples/extender, the kubelet's device manager and
//     examples/deviceplugin --simulate dgxa100 --mig: profiles chosen by NVML's memory, a GPU's
//     placements filled, a freed placement reused, Pending reasons, no overlapping instance.
//   - extenderha: the admission webhook called by the API server over TLS, and two replicas
//     with a failover.
//   - dra: the node agent's DRA output (nodeagent Options.DRA, in-process on a simulated
//     dgxa100) with kube-scheduler and the kubelet's DRA manager: the slice and its writes,
//     claims allocated, prepared with HAMi-core's limits and unprepared across an agent
//     restart, Pending reasons, one owner per GPU against examples/extender, HAMi-DRA's
//     claims.
//   - cdi: the CDI device names and annotations of hamicore's cdi-annotations and cdi-cri
//     strategies read back with the CDI project's own parser (no peer needed).
//   - quickstart: the examples/quickstart binary end to end: every step's lines, --keep and
//     Ctrl-C, an interrupt midway, a machine without namespaces; nothing left behind.
//
// Run everything with `make e2e` (hack/e2e.sh): it builds the binaries into a cache outside
// the repository and sets HAMIREG_K8S_BIN. `make e2e E2E_FLAGS="-run X -v"` passes flags to
// go test. Without the binaries the tests fail; they never skip (one quickstart test needs
// root to build its user namespace, and says so when it skips).
package e2e
