// Package kubeletplugin is the device-plugin side of channel 1 of HAMi registration: a
// device plugin gRPC server (deviceplugin v1beta1) and its registration with the kubelet,
// which then advertises the vendor's resource ([Options.Vendor]; nvidia.com/gpu by default) in
// the Node's capacity and allocatable.
//
// Each GPU (an [annotation.Device]) is published as Count virtual devices (Count is the split
// count, as in the register annotation) with HAMi's ids "<uuid>-<i>" ([VirtualDeviceID],
// [ParseVirtualDeviceID] for the way back), the GPU's health and, with
// [Options.NUMATopology] (default off, as HAMi v2.10.0), its NUMA node as topology
// ([VirtualDevices] has the rule, MIG devices included). The kubelet counts capacity = GPUs x
// split count and allocatable = the healthy virtual devices. [Plugin.SetDevices] replaces the
// GPUs; every change is re-sent, as a full list, on the open ListAndWatch stream.
//
// # Lifecycle
//
// [New] validates [Options]; [Plugin.Run] does the rest and blocks until its context ends:
//
//  1. It checks that kubelet.sock is in [Options.PluginDir] (default
//     /var/lib/kubelet/device-plugins; a kubelet with --root-dir=R reads R/device-plugins, see
//     [PluginDirFromRootDir]). If not, it returns a [*KubeletSocketError] (wrapping
//     [ErrKubeletSocketMissing]) naming the folder and the check to make (`ps aux | grep
//     kubelet`, --root-dir): a socket written where the kubelet never reads is the most common
//     reason a node shows no GPUs.
//  2. It takes a lock (<socket>.lock, flock) so that no second Plugin serves the same endpoint,
//     removes a stale socket (one that does not answer; a live one is [ErrSocketInUse]),
//     serves, and only then calls Register (the kubelet dials the plugin back before it
//     answers).
//  3. It watches the folder with fsnotify. A kubelet restart deletes every socket in the folder
//     and re-creates kubelet.sock; the plugin reacts at once to the CREATE of kubelet.sock and
//     to the removal of its own socket, and every [Options.ResyncPeriod] stats both sockets
//     (so a missed event is caught too). It then stops the old server, serves again and
//     registers again. When the kubelet closes the stream, the plugin stops serving at once
//     and registers again after [Options.InitialBackoff] (or at the CREATE, if sooner), so it
//     does not serve a socket that a starting kubelet is about to delete. A Register in flight
//     is never cancelled. Failures are retried with exponential backoff ([Options.InitialBackoff] to
//     [Options.MaxBackoff], reset when kubelet.sock is re-created); a rejection by the kubelet
//     (invalid resource name, unsupported version, no dial-back) ends Run with a
//     [*RegistrationError], as the device-plugin API asks plugins to terminate.
//  4. When ctx ends it ends the stream (the kubelet moves the devices to unhealthy at once),
//     stops the server, removes its socket and returns nil, after every goroutine it started
//     has returned.
//
// # The duplicate-Register trap
//
// The kubelet rejects a Register for an endpoint whose ListAndWatch stream is still open and
// in doing so forgets the open stream, so that the devices stay allocatable after the plugin
// dies. This package never sends such a Register: each gRPC server instance is registered at
// most once; before registering again the old instance is stopped, which first ends its
// stream cleanly and waits (up to [Options.DrainTimeout]) until the kubelet has closed its
// connection (the kubelet does that while it forgets the endpoint), then stops the server; a
// failed or timed-out Register also discards its server. The flock keeps two Plugins (in one
// process or two) off the same endpoint.
//
// # Registration modes
//
// [ModeRegister] (default) is the classic flow above; it works with every kubelet and is what
// HAMi and NVIDIA's plugin do. Choose [ModePluginWatcher] when the kubelet's plugin watcher
// is available and you prefer the kubelet to find the plugin: the socket goes to
// [Options.RegistryDir] (<root>/plugins_registry), the kubelet dials it, calls GetInfo and
// NotifyRegistrationStatus, and re-discovers it by itself after a restart, as the DRA
// kubeletplugin helper does. Then [Options.Endpoint] must be the socket path as the kubelet
// sees it (the host path), not the path inside the plugin's container.
//
// # Concurrency
//
// All methods of [Plugin] are safe for concurrent use; SetDevices never blocks on the kubelet.
// One Run may be active at a time ([ErrAlreadyRunning]). Allocate and the other callbacks may
// be called concurrently; each sees the devices published at the time of the call. Tests use
// package [github.com/hamireg/hamireg/kubeletplugin/kubelettest], a fake kubelet.
//
// # Usage
//
// Most programs do not use this package directly: package
// [github.com/hamireg/hamireg/nodeagent] runs a Plugin together with the register annotation
// and HAMi's Allocate protocol. On its own (the snippet is [ExampleNew]):
//
//	p, err := kubeletplugin.New(kubeletplugin.Options{PluginDir: kubeletplugin.PluginDirFromRootDir("/var/lib/k0s/kubelet")})
//	if err != nil {
//		return err
//	}
//	p.SetDevices(devices) // []annotation.Device, e.g. from nvmlscan; call again on health changes
//	return p.Run(ctx)
package kubeletplugin
