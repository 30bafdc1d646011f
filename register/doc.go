// Package register is the device-plugin side of channel 2 of HAMi registration: it keeps the
// Node annotation hami.io/node-nvidia-register (or another vendor's JSON register key) equal to
// the devices the node has, in HAMi's wire format, with no write and no request when nothing
// changes. The devices are pushed: the caller hands them over with [Writer.SetDevices] after
// each scan (package github.com/hamireg/hamireg/nodeagent does that, and feeds the kubelet
// from the same scan).
//
// HAMi's node agent GETs its Node every 30 s, re-patches on most cycles of a multi-GPU node
// (random map order), caches the new value before the patch succeeds (one failed patch
// silences it until the device list changes), and never restores a hand-deleted annotation
// until it is restarted. A [Writer] does none of that:
//
//   - Devices are encoded in canonical order ([annotation.Canonical]), so an unchanged device
//     set always encodes to the same bytes.
//   - The encoded value is compared with the live value on the Node, read from a watch of that
//     one Node (field selector metadata.name=<node>), not from a GET per cycle. While the
//     watch's copy is older (by resourceVersion) than the Node the Writer's last patch
//     produced, the value last written successfully stands in for the live one, so a sync or
//     an echo racing with a write does not cause a second write. A JSON merge patch of the
//     Writer's own key (and nothing else) is sent only when they differ; other annotations
//     are never touched.
//   - The value remembered as written is updated only after the API server accepted the
//     patch; a failed write is retried after 1 s, doubling up to 5 s (HAMi's fixed retry
//     period), until it succeeds.
//   - Drift is healed without polling: when the watch shows the annotation deleted or set to
//     anything but what the Writer wrote, it rewrites the devices last set at once, without a
//     restart. When the Node does not exist yet, the Writer waits for the watch to show it.
//   - The topology score annotation hami.io/node-nvidia-score, HAMi's with
//     ENABLE_TOPOLOGY_SCORE=true, goes in the same merge patch when the caller hands it over
//     with [Writer.SetDevicesAndScores]; it is compared, written and healed with the register
//     annotation. A caller whose scoring failed still writes the devices with SetDevices (HAMi
//     writes neither annotation then, and does not retry until the device list changes).
//   - HAMi master's per-GPU cordon hami.io/device-cordon (a comma list of UUIDs its extender
//     gives no new pod) goes in the same merge patch when the caller hands its UUIDs over with
//     [Writer.SetCordon] (the node agent cordons the GPUs it gives to DRA). An operator's own
//     entries are kept: the Writer records the UUIDs it added in [CordonKey] and removes only
//     those; an operator's additions cause no write, a removed entry of the Writer's is
//     restored. A Writer never given SetCordon leaves both annotations alone.
//
// # Lifecycle
//
// [NodeNameFromEnv] resolves the node name (NODE_NAME, else the legacy NodeName with a
// warning); an empty name is an error at construction ([ErrNoNodeName]), not a retry loop.
// [New] validates and starts nothing. [Writer.Run] starts the watch and, once the Node has
// been listed, syncs at every [Writer.SetDevices] (an unchanged list sends nothing), on drift
// and when the Node appears, and returns nil when its context is done, after every goroutine
// it started (the watch, the Event broadcaster) has ended. [Writer.WaitForSync] waits, without
// polling, until the Node carries the devices last set. [Writer.Sync] does one compare-write
// for callers that drive the Writer themselves; outside Run it GETs the Node.
//
// # Concurrency
//
// One Run at a time per Writer ([ErrAlreadyRunning]); Sync may be called concurrently with
// Run, syncs are serialised. [Writer.SetDevices], [Writer.InSync], [Writer.WaitForSync] and
// [Writer.Stats] are safe at any time, from any number of goroutines.
//
// # Errors, logs, Events, metrics
//
// Node errors are [*WriteError] values: errors.Is gives the class ([ErrForbidden],
// [ErrNodeNotFound], [ErrAPI]) and apierrors.IsForbidden and friends still work. A Forbidden
// error names the ServiceAccount and the check to run, e.g. `kubectl auth can-i patch nodes
// --as=system:serviceaccount:kube-system:hami-device-plugin`. Run logs with the caller's
// contextual logger, using the lines HAMi's runbooks grep for: "Updating node annotations
// with N device(s)" (info, before each write) and "Device info unchanged, skipping annotation
// update" (V(3)); failures as "Failed to register annotation" with the retry delay. A failed
// write also records a Warning Event [EventReasonFailed] on the Node (kubectl describe node).
// With Options.Registerer set, the counters hamireg_register_writes_total,
// hamireg_register_heals_total, hamireg_register_noops_total and
// hamireg_register_failures_total{reason} are exported, labelled with the vendor only.
//
// # RBAC
//
// The minimal ClusterRole ([ClusterRoleRules] returns the same rules); bind it to the device
// plugin's ServiceAccount with a ClusterRoleBinding. Add "get" on nodes only if you call Sync
// outside Run.
//
//	apiVersion: rbac.authorization.k8s.io/v1
//	kind: ClusterRole
//	metadata:
//	  name: hamireg-register
//	rules:
//	- apiGroups: [""]
//	  resources: ["nodes"]
//	  verbs: ["list", "watch", "patch"]
//	- apiGroups: [""]
//	  resources: ["events"]
//	  verbs: ["create", "patch"]
//
// # Usage
//
// The snippet is [ExampleNew]; devices come from a scan (package nvmlscan, or a vendor's):
//
//	name, err := register.NodeNameFromEnv(ctx, nil)
//	if err != nil {
//		return err // NODE_NAME unset: fix the DaemonSet, do not retry
//	}
//	w, err := register.New(clientset, name, register.Options{Registerer: prometheus.DefaultRegisterer})
//	if err != nil {
//		return err
//	}
//	w.SetDevices(devices) // and again after every scan that may have changed them
//	return w.Run(ctx)     // until ctx is done
package register
