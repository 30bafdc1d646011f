// Package schedplugin is HAMiGPU, a kube-scheduler framework plugin that places HAMi GPU pods
// inside kube-scheduler instead of through an extender, wire-compatible with HAMi's device
// plugin and the SDK's node agent: the same pod annotations, the same node lock.
//
// # Extension points
//
// PreFilter reads the pod's request (allocation.Requests) for the first configured vendor it
// asks for; a pod without devices is skipped everywhere (PreFilter, PreScore and
// PreBindPreFlight return Skip, Reserve, PreBind and Unreserve do nothing, and SignPod signs it
// with one constant fragment so batching stays on). Filter fits the pod on the NodeInfo it is
// handed: what the node's pods hold comes from their hami.io/vgpu-devices-allocated
// annotations (decoded once per resourceVersion), from the plugin's reservations for assumed
// pods, from fitting the nominated pods the framework added, and from pods placed on the node
// but not bound that the NodeInfo lacks (another HAMi scheduler's); a node's fit is memoised
// while its NodeInfo generation, registration, reservations and the request are the same. The
// registration, pair scores
// and MIG geometry come from a schedcache.Cache. A failure is Unschedulable when removing pods
// could help and UnschedulableAndUnresolvable otherwise (allocation.Unresolvable), so that
// preemption tries exactly the nodes where it can succeed. AddPod and RemovePod move the
// namespace's ResourceQuota usage. Score is HAMi's node score, NormalizeScore maps it to
// [0, 100] for the binpack or spread node policy. Reserve fits again on the chosen node and
// assumes the devices in the usage tracker under one lock, with the quota check; the scheduling
// cycle never calls the API server. PreBind takes HAMi's node lock (queued per node, bounded by
// Args.NodeLockWait) when a regular container asks for a GPU and writes HAMi's annotations in
// one merge patch; Unreserve after PreBind gives the lock back and marks bind-phase "failed".
//
// # Queueing
//
// EventsToRegister names the events that can make a rejected pod fit, with queueing hints
// that compare strings only: an assigned pod holding or asking devices deleted, a node with a
// register annotation added, a register, score or cordon annotation changed (never the node
// lock or the handshake), allocatable devices rising, the pod's own requests or selection
// annotations changed, an unbound pod placed by another scheduler deleted. ResourceQuota
// changes reach the plugin's own informer handler, which calls Handle.Activate for the pods
// rejected for quota in that namespace (no dynamic informer is needed).
//
// # Lifecycle and concurrency
//
// NewFactory returns the factory for app.WithPlugin. The first profile's call builds the
// cluster-wide state that every profile's plugin shares: the node cache (on the handle's Node
// informer, KeepNodeFields), one usage tracker per vendor fed by the handle's pod and
// ResourceQuota informers, the reservation map, the node lock queue. It registers its informer
// handlers there, before the scheduler starts the informers, and runs the node cache in one
// goroutine until the last profile's plugin is closed (Plugin implements io.Closer, which
// kube-scheduler calls at shutdown) or the factory's context ends. PreFilter waits for those
// informers to sync. Filter, Score and the PreFilter extensions run concurrently and take no
// lock shared with the informers.
//
// # Usage
//
// A scheduler binary registers the factory with
// app.NewSchedulerCommand(app.WithPlugin(schedplugin.Name, schedplugin.NewFactory())), and
// kube-scheduler calls it once per profile that enables the plugin, as Example does:
//
//	newPlugin := schedplugin.NewFactory() // one factory: every profile shares its state
//	args := &runtime.Unknown{Raw: []byte("nodeSchedulerPolicy: spread\nhamiVersion: master\nnodeLockWait: 10s\n")}
//	p, err := newPlugin(ctx, args, handle{client: client, factory: factory})
//
// with a profile that enables HAMiGPU at every point (multiPoint) and its args, for example
//
//	pluginConfig:
//	- name: HAMiGPU
//	  args:
//	    nodeSchedulerPolicy: spread
//	    hamiVersion: master
//	    nodeLockWait: 10s
//
// Metrics: Plugin.Collectors returns HAMi's scheduler metric families from the shared state
// (the extender's collectors), for the binary to register where kube-scheduler serves them.
//
// The scheduler needs, beyond system:kube-scheduler, pods patch, nodes patch (the lock) and
// resourcequotas list and watch.
package schedplugin
