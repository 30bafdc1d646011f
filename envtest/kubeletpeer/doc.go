// Package kubeletpeer runs the kubelet's own device-plugin code as a peer for tests of
// device plugins: the registration server alone, or the complete device manager; and the
// kubelet's DRA manager for tests of DRA drivers. It imports no testing package, so a
// program (examples/quickstart) can use it too; package
// [github.com/hamireg/hamireg/envtest] runs the API server it is tested with.
//
// # Your go.mod
//
// kubeletpeer is a module of its own, github.com/hamireg/hamireg/envtest/kubeletpeer,
// because it requires k8s.io/kubernetes (envtest does not). k8s.io/kubernetes requires its
// staging modules (k8s.io/api, k8s.io/client-go, …) at the placeholder v0.0.0, and replace
// directives apply only in the main module, so your go.mod needs the block of replace
// lines that maps each of them to its published version (31 for Kubernetes v1.37; without
// it `go get` fails with "unknown revision v0.0.0"). Write it, then add the module:
//
//	go run github.com/hamireg/hamireg/envtest/cmd/replaces@v0.1.0 -w
//	go get github.com/hamireg/hamireg/envtest/kubeletpeer@v0.1.0
//
// Run the first command again after an upgrade, with the same version as the module. The
// peers of this package are compiled into the test binary; only envtest's control plane
// needs binaries (etcd and kube-apiserver, see package envtest).
//
// # Registration server
//
// [StartRegistrationServer] serves the kubelet's registration server
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1) on <dir>/kubelet.sock,
// in-process. Its handler does what ManagerImpl does where a plugin can observe it (delete
// stale sockets at start, call GetDevicePluginOptions on connect) and reports every
// connect, ListAndWatch message and disconnect as an [Event]. [RegistrationServer.Restart]
// is a kubelet restart as plugins see it.
//
//	srv, err := kubeletpeer.StartRegistrationServer(ctx, dir)
//	if err != nil {
//		return err
//	}
//	defer srv.Stop()
//	// the plugin serves on srv.Dir()/vendor.sock and registers at srv.SocketPath()
//	ev, err := srv.WaitFor(ctx, func(e kubeletpeer.Event) bool { return e.Kind == kubeletpeer.EventListAndWatch })
//
// # Device manager
//
// [StartDeviceManager] runs devicemanager.ManagerImpl, the code that turns a plugin's
// device list into the Node's capacity and allocatable, including the checkpoint and the
// 5 minute grace period. NewManagerImpl hard-codes /var/lib/kubelet/device-plugins, so the
// manager runs in a child process — the test binary re-executed — in a private mount
// namespace (CLONE_NEWNS; plus CLONE_NEWUSER when not root, like `unshare -rm`): / is made
// private, a tmpfs covers /var/lib and the test's folder is bind-mounted at
// /var/lib/kubelet/device-plugins. The host's /var/lib is never touched, and the plugin
// under test uses [DeviceManager.Dir] like a real node's folder. If the machine forbids the
// namespace, StartDeviceManager fails with [ErrNamespace]; tests must not skip on it.
//
//	func TestMain(m *testing.M) {
//		if code, child := kubeletpeer.RunIfChild(context.Background()); child {
//			os.Exit(code) // the kubelet device manager's child ends here
//		}
//		os.Exit(m.Run())
//	}
//
// and in a test:
//
//	dm, err := kubeletpeer.StartDeviceManager(ctx, kubeletpeer.DeviceManagerOptions{})
//	if err != nil {
//		return err
//	}
//	defer dm.Stop()
//	// the plugin serves on dm.Dir()/vendor.sock and registers at dm.SocketPath()
//	res, err := dm.Capacity(ctx) // res.Capacity["vendor.com/gpu"], res.Allocatable[…]
//	if err != nil {
//		return err
//	}
//	if err := dm.Restart(ctx); err != nil { // kubelet restart: plugin sockets deleted, kubelet.sock re-created
//		return err
//	}
//	a, err := dm.Allocate(ctx, pod, "cuda") // the kubelet admitting one container: a.DeviceIDs, a.Envs, a.Mounts, a.Devices
//
// [DeviceManager.WaitForResources] waits until the manager reports a capacity and
// allocatable (bound it with a deadline on ctx). Socket paths must stay under the 108-byte
// limit of unix sockets: put Dir in a short folder (os.MkdirTemp("", "kp-")), not under
// t.TempDir(), which embeds the test's name.
//
// # DRA manager
//
// [StartDRAManager] runs the kubelet's DRA manager (k8s.io/kubernetes/pkg/kubelet/cm/dra)
// and the kubelet's plugin manager watching [DRAManager.RegistryDir], in-process (the state
// folder is a parameter, so no namespace is needed), wired as the kubelet wires them. A
// DRA driver registers there; the test then plays the kubelet for a pod whose claims are
// allocated and reserved for it:
//
//	m, err := kubeletpeer.StartDRAManager(ctx, kubeletpeer.DRAManagerOptions{Client: client, NodeName: "node-1"})
//	if err != nil {
//		return err
//	}
//	defer m.Stop()
//	// the driver registers in m.RegistryDir()
//	if err := m.WaitForDriver(ctx, "gpu.example.com"); err != nil {
//		return err
//	}
//	if err := m.Prepare(ctx, pod); err != nil { // NodePrepareResources of the pod's claims
//		return err
//	}
//	ids, err := m.GetResources(pod, "cuda") // CDI device IDs for the container runtime
//	...
//	err = m.Unprepare(ctx, pod) // NodeUnprepareResources
//
// At start the manager deletes the node's ResourceSlices of every driver, in the
// background; [DRAManager.WaitForWipe] waits for it, so a driver that publishes afterwards
// is not wiped. A manager started again on the same StateDir is a kubelet restart.
//
// # Device health in the pod's status
//
// The kubelet writes the health of a pod's devices into
// status.containerStatuses[].allocatedResourcesStatus (KEP-4680, ResourceHealthStatus, on
// in 1.37) whenever it syncs the pod's status, and syncs a pod when a manager reports on its
// updates channel that one of the pod's devices changed health. Both peers do that part:
// [DRAManager.UpdateAllocatedResourcesStatus] and [DeviceManager.UpdateAllocatedResourcesStatus]
// fill in a status as the kubelet's managers do (DRA: entry "claim:<pod claim name>", the
// device's CDI device ID as resourceID, the health and message the driver streamed;
// device plugin: entry per resource name, the device ID, the health from ListAndWatch);
// WritePodStatus reads the pod, adds waiting statuses for containers without one, fills them
// in and writes the status when it changed; SyncPodStatus follows the manager's updates
// channel and writes the status of the pods it names, among those given to Prepare
// (DRA) or Allocate and Admit (device plugin), until its context ends. Nothing is written
// unless a test calls them, so a peer without them behaves as before.
//
// The package's Example is a node agent's test against the API server and the device
// manager together.
//
// # Lifecycle and concurrency
//
// The peers are started by a Start function and stopped by Stop, which is idempotent and
// removes what Start created; the child process also dies with the test binary (Pdeathsig).
// Methods are safe for concurrent use; DeviceManager serialises requests to its child.
package kubeletpeer
