// Package envtest runs real Kubernetes peers for the tests of HAMi-compatible components:
// etcd and kube-apiserver on 127.0.0.1 with TLS, RBAC and service-account tokens, and
// kube-scheduler on demand. Package [github.com/hamireg/hamireg/envtest/kubeletpeer] adds
// the kubelet's own device-plugin code (the registration server, devicemanager.ManagerImpl),
// and [github.com/hamireg/hamireg/envtest/proc] the process spawner they all run under.
// It plays the part controller-runtime's envtest plays for controllers, with the peers a
// device plugin, a scheduler extender or a node agent talks to. No file of the module
// imports testing, so programs may use it too (examples/quickstart does).
//
// # Lifecycle
//
// [Start] makes ECDSA certificates in Go, a static admin token (group system:masters) and a
// service-account signing key, runs etcd (no fsync, 10 ms heartbeats) and kube-apiserver
// (--authorization-mode=Node,RBAC) on free ports, waits for /readyz and logs the versions
// it got ("etcd 3.7.0 ready in …; kube-apiserver v1.37.2 ready in … at https://…").
// [ControlPlane.Stop] stops every peer and removes the temporary folder. Start one control
// plane per test binary, in TestMain, and let the tests share it, isolated by namespace or
// object names: the cluster is empty apart from bootstrap objects (no controller-manager,
// no kubelet, no "default" ServiceAccount). The Example starts the control plane and the
// kubelet's device manager, registers a node agent and calls Allocate as the kubelet does.
//
// [ControlPlane.AdminClient] and [ControlPlane.RESTConfig] are the admin's;
// [ControlPlane.ServiceAccountClient] and [ControlPlane.ServiceAccountKubeconfig] give a
// component exactly the RBAC its manifests grant. [ControlPlane.StopAPIServer],
// [ControlPlane.StartAPIServer] and [ControlPlane.RestartAPIServer] stop and restart
// kube-apiserver on the same port against the same etcd, for components that must survive
// an outage. [ControlPlane.StartScheduler] runs kube-scheduler with a given
// KubeSchedulerConfiguration (profiles, extenders), optionally with a host name of its own
// (SchedulerOptions.Hostname): [WithHostname] gives any child a UTS namespace and host name,
// as each replica of a Deployment has, so that leader-election identities differ on one
// machine; the binary that uses it must call [ExecIfHostnameChild] first (in TestMain, or in
// main). [BuildProgram] builds a program of a module for a test to run it as a process.
//
// Every child runs with Pdeathsig SIGKILL in its own process group (package proc), so
// nothing outlives the process that started it; a temporary folder left by a killed
// process is removed by the next Start ([MakeTempDir], [RemoveStaleDirs]).
//
// # The peer binaries
//
// Start runs kube-apiserver, etcd and kube-scheduler from [Options.BinDir], default
// $HAMIREG_K8S_BIN ([EnvBinDir]); without them it returns [ErrBinariesMissing], whose
// message says how to get them. Tests should fail on it, not skip: a suite that silently
// skips proves nothing. In the hamireg repository `make e2e` builds them from the Go module
// proxy with hack/k8sbins/build.sh into ~/.cache/hamireg/k8sbins/<version>-<hash> and sets
// the variable; from a clone of the repository at the version your go.mod requires:
//
//	export HAMIREG_K8S_BIN=$(path/to/hamireg/hack/k8sbins/build.sh)
//
// Binaries from elsewhere (the Kubernetes and etcd release archives) do too if their
// versions match the ones this module's hack/k8sbins/go.mod pins.
//
// # Your go.mod
//
// The module requires k8s.io/kubernetes (for the kubelet's device manager), which requires
// its staging modules (k8s.io/api, k8s.io/client-go, …) at the placeholder version v0.0.0
// and maps them to ./staging in its own go.mod. Replace directives apply only in the main
// module, so every module that depends on this one — yours — must carry the same block of
// replace lines, mapping each staging module to its published version (31 lines for
// Kubernetes v1.37). Without them `go get` and `go build` fail with "unknown revision
// v0.0.0". Write the block into your go.mod (or refresh it after an upgrade), then add the
// module, with:
//
//	go run github.com/hamireg/hamireg/envtest/cmd/replaces@latest -w
//	go get github.com/hamireg/hamireg/envtest@latest
//
// The first command has no dependencies and no replace directives of its own (so `go run
// …@version` works); it prints the block without -w, and -w rewrites ./go.mod (another file:
// -modfile path): it drops the replace lines of those modules and appends the block, the same
// block hack/k8sbins/regen.sh writes into this module's go.mod. Use the same version for both
// commands.
//
// # Concurrency
//
// All methods are safe for concurrent use; StopAPIServer/StartAPIServer/RestartAPIServer
// must not overlap each other, and tests that call them must not run in parallel with
// tests that need the apiserver.
package envtest
