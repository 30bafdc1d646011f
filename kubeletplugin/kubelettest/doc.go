// Package kubelettest provides a fake kubelet registration server for unit tests of device
// plugins, in the spirit of net/http/httptest.
//
// [Start] (or [NewServer] outside tests) serves kubelet.sock in a short temporary folder (unix socket paths must stay
// under 108 bytes). Like the kubelet, the fake validates each Register request (API version,
// extended resource name), dials the plugin back at <folder>/<Endpoint>, calls
// GetDevicePluginOptions and reads the plugin's ListAndWatch stream; [Kubelet.State] and
// [Kubelet.WaitFor] expose the requests, the connected plugins and their last device list.
// [Kubelet.Reject] makes Register fail, [Kubelet.Restart] does what a kubelet restart does to
// plugins (streams closed, every socket in the folder deleted, kubelet.sock re-created).
//
// A test then calls the plugin as the kubelet's device manager does, over the connection the
// fake dialed: [Kubelet.Allocate] (one ContainerAllocateRequest per container, with replica
// IDs), [Kubelet.GetPreferredAllocation] and [Kubelet.PreStartContainer]. [Kubelet.PickHealthy]
// chooses a container's replica IDs the way the kubelet does: healthy devices of the last
// ListAndWatch list that no earlier Allocate handed out ([State.Allocated]), the plugin's
// preference when it advertises GetPreferredAllocation (see [ExampleKubelet_Allocate]).
//
// The real kubelet rejects a Register for an endpoint whose ListAndWatch stream is still open
// ("device plugin already connected") and, as a side effect, forgets the open stream, so the
// plugin's devices stay allocatable after it dies. The fake rejects the same way, counts the
// attempt in [State.Duplicates] and keeps the stream, so a test can assert Duplicates == 0.
//
//	k := kubelettest.Start(t)
//	// the plugin serves k.Dir()/vendor.sock and registers at k.SocketPath()
//	st, err := k.WaitFor(ctx, func(s kubelettest.State) bool {
//		p, ok := s.Resource("vendor.com/gpu")
//		return ok && p.Healthy() == 4
//	})
//
// # Lifecycle and concurrency
//
// Start registers a cleanup ([Kubelet.Close]) that stops the server, closes the plugin connections, waits for
// every goroutine of the fake and removes the folder. Methods are safe for concurrent use;
// Restart and Stop must not be called concurrently with each other.
package kubelettest
