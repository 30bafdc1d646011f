// Package extender is a HAMi-compatible kube-scheduler extender: the HTTP handlers that
// kube-scheduler calls for the filter and bind verbs of its extender API
// (k8s.io/kube-scheduler/extender/v1), and the mutating admission webhook that sends GPU pods
// to that scheduler. What it writes is what HAMi's scheduler writes, so HAMi's own device
// plugin serves the pods it places, and a node agent built on this SDK serves pods placed by
// HAMi's scheduler.
//
// # Routes
//
// [Extender.Handler] serves:
//
//   - POST /filter: [Extender.Filter]. A pod that asks for no HAMi resource passes every
//     candidate untouched. Otherwise the registered candidates (from one snapshot of a
//     schedcache.Cache) are fitted with HAMi's NVIDIA fit and policies (package allocation),
//     the chosen node is the only one answered, and the pod is patched first with HAMi's
//     filter annotations: one merge patch of hami.io/vgpu-node, hami.io/vgpu-time,
//     hami.io/vgpu-devices-to-allocate and hami.io/vgpu-devices-allocated, and the label
//     hami.io/vgpu-node. When no node fits, every candidate has a reason that starts with
//     HAMi's words and says why, e.g. "node unregistered: NVIDIA malformed: …" or
//     "1/2 CardInsufficientMemory, 1/2 CardNotHealth", which kube-scheduler puts in the pod's
//     FailedScheduling event: in FailedAndUnresolvableNodes when removing pods cannot make the
//     node fit (allocation.Unresolvable: no registered devices, or only reasons about the GPUs
//     themselves such as CardTypeMismatch or NodeInsufficientDevice), so that kube-scheduler
//     does not preempt there, else in FailedNodes. This is the filter of NodeNames
//     (nodeCacheCapable: true, the chart's setting). A filter with whole Node objects in
//     ExtenderArgs.Nodes (the Cluster Autoscaler simulating a node, kube-scheduler with
//     nodeCacheCapable: false) is a simulation, as in HAMi v2.10.0: each request Node is
//     fitted from its own annotations with nothing held on it (Options.SimulationLiveUsage
//     counts the live pods on a registered live node) and the namespace's live quota;
//     nothing is written or assumed. Every request Node that fits is
//     answered (HAMi: one of them), the others are in FailedNodes with HAMi's reason, and a
//     register annotation that does not decode is [ReasonRegisterUnparsable] (HAMi: "node
//     unregistered").
//   - POST /bind: [Extender.Bind]. The node lock (package nodelock) when a regular container
//     asks for a GPU, then the pods/binding carrying hami.io/bind-phase "allocating" and
//     hami.io/bind-time as annotations (the API server writes them onto the pod with
//     spec.nodeName). On a failure after the lock: the lock released and bind-phase "failed".
//     A node locked by another pod (between its bind and its device plugin's Allocate) is
//     waited for, up to Options.NodeLockWait (10 s, HAMi master's --node-lock-retry-timeout),
//     instead of failing the bind into kube-scheduler's back-off of 1 to 10 s. The binds of
//     one node run one at a time; the next one reads the lock from Options.Nodes and the
//     owner from the pod informer, so waiting costs no request, and a free node costs the lock
//     one conditional patch (nodelock.Options.Nodes): a bind is two requests. A waiting bind
//     is woken by the node cache's Node informer when the node's lock annotation changes (and
//     by the pod informer when a pod of the node is deleted), never by a timer.
//   - POST /webhook: [Extender.Admit] in an AdmissionReview (admission.k8s.io/v1 or v1beta1).
//   - GET /healthz (liveness): 200 whenever the handler serves, before the sync too, so that a
//     liveness probe does not restart an extender that is still listing a large cluster.
//   - GET /readyz (readiness): 200 once the pod usage and the node cache synced, 503 before.
//
// Every request gets an answer: a body that does not decode, lacks the pod (filter) or the
// pod, namespace and node (bind), or exceeds Options.MaxBodyBytes (default 1 MiB, HAMi's
// limit) is answered 400 or 413 with the result type's Error set; a wrong method 405; a filter
// that arrives before the caches synced waits with the request's context, then 503. Decisions
// that fail (a failed patch, a held lock) are HTTP 200 with Error, as HAMi answers and as
// kube-scheduler reads them. Nothing panics on any input (fuzz tests with a committed corpus).
//
// # Usage counting
//
// What pods hold of each GPU is kept incrementally from a pod informer: a pod counts on the
// node of its hami.io/vgpu-node annotation with the devices of hami.io/vgpu-devices-allocated
// (HAMi's accounting, so pods placed by HAMi's scheduler count too); a pod that Succeeded or
// Failed, or was deleted, stops counting. No filter recomputes usage over all pods. What a
// filter chose counts at once, before the informer delivers the patched pod (HAMi adds the pod
// to its cache at filter too), and is given back if the patch fails; a pod filtered again does
// not count against itself. A node's fit is reused while the node, its usage and the request
// are the same, so a filter refits only the nodes that changed. A request of one GPU container
// (without NUMA binding, topology-aware placement or a namespace quota that limits it) is not
// even fitted on every node: an allocation.Probe answers yes or no from a compact copy of each
// node's GPUs and usage, and the full fit runs on the chosen node only (or, when none fits, on
// every node for its reason).
// A node with a GPU in MIG mode is never probed (a Probe does not model placements): it is
// fitted.
// BenchmarkFilter compares it with HAMi's way (deep copy of every Node and a recount of every
// pod per call).
//
// # MIG
//
// GPUs in MIG mode (HAMi master's migProfiles) are fitted by allocation's MIG fit (see its
// package doc: the profile and placement per device, CardMigTopologyInfeasible, the rules a-e)
// and the filter patch carries hami.io/vgpu-mig-allocations next to the device lists, as HAMi
// master writes it (mig-fit.json); a pod re-placed without MIG devices has an earlier
// reservation removed. A pod's reservation counts from the informer and, for the pod just
// filtered, at once (no informer race: HAMi reports CardNotHealth for the GPU meanwhile). A
// reservation that does not decode, or does not match the pod's devices, is logged as an error
// and recorded as a Warning MIGReservationInvalid Event on the pod; its devices then occupy
// every placement of their MIG GPUs. With Options.Config.Version v2.9.0 MIG GPUs are not
// fitted (CardNotFoundCustomFilterRule).
//
// # Metrics
//
// With Options.Registerer the extender registers HAMi's scheduler metric families, computed at
// each scrape from the node cache (registered nodes and their GPUs) and the usage index (what
// each pod holds, per container and GPU): hami_gpu_memory_limit_bytes,
// hami_gpu_core_limit_ratio, hami_gpu_memory_allocated_bytes, hami_gpu_shared_count,
// hami_gpu_core_allocated_ratio, hami_node_gpu_overview, hami_node_gpu_memory_allocated_ratio,
// hami_vgpu_memory_allocated_bytes, hami_vgpu_core_allocated_ratio, the quota families
// hami_resource_quota_used and (master) hami_resource_quota_limit, and hami_build_info, with
// HAMi's help, labels (zone="vGPU" on every family but the build info) and values, by the rules
// of Options.Config.Version: v2.9.0's device_cores label is the used cores and its overview has
// shared_containers; master's device_cores is the GPU's cores, its container gauges are one
// series per pod and GPU under container_index "0", and it leaves out the memory ratio of a GPU
// without memory (v2.9.0 serves NaN). Options.LegacyMetrics adds HAMi's legacy names
// (--legacy-metrics) beside them. Served with promhttp.HandlerFor(registry,
// promhttp.HandlerOpts{}), the exposition is HAMi's byte for byte (metrics.json), except where
// HAMi is wrong: the node gauges show what the counted pods hold, so a pod a filter placed shows
// on its chosen node at once and on no other candidate (HAMi v2.9.0 shows its trial allocation
// on every candidate; master shows the node gauges up to 15 s late, behind its container
// gauges). The quota families come from the ResourceQuota state ([QuotaUsage]).
//
// The extender's own metrics, on the same Registerer and named hamireg_extender_*
// ([MetricsPrefix]), are separate families: filter_duration_seconds by result (placed,
// unschedulable, no_gpu, error), bind_duration_seconds by result (ok, error),
// filter_lock_wait_seconds (filters waiting for each other), node_lock_wait_seconds (binds
// waiting for the node lock), annotation_decode_failures_total (pod device lists that do not
// decode and so do not count) and pods (pods counted). Gathering without the hamireg_ families
// gives HAMi's exposition alone.
//
// # Differences from HAMi, deliberate
//
//   - FailedNodes gives the fit reason for a registered node with either HAMi version (v2.9.0
//     says "NodeUnfitPod") and says why a node is unregistered; nodes that removing pods
//     cannot help are in FailedAndUnresolvableNodes instead (HAMi: all in FailedNodes).
//   - /healthz is liveness (200 while serving), /readyz readiness (HAMi serves neither).
//   - The webhook's JSON patch is computed as the difference between the admitted and the
//     mutated pod (gomodules.xyz/jsonpatch/v2), not op by op; the patched pod is the same.
//   - A failed bind sets bind-phase "failed" (HAMi leaves "allocating") after releasing the lock.
//   - A bind waits for a held node lock (HAMi v2.9.0 fails at once; NodeLockWait < 0 does too).
//   - bind-phase and bind-time travel on the Binding instead of a merge patch before it: one
//     request less, and no pod is "allocating" without a node; the pod's annotations are the
//     same.
//   - Readiness is a signal (/readyz), not a 100 ms poll.
//   - One vendor per extender (Options.Vendor): NVIDIA, or a vendor HAMi does not know with
//     allocation's generic fit; HAMi's other vendors are refused (allocation.ErrVendorRules).
//   - ResourceQuota on GPU memory and cores is HAMi's (same keys, per-GPU check, reason word,
//     webhook denial, both versions' rules) with these fixes: the check and the assume are one
//     step under the filter's lock, so two filters of one namespace in flight never both pass a
//     quota only one fits; a re-filtered pod counts once; several ResourceQuota objects of a
//     namespace combine as the tightest and deleting one leaves the others in force; a
//     fractional limit limits to its integer part; a failed patch gives the quota back (after
//     a failed bind the pod holds it, as HAMi counts it, until it is filtered again);
//     a rejection adds after HAMi's words which quota, the limit, the usage and its pods and
//     the ask (FailedNodes and a ResourceQuotaNotFit Warning Event); a key HAMi ignores
//     (requests.nvidia.com/gpumem, limits.nvidia.com/gpu, …) gets a GPUQuotaWarning Event on
//     its ResourceQuota; a delete tombstone removes the limit (v2.9.0 keeps it forever). The
//     usage is the exported tracker of package usage.
//
// # Lifecycle and concurrency
//
// [New] validates the options and starts nothing. [Extender.Run] registers the usage handlers
// on the pod informer, runs that informer when the extender owns it (Options.Pods nil), closes
// [Extender.Ready] once the pods and the node cache synced, and returns nil when its context
// ends, after every goroutine it started ended. The caller runs the schedcache.Cache and, on
// the leader only, its schedcache.Handshaker; the extender itself knows nothing about leader
// election and serves on every replica (kube-scheduler calls only its own extender). All
// methods are safe for concurrent use; filter decisions are serialised so that two filters never
// choose the same free capacity, and their API calls are made outside that lock.
//
// # RBAC
//
// [ClusterRoleRules]: pods get, list, watch and patch; pods/binding create; events create and
// patch; nodes get and patch (the node lock). The node cache needs schedcache.ClusterRoleRules
// besides. examples/extender/deploy holds a complete ClusterRole with kube-scheduler's own
// bindings.
//
// # Logging and Events
//
// Contextual logging (klog.FromContext); per-decision lines at V(3)–V(4), refusals at V(2),
// failed binds and filters as errors. Events on the pod through Options.EventRecorder, HAMi's:
// FilteringSucceed "find fit node(<node>), <k> nodes not fit, <m> nodes fit(<node>:<score>,…)",
// FilteringFailed "<n> nodes <Word>(<nodes>)" per reason word and "no available node, <N> nodes
// do not meet", BindingSucceed "Successfully binding node [<node>] to <ns>/<pod>" and
// BindingFailed; and the SDK's MIGReservationInvalid (Warning).
//
// Usage (see Example; the snippet is Example_usage). Without Options.Nodes the fit sees no node
// annotations, so hami.io/device-cordon cordons nothing:
//
//	var wg sync.WaitGroup
//	defer wg.Wait()
//	factory := informers.NewSharedInformerFactory(client, 0)
//	cache, err := schedcache.New(factory.Core().V1().Nodes(), schedcache.Options{})
//	if err != nil {
//		return err
//	}
//	ext, err := extender.New(client, cache, extender.Options{Pods: factory.Core().V1().Pods(), Nodes: factory.Core().V1().Nodes().Lister()})
//	if err != nil {
//		return err
//	}
//	factory.Start(ctx.Done())
//	ctx, cancel := context.WithCancelCause(ctx) // a part that fails stops the others
//	defer cancel(nil)
//	wg.Go(func() { cancel(cache.Run(ctx)) })
//	wg.Go(func() { cancel(ext.Run(ctx)) })
//	return http.ListenAndServe("127.0.0.1:8080", ext.Handler())
package extender
