// Package diagnose tells why a GPU node does not register with HAMi's scheduler: which of the
// three channels is broken, which of the five cases of the troubleshooting guide applies, what
// shows it, and the commands that fix it.
//
// A node registers when
//
//  1. the device plugin DaemonSet has a Pod on the node (case 1 when not: the node lacks the
//     DaemonSet's nodeSelector label, gpu=on in the chart, or has a taint it does not
//     tolerate),
//  2. that Pod runs (case 2 when not: a crash loop because NVML cannot be loaded as the
//     container runtime is not nvidia, an init container waiting for toolkit-ready, the
//     NODE_NAME variable missing),
//  3. the kubelet publishes the device count, status.allocatable["nvidia.com/gpu"] = GPUs ×
//     split (case 3 when not: the plugin's socket folder is not the kubelet's),
//  4. the register annotation hami.io/node-nvidia-register lists healthy devices (case 4 when
//     not: missing, malformed, empty, no device healthy, or the plugin's ServiceAccount may
//     not patch nodes),
//  5. and HAMi's scheduler takes the node (case 5 when not: its --node-label-selector excludes
//     the node, no scheduler holds the Lease, the handshake says otherwise).
//
// [Node] reads the objects behind each step, runs annotation.Check and handshake.Decide on
// what it finds, asks a SubjectAccessReview for the plugin's ServiceAccount, and returns a
// [Report]: the channels as observed, the case (the first one, in the guide's order, that an
// error finding causes) and every [Finding] with its evidence and fix. [Nodes] does the same
// for every node that looks like a GPU node, reading the shared objects once.
//
// One [Case] type and one [Finding] type serve nodes and pods. A case is its stable code, a
// string: "N1-PluginNotScheduled" to "N5-SchedulerExcludes" for the guide's cases 1 to 5,
// "P1-NotRoutedToHAMi" to "P8-RunningWithoutLimits", "P0-NodeNotRegistered" and, for
// claim-based pods, "P9-ClaimPending" to "P12-DeviceUnhealthy" for pods,
// [Healthy] when none applies; JSON and YAML carry the code as is.
//
// The guide's warnings against wrong conclusions are findings too: an old Requesting_
// timestamp is normal when allocatable is above zero (nobody refreshes it since HAMi 2.8), a
// device without a "health" key is unhealthy, a follower's quiet log proves nothing (only the
// Lease holder registers nodes), and hami.io/node-handshake-nvidia is not an NVIDIA key.
//
// What the API server cannot show (kubelet flags, the containerd configuration, files under
// /var/lib/kubelet) is in Finding.OnNode as commands to run on the node.
//
// # Pods
//
// [Pod] tells why a GPU pod is Pending or failed: the stage it reached of HAMi's allocation
// protocol (S0 admitted to HAMi's scheduler, S1 filtered, S2 bound, S3 allocated, S4 running;
// [Stage]) and the case that stopped it ([Case]): P1 not routed to HAMi (another
// schedulerName: the webhook missing or excluding the pod; the default scheduler's placement
// then fails with "no binding pod found on node"), P2 the extender unreachable, P3 no node
// fits (the fit recomputed with package allocation on the nodes and usage read, naming what
// is short and who holds it, or the quota or the type/UUID selector), P4 the node locked
// (hami.io/mutex.lock held by a gone or finished pod, or by a plugin that never releases it),
// P5 the Allocate that never came, P6 the Allocate that failed (UnexpectedAdmissionError), P7
// a stale assignment after a node restart, P8 a pod that runs without HAMi's limits. A pod
// stopped before S1 without a FilteringFailed Event hands over to the node diagnosis of the
// candidate nodes ([P0NodeNotRegistered]), in the same report. For a Running GPU pod, [Pod]
// reads the node monitor of its node (HAMi's vGPUmonitor or the SDK's device plugin, GET
// /metrics through the API server's pod proxy; [ParseMonitorScrape], [MonitorScrape]) and
// reports each container's use of each GPU against its limit ([UsageReport]) with findings:
// usage above the limit, HAMi-core's count of a process drifting from NVML's by more than
// [DriftThreshold], a process on the pod's GPUs without a HAMi-core slot, a stale slot, a
// container blocked by the priority loop or whose region's priority is not the spec's. [Pods] does the same for
// every GPU pod that is not running; [AnalyzePod] diagnoses recorded objects ([PodEvidence])
// without a cluster. Diagnosing writes nothing; the one repair, of a stale node lock, is the
// separate [RemoveStaleLock], after [LockOf] has shown the lock. [WriteBundle] collects the
// objects, the logs and the diagnosis into one archive for an issue report.
//
// # Claim-based pods and the cordon
//
// A pod whose GPU comes from a DRA ResourceClaim of the SDK's or HAMi-DRA's driver (a claim or
// template asking their DeviceClass, an allocation naming them, or nvidia.com/gpu served
// through DRA: status.extendedResourceClaimStatus) follows kube-scheduler's DRA path; [Pod]
// reports its claims ([ClaimState], with each allocated device's health from the kubelet's
// allocatedResourcesStatus and its taints from the ResourceSlice and DeviceTaintRules), its
// stage on that path ([PodReport].StageText) and the case: [P9ClaimPending],
// [P10ClaimUnallocatable] (with kube-scheduler's message), [P11ClaimNotPrepared] (the
// kubelet's FailedPrepareDynamicResources) or [P12DeviceUnhealthy].
//
// [Cordon] and [Uncordon] are the other repair: a GPU (UUID or index) goes into the node's
// hami.io/device-cordon and, where a DRA driver publishes it, a DeviceTaintRule taints its
// device <driver>/cordoned:NoSchedule ([CordonTaintKey], [CordonRuleName]); both are
// idempotent, take a server-side dry run, and need [CordonRules].
//
// Problems in the cluster are findings, never errors; Node returns an error only when the node
// cannot be read (ErrNodeNotFound, ErrAPI). Objects the caller may not read become
// "NotChecked" findings. The defaults in [Options] are those of HAMi's Helm chart.
//
// [WriteBundle] collects what the guide asks for before opening an issue (the Node or Pod
// as YAML, their Events, HAMi's objects, the device plugin's and the leader scheduler's
// last log lines, the diagnosis) into one .tar.gz, redacted with [Redact]; what it may not
// read is a line in the bundle's index.
package diagnose
