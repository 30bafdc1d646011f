// Command quickstart runs a HAMi-compatible GPU cluster on 127.0.0.1, without a cluster or a
// GPU, and walks through the whole loop of the SDK:
//
//	make quickstart            # from the repository root; or, in examples/quickstart:
//	go run . [--keep] [--mig=false] [--k8s-bin DIR] [--repo DIR] [--programs DIR] [--node gpu-node-1] [-v 2]
//
// The peers are the real ones the e2e tests use: etcd and kube-apiserver (TLS, RBAC),
// kube-scheduler configured from examples/extender's manifests, and the kubelet's own device
// manager as the node's kubelet. On them it applies the deploy manifests of examples/extender
// and examples/deviceplugin, runs examples/extender with the Deployment's arguments (its
// ports moved to free loopback ones) and examples/deviceplugin --simulate dgxa100 (8 simulated
// A100s on NVSwitches) with the DaemonSet's arguments and env (its /metrics on a free
// loopback port, its --hook-path, HAMi-core's host folder, in the work folder), and then:
//
//  1. shows the node's three channels going healthy, each with how long it took: the
//     register annotation (with the topology scores the DaemonSet has it publish), the device
//     count in allocatable and the handshake;
//  2. creates a pod asking for 2 GPUs with 10 GiB and 30 % cores each, with the annotation
//     hami.io/gpu-scheduler-policy: topology-aware, and shows kube-scheduler's choice (the
//     best-scored pair), the pod annotations, the environment the device plugin returned to
//     the kubelet's Allocate, and the node lock released; then asks the extender's /filter
//     the way a Cluster Autoscaler simulating a scale-up does (whole Node objects in
//     ExtenderArgs.Nodes: a template of the node and one without the register annotation)
//     for a pod no node of the cluster can hold, and shows the template fit, the other
//     "node unregistered", and that nothing was written (the pod's resourceVersion, no Events);
//  3. creates a namespace with a ResourceQuota of 20000 MiB of GPU memory
//     (limits.nvidia.com/gpumem), a pod under it, which is placed, and one over it, which
//     stays Pending with the extender's FilteringFailed and ResourceQuotaNotFit Events;
//  4. scrapes examples/extender's /metrics and shows HAMi's gauges for the demo pod's GPUs
//     and the namespace's quota; then writes the demo container's HAMi-core region (3 GiB
//     and 1 GiB used, SM 25 % and 10 %) where the device plugin's Allocate made its folder,
//     as HAMi-core does at a container's first CUDA call, and shows the device plugin's node
//     monitor (HAMi's vGPUmonitor) serving that container's usage on the plugin's /metrics;
//  5. runs cmd/kubectl-hami_doctor as kubectl hami-doctor on the node (healthy) and on the pod over
//     the quota (case P3), breaks one channel on purpose (the
//     register annotation deleted by hand) and runs it again (the case and the fix), then
//     shows the node agent healing it;
//  6. makes the same node serve DRA as well: the kubelet's own DRA manager
//     (pkg/kubelet/cm/dra) starts beside the device manager, the device plugin restarts
//     with --dra owning one GPU that no pod holds (the others stay with the device plugin),
//     and shows the node's ResourceSlice (the DRA GPU with its consumable memory, cores and
//     shares, the other seven tainted owned-by-hami), the DRA GPU cordoned for HAMi's
//     extender in hami.io/device-cordon and left out of the device count; then a pod with a
//     ResourceClaim of 10Gi and 30 cores is placed by kube-scheduler's DynamicResources
//     plugin, prepared by the plugin through the DRA manager, and its CDI edits
//     (CUDA_DEVICE_MEMORY_LIMIT_0=10240m, CUDA_DEVICE_SM_LIMIT_0=30, HAMi-core's mounts) are
//     shown beside the env step 2's device-plugin pod got; then a second node, <node>-dra,
//     whose device plugin runs with --dra and no --dra-gpus (every GPU DRA's, so the
//     kubelet counts no nvidia.com/gpu there), the DeviceClass of
//     examples/deviceplugin/deploy/mapping (extendedResourceName nvidia.com/gpu), and two
//     pods of one spec (nvidia.com/gpu: 1, a required anti-affinity on the host name): one
//     runs on the device-plugin node through HAMi's annotations and Allocate, the other on
//     the DRA node through the claim kube-scheduler writes, prepared with the whole GPU;
//     the pods go and the class loses the mapping again (with it, pods asking
//     nvidia.com/gpumem would need --report-node-capacity);
//  7. builds examples/scheduler (kube-scheduler with the SDK's HAMiGPU plugin) and runs it as a
//     second scheduler: a low-priority pod takes one GPU's whole memory, a high-priority pod
//     that needs 60 % of it preempts it (kube-scheduler's preemption asking the plugin's
//     Filter), and a third pod that cannot preempt waits until the high-priority one is
//     deleted, then is bound at once (the plugin's queueing hint);
//  8. starts a second node whose device plugin is examples/deviceplugin
//     --simulate dgxa100 --mig (the 8 A100s in MIG mode), shows its register annotation (a
//     GPU's migProfiles as HAMi master publishes them) and places a pod of one GPU with
//     9000 MiB on it: the profile and placement the extender reserved (2g.10gb), the MIG
//     device the plugin created and patched into hami.io/vgpu-mig-allocations, and the MIG
//     UUID the kubelet's Allocate got (--mig=false skips this step);
//  9. with --keep (step 8 with --mig=false), leaves everything running and prints a kubeconfig for kubectl and the
//     doctor until Ctrl-C; without it, stops everything and removes what it created.
//
// The first run builds kube-apiserver, kube-scheduler and etcd into the user's cache
// (hack/k8sbins/build.sh, several minutes) and says so with progress; later runs reuse them.
// --k8s-bin (or $HAMIREG_K8S_BIN) names a folder with them instead.
//
// The kubelet's device manager hard-codes /var/lib/kubelet/device-plugins, so it runs in a
// private mount namespace (as root, or in an unprivileged user namespace); where the machine
// allows neither, quickstart says so and what to run instead. Every process it starts is
// stopped on every exit path: at the end, on Ctrl-C or SIGTERM, on an error, and (the kernel's
// parent-death signal) when quickstart itself is killed.
//
// Exit status: 0 when every step worked, 1 when one failed (the message says which and shows
// the log of the process concerned), 2 on bad flags, 130 when interrupted.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
)

func main() {
	if code, child := kubeletpeer.RunIfChild(context.Background()); child {
		os.Exit(code) // the kubelet device manager's child ends here
	}
	if err := envtest.ExecIfHostnameChild(); err != nil { // a process run with a host name of its own execs here
		fmt.Fprintln(os.Stderr, err)
		os.Exit(127)
	}
	// A closed stdout (quickstart | head) must not kill it before it has stopped what it started.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The kubelet's packages that run in this process log through klog's global logger: to
	// the DRA step's log file once it has one, never into the steps' output.
	klogOut := &lateWriter{}
	klog.SetLogger(textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(2), textlogger.Output(klogOut))))
	code := runWith(ctx, os.Args[1:], os.Stdout, os.Stderr, klogOut)
	stop()
	os.Exit(code)
}
