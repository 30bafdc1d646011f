// Package schedcache is the scheduler side of HAMi's node registration: a node cache that reads
// every GPU node's register annotation (channel 2) and device count (channel 1), runs the
// liveness handshake (channel 3) and tells a scheduler or extender which nodes have which
// devices, and why the others do not.
//
// # What it does differently from HAMi's extender
//
// HAMi re-decodes every node's annotation for 13 vendors every 15 s under one global lock that
// it also holds across API calls; it has no node update handler; one "[null]" annotation crashes
// it; a corrupt annotation leaves stale devices schedulable; it detects leadership by a host name
// prefix. This cache:
//
//   - is event driven: Node add, update and delete events are filtered to the fields that matter
//     (each vendor's register, score and handshake annotations, the allocatable count of its
//     resource, and the labels when a selector is set) and queued by node name; a worker applies
//     the lister's current Node. A changed annotation is visible within milliseconds, even when
//     allocatable did not change (HAMi v2.9.0 never reloads it).
//   - decodes an annotation only when its raw value changed, and parses a handshake only when it
//     changed. The 15 s tick re-evaluates handshake windows with [handshake.Decide] on what is
//     already decoded; in the steady state it allocates nothing.
//   - gives every node and vendor a [State] with a reason and a classified error: registered,
//     absent, malformed, no devices, invalid element, unhealthy, excluded by the selector. A
//     malformed or invalid annotation removes that node's devices and raises a Warning Event on
//     the Node; nothing panics.
//   - makes handshake writes (stamp "Requesting_<now>" when absent or foreign; cleanup when the
//     handshake expired with nothing allocatable: the key is deleted, or "Deleted_<now>" with
//     HAMi v2.9.0 semantics) through a rate-limited work queue on Options.Clock (a first try
//     waits for nothing but the overall rate), outside any lock readers take, and only from a
//     [Handshaker], the leader-only part, which runs only while this replica leads.
//   - never adds a node whose allocatable count is 0 because of a fresh stamp (HAMi flaps it).
//   - decodes the topology score annotation (hami.io/node-nvidia-score) with the devices and
//     hands it to readers per device ([Registration].PairScores); one that does not decode
//     costs the node its scores, not its devices: it stays registered, with the error in
//     [Registration].ScoreErr, logged and evented ([ReasonScoreMalformed]) once per value. HAMi
//     drops the whole node ("node unregistered").
//
// # Reading
//
// [Cache.Snapshot] returns a consistent, immutable [Snapshot] of every node the cache knows:
// [Snapshot.All] yields the registered nodes, [Snapshot.Node] returns any node with its state
// and reason per vendor, so that a scheduler explains a rejection from the same point in time
// it decided on. While nothing changes every call returns the same snapshot without copying.
// [Cache.Node] returns one node's current [NodeInfo]. Vendors are looked up by an
// [annotation.Vendor], not by a string. Nothing waits for decoding or API calls: the goroutine
// that applies changes holds the readers' lock only to store a pointer. All are safe for
// concurrent use; returned values are shared and read-only.
//
// Readiness: [Cache.Synced] is a channel closed once the cache first synced;
// [Cache.WaitForSync] waits on it with a context; [Cache.HasSynced] fits client-go's
// cache.InformerSynced and turns false when Run returns.
//
// # Leadership
//
// The cache knows nothing about leader election: it is warm on every replica and decides the
// handshake writes everywhere. Only a [Handshaker] writes, and only while its Run runs; run it
// as the leader-only work of one of:
//
//   - client-go's leaderelection: OnStartedLeading: func(ctx context.Context) { _ = h.Run(ctx) };
//   - [Elector]: the same on a Lease of its own, joining the work at the end of each term;
//   - [LeaseFollower]: HAMi's deployment shape, following the Lease of kube-scheduler in the
//     same pod with an exact identity match ([HolderMatches]: holder == identity, or identity
//     followed by "_"), running the work while this replica holds it;
//   - nothing (HAMi's --leader-elect=false): go h.Run(ctx) beside the cache.
//
// While no Handshaker runs, a decided write is logged as "Scheduler is not leader yet,
// skipping ..." at V(5) and kept; a new Handshaker re-evaluates every node at once and writes
// what is decided.
//
// # Lifecycle
//
// [New] validates the options and installs [TrimNode] on the informer (unless
// Options.KeepNodeFields), so call it before the informer factory starts; it starts nothing.
// [Cache.Run] blocks until its context is done, returns nil then, and joins every goroutine it
// started (event worker, tick). [Handshaker.Run] does the same for its write workers and may
// run again for the next term. The caller starts and stops the informer factory.
//
// # Logging, Events, metrics
//
// Logging is contextual (klog.FromContext). HAMi's messages keep their exact text and level so
// that runbooks work (spec §5.6): "Using label selector for list nodes" (info, once per Run),
// "Listed nodes" and "Processing node" (V(5), each cycle), "Failed to get node devices" (V(5)),
// "failed to decode node devices" (error), "no nvidia gpu device found" (info), "Device is
// unhealthy, cleaning up node" (error, as HAMi master), "Scheduler is not leader yet, skipping
// ..." (V(5)). Other state changes are logged at V(2) and V(3). Events go through
// Options.EventRecorder with the Reason* constants. Metrics are opt-in through Options.Registerer: hamireg_schedcache_nodes{vendor,
// state}, hamireg_schedcache_decode_failures_total{vendor,state},
// hamireg_schedcache_handshake_writes_total{vendor,action,result} and
// hamireg_schedcache_queue_depth{queue}; no per-node labels.
//
// # RBAC
//
// [ClusterRoleRules]: nodes list, watch and patch (the handshake, by the Handshaker), and
// events create and patch when an EventRecorder is set. [LeaseRoleRules], in the Lease's
// namespace: an Elector needs leases get, create and update, a LeaseFollower leases get, list
// and watch. test/e2e/schedcache runs the cache under a ServiceAccount with exactly the node
// and event rules.
//
// # Memory
//
// The informer, not the cache, holds the Node objects; [TrimNode] drops managedFields and
// status.images from them, which on real nodes are most of their size (BenchmarkHeapPerNode:
// about 11.5 KB instead of 29 KB per realistic 8-GPU node). The cache keeps per node and vendor
// the decoded devices, with their IDs copied and models and modes shared between nodes, so that
// no replaced Node's annotation stays pinned (about 2.2 KB for 8 GPUs), and references to the
// raw annotation strings of the Node the informer currently holds.
//
// Usage (see Example; the snippet is Example_usage):
//
//	var wg sync.WaitGroup
//	defer wg.Wait()
//	factory := informers.NewSharedInformerFactory(client, 0)
//	c, err := schedcache.New(factory.Core().V1().Nodes(), schedcache.Options{EventRecorder: recorder})
//	if err != nil {
//		return err
//	}
//	h, err := schedcache.NewHandshaker(client, c, schedcache.HandshakerOptions{})
//	if err != nil {
//		return err
//	}
//	elector, err := schedcache.NewElector(client, h, schedcache.ElectorOptions{
//		Namespace: "kube-system", Name: "hamireg-schedcache", Identity: podName})
//	if err != nil {
//		return err
//	}
//	factory.Start(ctx.Done())
//	defer factory.Shutdown()
//	ctx, cancel := context.WithCancelCause(ctx) // a part that fails stops the other
//	defer cancel(nil)
//	wg.Go(func() { cancel(c.Run(ctx)) })
//	wg.Go(func() { cancel(elector.Run(ctx)) }) // h.Run while this replica leads
//	if err := c.WaitForSync(ctx); err != nil {
//		return err
//	}
//	if n, ok := c.Snapshot().Node("gpu-1"); ok {
//		fmt.Println(n.Devices(annotation.NVIDIA())) // nil unless registered
//	}
package schedcache
