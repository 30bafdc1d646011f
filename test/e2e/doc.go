// Package e2e holds the hamireg tests against real peers, in a module of its own so that
// k8s.io/kubernetes (and its 31 staging replace directives) never reaches the SDK's
// go.mod.
//
//   - harness: etcd, kube-apiserver and kube-scheduler processes, one control plane per
//     test binary.
//   - kubeletpeer: the kubelet's device-plugin registration server and device manager.
//   - controlplane, kubelet, scheduler: tests proving the peers behave like a cluster's.
//   - register, kubeletplugin, schedcache: the SDK's components against those peers.
//
// Run everything with `make e2e` (hack/e2e.sh): it builds the binaries into a cache outside
// the repository and sets HAMIREG_K8S_BIN. `make e2e E2E_FLAGS="-run X -v"` passes flags to
// go test. Without the binaries the tests fail; they never skip.
package e2e
