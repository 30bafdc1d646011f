// Package envtest runs real Kubernetes peers for the tests of HAMi-compatible components:
// etcd and kube-apiserver on 127.0.0.1 with TLS, RBAC and service-account tokens, and
// kube-scheduler on demand. Package [github.com/hamireg/hamireg/envtest/kubeletpeer] adds
// the kubelet's own device-plugin code (the registration server, devicemanager.ManagerImpl),
// and [github.com/hamireg/hamireg/envtest/proc] the process spawner they all run under.
// It plays the part controller-runtime's envtest plays for controllers, with the peers a
// device plugin, a scheduler extender or a node agent talks to, and runs from the same
// folder of release binaries ($KUBEBUILDER_ASSETS). No file of the module imports testing,
// so programs may use it too (examples/quickstart does). kubeletpeer is a module of its
// own: envtest does not require k8s.io/kubernetes, so a module that uses only envtest needs
// no replace directives.
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
// no kubelet, no "default" ServiceAccount). The Example starts the control plane, registers a
// node agent with package kubelettest's fake kubelet and calls Allocate as the kubelet does;
// kubeletpeer's Example does the same with the kubelet's own device manager.
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
// main). SchedulerOptions.Binary runs another kube-scheduler-compatible binary in its place,
// e.g. one built with a framework plugin (app.WithPlugin). [BuildProgram] builds a program of a module for a test to run it as a process.
//
// Every child runs with Pdeathsig SIGKILL in its own process group (package proc), so
// nothing outlives the process that started it; a temporary folder left by a killed
// process is removed by the next Start ([MakeTempDir], [RemoveStaleDirs]).
//
// # The peer binaries
//
// Each start runs release binaries from a folder; it needs only its own:
//
//   - [Start] (and StartAPIServer) needs etcd and kube-apiserver;
//   - [ControlPlane.StartScheduler] needs kube-scheduler, unless SchedulerOptions.Binary
//     names a scheduler binary of one's own.
//
// Each binary is taken from the first of these folders that holds it as an executable file:
// [Options.BinDir], $HAMIREG_K8S_BIN ([EnvBinDir]), $KUBEBUILDER_ASSETS
// ([EnvKubebuilderAssets]). A binary found in none of them makes the start fail with a
// [*BinaryNotFoundError] that wraps [ErrBinariesMissing] and names the binary, the folders
// searched and how to get it. Tests should fail on it, not skip: a suite that silently
// skips proves nothing.
//
// setup-envtest, controller-runtime's downloader, gives etcd and kube-apiserver, enough for
// Start (controller-runtime's users already have its folder); it has no kube-scheduler:
//
//	export KUBEBUILDER_ASSETS=$(setup-envtest use 1.37.x -p path)
//
// hack/k8sbins/build.sh, from a clone of the hamireg repository at the version your go.mod
// requires, builds all three from the Go module proxy (5 to 17 minutes cold, once per
// version) into ~/.cache/hamireg/k8sbins/<version>-<hash> and prints the folder; `make e2e`
// in the repository runs it and sets the variable:
//
//	export HAMIREG_K8S_BIN=$(path/to/hamireg/hack/k8sbins/build.sh)
//
// Both can be set: a folder named by $HAMIREG_K8S_BIN that holds only kube-scheduler (from
// the Kubernetes release, https://dl.k8s.io/release/v1.37.2/bin/linux/amd64/kube-scheduler)
// completes setup-envtest's folder. Binaries from the Kubernetes and etcd release archives
// work too if their versions match the ones this module is tested with (Kubernetes 1.37,
// etcd 3.7, as hack/k8sbins/go.mod pins).
//
// # Your go.mod
//
// envtest needs no replace directives:
//
//	go get github.com/hamireg/hamireg/envtest@v0.1.0
//
// Package kubeletpeer (the kubelet's device manager and DRA manager) is the module
// github.com/hamireg/hamireg/envtest/kubeletpeer. It requires k8s.io/kubernetes, which
// requires its staging modules (k8s.io/api, k8s.io/client-go, …) at the placeholder version
// v0.0.0 and maps them to ./staging in its own go.mod. Replace directives apply only in the
// main module, so a module that depends on kubeletpeer must carry the same block of replace
// lines, mapping each staging module to its published version (31 lines for Kubernetes
// v1.37); without them `go get` and `go build` fail with "unknown revision v0.0.0". Write
// the block into your go.mod (or refresh it after an upgrade), then add the module:
//
//	go run github.com/hamireg/hamireg/envtest/cmd/replaces@v0.1.0 -w
//	go get github.com/hamireg/hamireg/envtest/kubeletpeer@v0.1.0
//
// The first command has no dependencies and no replace directives of its own (so `go run
// …@version` works); it prints the block without -w, and -w rewrites ./go.mod (another file:
// -modfile path): it drops the replace lines of those modules and appends the block, the same
// block hack/k8sbins/regen.sh writes into kubeletpeer's go.mod. Use the same version for both
// commands.
//
// # Concurrency
//
// All methods are safe for concurrent use; StopAPIServer/StartAPIServer/RestartAPIServer
// must not overlap each other, and tests that call them must not run in parallel with
// tests that need the apiserver.
package envtest
