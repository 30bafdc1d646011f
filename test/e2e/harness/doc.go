// Package harness is the e2e tests' testing.TB layer over the real-peer library
// github.com/hamireg/hamireg/envtest: one control plane per test binary ([Main], which
// fails the binary, never skips, when the peer binaries are missing), polling with a
// deadline ([Eventually]), Nodes created and deleted per test ([ControlPlane.CreateNode]),
// a test's logger ([Context]), names that keep tests apart on the shared cluster
// ([UniqueName], [TestLabel]), and the kubelet peer per test ([StartDeviceManagerForTest],
// [WaitForResources], [WaitForEvent], [ShortTempDir]), and DRA's ([ControlPlane.StartDRAManagerForTest],
// [Claim], [ControlPlane.CreateClaimPod], [ControlPlane.WaitForAllocation],
// [ControlPlane.ReleaseClaim] in place of kube-controller-manager, [ResolveCDI],
// [ControlPlane.WatchSlices] to count slice writes), and kube-scheduler built with the
// HAMiGPU plugin ([ControlPlane.StartHAMiScheduler] with [HAMiSchedulerConfig], the
// configuration of examples/scheduler/deploy). Everything that needs no testing.TB
// (Start, Options, StartScheduler, WithHostname, Readyz, FreePorts, the process spawner,
// the kubelet peers) is in envtest and its packages proc and kubeletpeer.
//
//	var cp *harness.ControlPlane
//
//	func TestMain(m *testing.M) {
//		harness.Main(m, envtest.Options{}, func(c *harness.ControlPlane) { cp = c })
//	}
//
//	func TestSomething(t *testing.T) {
//		t.Parallel()
//		node := cp.CreateNode(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: harness.UniqueName("node")}})
//		limited, err := cp.ServiceAccountClient(t.Context(), "ns", "sa", "some-cluster-role")
//		...
//	}
package harness
