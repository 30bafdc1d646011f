// Package nodelock implements HAMi's node lock, the Node annotation hami.io/mutex.lock that
// lets one GPU pod at a time be between bind and Allocate on a node, wire-compatible with
// HAMi's scheduler and device plugin in both directions.
//
// # Wire protocol
//
// The value is "<RFC 3339 time>,<namespace>,<pod>", e.g.
// "2026-05-19T09:14:52Z,default,train-0"; a legacy value is the time alone and names no
// owner. [Parse] reads both exactly as HAMi does (three comma-separated parts, or one) and
// [Lock.String] writes them; this package writes the time in UTC, HAMi in its local zone,
// and each reads the other's. A lock is expired when it is older than the timeout (HAMi's
// --node-lock-timeout, 5 min: [DefaultTimeout]); an expired lock, or one whose owner no
// longer holds it (see Takeover), may be taken over by anyone. Every write is a JSON merge patch of this one key
// carrying the resourceVersion that was read:
//
//	{"metadata":{"annotations":{"hami.io/mutex.lock":"<value>"},"resourceVersion":"<rv>"}}
//
// and a release patches the key to null the same way. Other annotations of the Node are
// never touched.
//
// # Who takes and who releases
//
// The scheduler (extender) takes the lock in its bind handler, before it creates the
// Binding ([Locker.Acquire]); a second GPU pod bound to the same node fails its bind with
// "node <node> has been locked within 5m0s" and kube-scheduler retries it. On success the
// lock stays: the device plugin finds the pod it allocates for through the lock
// ([FromAnnotations]) and removes it after the pod's last container was allocated
// ([Locker.Release]), or on an Allocate error. When the bind fails, the scheduler removes
// it. Release only removes the caller's own lock; [Locker.ForceRelease] removes any;
// [Locker.ReleaseIf] removes a lock only while its value is still the one a person was shown
// (a repair of a stale lock; otherwise [ErrChanged]). The value names a pod by namespace and
// name only, so a pod deleted and created again under the same name counts as the lock's
// owner only while it was created before the lock (see Takeover).
//
// # Takeover
//
// [Locker.Acquire] takes over, at once and whatever the lock's age, a lock whose owner no
// longer holds it:
//
//   - the owner pod does not exist (GET answers NotFound), as HAMi does;
//   - the owner finished: phase Succeeded or Failed (an admission failure at the kubelet, an
//     eviction, a completed pod). Its device plugin will never allocate it, and HAMi blocks
//     the node until the 5-minute expiry (HAMi PR #3047, not in v2.10.0);
//   - the pod of that name was created after the lock time: another pod under the same name
//     (a StatefulSet's pod deleted and created again), which kube-scheduler has not bound.
//     The creation time is the API server's and the lock time the writer's clock, both in
//     whole seconds; a pod created in the lock's second, or up to 5 s after it (clock skew
//     between the writer and the API server), still counts as the owner.
//
// The takeover is one merge patch conditional on the resourceVersion read, like every write,
// and the value written is an ordinary lock: the wire format does not change. The reason is
// logged ("Took over node lock", reason "owner pod not found", "owner pod finished", "owner
// pod created after the lock: another pod under the same name").
//
// # Waiting for a lock
//
// A scheduler that binds many pods waits for a node's lock with a [Queue]: the binds of one
// node take turns, and the one whose turn it is waits for a change of the node (its informer
// handler, [Queue.NodeHandler], and a pod informer's deletes, [Queue.PodGone]) instead of
// polling, up to a bound of its own. The extender's bind and the scheduler plugin's PreBind
// share it.
//
// # Concurrency
//
// A [Locker] holds no state and no in-process mutex; any number of calls, in any number of
// processes, may run at once. Mutual exclusion comes from the API server alone: every write
// is conditional on the resourceVersion that its decision was based on. When two contenders
// race for a free or stale lock, both patch the same resourceVersion and exactly one wins;
// the other gets 409 Conflict, reads the Node again, sees the winner's lock and returns
// [ErrLocked] naming it. A conflict caused by an unrelated write (another annotation, the
// node status) is answered the same way and then succeeds; a call reads the Node again at
// most 10 times, so a Node that something rewrites about as often as a PATCH takes can end
// a call with the Conflict error (nothing is written then). Transient errors (timeouts, 5xx,
// 429, network) are retried with HAMi's backoff (5 tries, 100 ms doubling, jitter 0.5;
// Options.Backoff); a refusal such as Forbidden is returned at once.
//
// # Reads from an informer
//
// With Options.Nodes (and Options.Pods), a call reads the Node (and a lock owner's pod) from
// informer listers instead of the API server: a free node costs one patch, a node held by a
// live pod no request. This is safe because a write carries the copy's resourceVersion (a
// stale copy gets 409 Conflict, and the call then reads from the API server), and the only
// answer given from the copy without a write is [ErrLocked] for a lock of a pod the pod
// informer knows, which a caller retries. Answers a stale copy could get wrong (the pod's own
// lock held, no lock or another pod's lock at a release, an unreadable value, whose age is
// in managedFields) are read again with a GET.
//
// # Errors and logs
//
// Acquire's contention error is a [*LockedError] (errors.Is [ErrLocked]) with the node,
// the holder, the lock time and age; its message starts with HAMi's text, which
// kube-scheduler shows in the pod's events:
//
//	node gpu-1 has been locked within 5m0s by pod default/train-0 since 2026-05-19T09:14:52Z (1m30s ago)
//
// Release of someone else's lock gives a [*NotOwnerError] ([ErrNotOwner]); values that do
// not parse give a [*MalformedError] ([ErrMalformed]); API failures are [*APIError] values
// that unwrap to the client's error (apierrors.IsForbidden). Takeovers are logged at info
// level ("Took over node lock", with the reason and the previous holder) through the
// caller's contextual logger, plain acquisitions and releases at V(3).
//
// # RBAC
//
// The minimal ClusterRole ([ClusterRoleRules] returns the same rules), for the scheduler
// and the device plugin alike:
//
//	apiVersion: rbac.authorization.k8s.io/v1
//	kind: ClusterRole
//	metadata:
//	  name: hamireg-nodelock
//	rules:
//	- apiGroups: [""]
//	  resources: ["nodes"]
//	  verbs: ["get", "patch"]
//	- apiGroups: [""]
//	  resources: ["pods"]
//	  verbs: ["get"]
//
// # Usage
//
//	locker, err := nodelock.New(clientset.CoreV1(), nodelock.Options{})
//	if err != nil {
//		return err
//	}
//	pod := types.NamespacedName{Namespace: "default", Name: "train-0"}
//	if err := locker.Acquire(ctx, "gpu-1", pod); err != nil {
//		return err // ErrLocked: kube-scheduler retries the bind later
//	}
//	if err := bind(ctx); err != nil {
//		_ = locker.Release(ctx, "gpu-1", pod) // the bind failed: give the node back
//		return err
//	}
//	// The lock stays until the device plugin has allocated the pod's devices and
//	// calls locker.Release(ctx, node, pod).
//
// # Deliberate differences from HAMi
//
// Only where HAMi gets stuck for good or loses a lock; the wire format is the same.
//
//   - A finished owner (Succeeded, Failed) or another pod created under the owner's name after
//     the lock gives the lock up at once (see Takeover); HAMi v2.10.0 waits for the timeout.
//
//   - An unreadable lock value (say "not-a-time,default") does not block a node forever.
//     HAMi's LockNode returns the parse error on every bind and its device plugin fails
//     every Allocate, until someone deletes the annotation by hand. Acquire takes such a
//     value over once it is older than the timeout, measured from the latest write of the
//     key that the API server recorded in metadata.managedFields (the value was written at
//     or before it), and at once when no write is recorded; until then it returns
//     [ErrLocked] wrapping the [*MalformedError].
//
//   - A takeover is one conditional write that replaces the old value, so a lock that
//     another scheduler took in the meantime is never lost. HAMi removes the old lock and
//     then sets its own; its forced removal reads the Node again on every try and removes
//     whatever lock it finds then, so a lock another scheduler took since the decision is
//     deleted and both pods go through. HAMi v2.9.0 likewise overwrites a lock written
//     during its set retries (master re-checks); here a conflict always means deciding again.
package nodelock
