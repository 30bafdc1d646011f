// Package harness runs real Kubernetes control-plane peers for the e2e tests: etcd and
// kube-apiserver on 127.0.0.1, and kube-scheduler on demand, built from the Go module proxy
// by hack/k8sbins (see hack/e2e.sh, run by `make e2e`).
//
// # Lifecycle
//
// One control plane per test binary: TestMain calls [Main], which calls [Start] before the
// tests and [ControlPlane.Stop] after them. Tests share it and isolate themselves by
// namespace or object names (the cluster is empty apart from bootstrap objects: no
// controller-manager, no kubelet, no "default" ServiceAccount).
//
//	var cp *harness.ControlPlane
//
//	func TestMain(m *testing.M) {
//		harness.Main(m, harness.Options{}, func(c *harness.ControlPlane) { cp = c })
//	}
//
//	func TestSomething(t *testing.T) {
//		t.Parallel()
//		nodes := cp.AdminClient().CoreV1().Nodes()
//		...
//		limited, err := cp.ServiceAccountClient(t.Context(), "ns", "sa", "some-cluster-role")
//		...
//	}
//
// [Start] makes ECDSA certificates in Go, a static admin token (group system:masters) and a
// service-account signing key, runs etcd (no fsync, 10 ms heartbeats) and kube-apiserver
// (--authorization-mode=Node,RBAC) on free ports, waits for /readyz and logs the versions
// it got ("etcd 3.7.0 ready in …; kube-apiserver v1.37.2 ready in …"). Every child runs with
// Pdeathsig SIGKILL in its own process group, so nothing outlives the test binary; the
// temporary folder is removed by Stop, or by the next Start if the binary was killed.
//
// [ControlPlane.StopAPIServer], [ControlPlane.StartAPIServer] and
// [ControlPlane.RestartAPIServer] stop and restart kube-apiserver on the same port against
// the same etcd, for tests of components that must survive an apiserver outage.
// [ControlPlane.StartScheduler] runs kube-scheduler with a given KubeSchedulerConfiguration
// (profiles, extenders), optionally with a host name of its own (SchedulerOptions.Hostname):
// [WithHostname] gives any child a UTS namespace and host name, as each replica of a
// Deployment has, so that leader-election identities differ on one machine.
//
// # Missing binaries
//
// If $HAMIREG_K8S_BIN does not hold kube-apiserver, etcd and kube-scheduler, Start returns
// [ErrBinariesMissing] and Main makes the test binary FAIL with a message naming
// `make e2e`: a suite that silently skips proves nothing.
//
// # From a program
//
// Nothing here needs a test binary except [Main] and the helpers taking a testing.TB:
// examples/quickstart runs Start, StartScheduler and WithHostname from its main, which calls
// [ExecIfHostnameChild] (and kubeletpeer.ReexecIfChild) first.
//
// # Concurrency
//
// All methods are safe for concurrent use; StopAPIServer/StartAPIServer/RestartAPIServer
// must not overlap each other, and tests that call them must not run in parallel with
// tests that need the apiserver.
package harness
