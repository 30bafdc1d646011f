// Command deviceplugin is a HAMi-compatible NVIDIA device plugin: package nodeagent on
// package nvmlscan. It registers the node's GPUs with the kubelet (nvidia.com/gpu, each GPU
// split --device-split-count ways) and in the Node annotation hami.io/node-nvidia-register,
// keeps both in step with the GPUs' health, and serves the kubelet's Allocate with HAMi's pod
// protocol, so that the node works under HAMi's scheduler. Deploy it with the manifests in
// deploy/ (a DaemonSet as HAMi's chart's, with the minimal RBAC).
//
//	deviceplugin [--device-split-count 10] [--device-memory-scaling 1] [--device-cores-scaling 1]
//	             [--preconfigured-device-memory 0] [--hook-path /usr/local] [--prepare-state-dir=true]
//	             [--kubelet-root-dir /var/lib/kubelet] [--kubeconfig FILE] [--kube-qps 50] [--kube-burst 100] [-v 2]
//	             [--topology-score] [--topology-version master|v2.9.0]
//	             [--device-list-strategy envvar|volume-mounts[,cdi-annotations][,cdi-cri]] [--cdi-kind K] [--cdi-annotation-prefix P]
//	             [--enable-numa-topology] [--report-node-capacity]
//	             [--mig [--mig-allowlist FILE] [--mig-model-match word|substring] [--mig-profiles base|all]]
//	             [--dra [--dra-profile sdk|hami] [--dra-gpus UUID|INDEX,...] [--cdi-dir /var/run/cdi] [--dra-slice-sync-delay 30s] [--dra-health=false]]
//	             [--metrics-bind-address :9394]
//	             [--monitor=true] [--monitor-root <hook-path>/vgpu] [--legacy-metrics] [--monitor-version master|v2.9.0]
//	             [--monitor-resync-interval 5m] [--monitor-period 5s] [--monitor-feedback=true]
//	             [--monitor-priority-source region|pod-spec] [--monitor-process-metrics] [--monitor-feedback-metrics]
//	             [--monitor-activity-from-sm-util]
//
// --monitor (default: on with --prepare-state-dir) runs the node monitor in this process,
// what HAMi's vGPUmonitor container does (package monitor, docs/monitor.md): it reads the
// HAMi-core region of every container folder under --monitor-root/containers (and of every
// DRA claim this plugin prepared, under claims/), serves HAMi's per-container families
// (hami_vgpu_memory_used_bytes, hami_vgpu_memory_limit_bytes,
// hami_container_device_utilization_ratio, ...) and the host GPUs' (hami_host_gpu_*) on
// /metrics, with HAMi's legacy names too under --legacy-metrics, and runs HAMi's priority
// feedback every --monitor-period. /readyz also waits for its first scan. The opt-in
// --monitor-process-metrics and --monitor-feedback-metrics add the SDK's hamireg_monitor_*
// families (per-process accounting drift, processes without a slot, priority state).
//
// --metrics-bind-address (default :9394, HAMi's monitor port; "" or "0" turns it off) serves,
// on one HTTP server with HAMi master's monitor timeouts (15 s to read a request's headers,
// 60 s the request): GET /metrics, the SDK's hamireg_nodeagent_* and hamireg_register_*
// families; /healthz, 200 while the agent runs, 503 with the reason once a part failed or the
// GPU scans have failed or hung for more than 3 periods (nodeagent's Agent.Healthy); /readyz,
// 200 once the register annotation and the kubelet have the first scan, 503 naming the step
// missing before (Agent.Ready). The server starts before the agent and stops after it.
// deploy/daemonset.yaml probes both and deploy/monitor-service.yaml is HAMi's monitor Service
// (NodePort 31992 to 9394). An address that does not parse exits 2, one that cannot be bound 1.
//
// --topology-score (default: env ENABLE_TOPOLOGY_SCORE=true, as HAMi's plugin reads it) also
// publishes the GPUs' topology scores in hami.io/node-nvidia-score, for HAMi's topology-aware
// GPU policy; --topology-version v2.9.0 scores NVSwitch systems from PCIe alone, as HAMi v2.9.0
// does. A failed scoring does not hold back the register annotation.
//
// --device-list-strategy (default: env DEVICE_LIST_STRATEGY, else envvar) is how a container
// is told its GPUs, as HAMi's and NVIDIA's plugins take it: a comma list of envvar or
// volume-mounts and the CDI strategies cdi-annotations and cdi-cri, which name each GPU as
// the CDI device <--cdi-kind>=<UUID> (default kind k8s.device-plugin.nvidia.com/gpu, whose
// CDI spec must exist on the host) for CDI-default runtimes; --cdi-annotation-prefix (env
// CDI_ANNOTATION_PREFIX, default cdi.k8s.io/) prefixes the annotation key. An unknown value,
// envvar with volume-mounts, and a CDI strategy with --mig or --dra exit 2 (docs/cdi.md).
//
// --enable-numa-topology sends each GPU's NUMA node with its virtual devices to the kubelet,
// as HAMi v2.10.0 does with enableNumaTopology (node configuration key "enablenumatopology",
// chart value devicePlugin.enableNumaTopology); off by default, as there. With it, the
// kubelet's Topology Manager (policies single-numa-node, restricted) aligns a container's GPU
// with its CPUs and may refuse a pod at admission; a GPU whose NUMA node sysfs does not tell
// carries none.
//
// --report-node-capacity (default: env REPORT_NODE_CAPACITY=true, HAMi's PR #2874) also writes
// the healthy GPUs' memory (nvidia.com/gpumem, MiB after --device-memory-scaling, as in the
// register annotation) and cores (nvidia.com/gpucores) into the Node's status capacity and
// allocatable, patched only when they change, for kubectl describe node, kube-state-metrics
// and autoscaler node templates. It needs deploy/node-capacity.yaml (patch on nodes/status),
// and kube-scheduler must keep ignoring the two resources (the extender's managedResources
// with ignoredByScheduler, as examples/extender/deploy has them).
//
// # MIG
//
// --mig runs the node in operating mode mig, as HAMi master's dynamic MIG: every GPU in MIG
// mode publishes the MIG profiles NVML reports for it ("migProfiles", count = the largest
// instance count, devmem and devcore unscaled), a GPU whose model the allowlist does not name
// is left out (logged, with an Event), and Allocate realises the scheduler's reservation
// (hami.io/vgpu-mig-allocations): it creates the GPU instance at the reserved placement and
// its compute instance, answers the kubelet with the MIG device's UUID, records the runtime
// identity in the reservation, and destroys the instance once no live pod owns it. No
// HAMi-core limits are injected for a MIG GPU. The flags beside it:
//
//   - --mig-allowlist FILE: the migProfileAllowlist, in the shape of HAMi's device ConfigMap
//     (the list itself, {migProfileAllowlist: [...]}, or {nvidia: {migProfileAllowlist:
//     [...]}}; YAML or JSON). Default: HAMi's chart list, with the H200 entries ahead of H20.
//   - --mig-model-match word (default) matches an allowlist model in the NVML name at word
//     boundaries, so "H20" does not take an H200; substring is HAMi's strings.Contains.
//   - --mig-profiles base (default, HAMi's, wire compatible) resolves a profile name by its
//     slice count; all asks NVML for every profile id, so that REV profiles (1g.10gb on an
//     A100-40GB, 1g.5gb+me) carry their own memory and placements.
//
// deploy/daemonset.yaml shows the arguments of a MIG node.
//
// # DRA
//
// --dra makes the same process a DRA driver as well (a nodedra.World as nodeagent's
// Options.DRA; a node program without DRA does not link it): it registers with the
// kubelet's DRA manager through <kubelet-root-dir>/plugins_registry, publishes the
// GPUs as the node's ResourceSlice (one device per GPU that claims share, with consumable
// memory and cores) and prepares each claim as a transient CDI spec in --cdi-dir with
// HAMi-core's limits computed from the claim's consumed capacity. --dra-profile picks the
// names: sdk (driver gpu.hamireg.io, a claim that asks no cores gets no core limit) or hami
// (HAMi-DRA's driver hami-core-gpu.project-hami.io verbatim, so HAMi-DRA's webhook works
// unchanged; a claim that asks no cores gets 100). Each GPU has one owner: --dra-gpus lists
// those DRA owns (default: all); the others stay with the device plugin. A DRA-owned GPU is
// cordoned for HAMi's extender (hami.io/device-cordon; health false with v2.9.0's) and not
// counted in nvidia.com/gpu; a device-plugin-owned GPU is published tainted
// <driver>/owned-by-hami so no claim gets it. With --mig, a DRA-owned GPU is published as its
// MIG placements (devices consuming the GPU's memory-slice counters, DeviceClass
// mig.<driver>), and Prepare creates a claim's placement with the same MIG manager as
// Allocate (docs/dra.md, "MIG through DRA"). deploy/dra.yaml has the DeviceClasses of both
// profiles and the extra RBAC (resourceslices, resourceclaims); the DaemonSet shows the flags
// and the folders to mount.
//
// The node name comes from NODE_NAME (the chart sets it from spec.nodeName; the legacy
// NodeName works too). Without --kubeconfig the in-cluster configuration is used.
//
// # Without a GPU
//
// --simulate dgxa100|dgxh100|dgxh200|dgxb200 runs on one of go-nvml's simulated servers
// instead of the driver: eight GPUs with random UUIDs (--simulate-uuid-seed SEED derives them
// from SEED, so that a restarted plugin sees the same GPUs), interconnected as
// --simulate-topology says (nvswitch, the DGX's, by default; hybrid-cube-mesh, a DGX-1V's
// direct NVLinks; pcie). Then SIGUSR1 injects a critical XID
// (79) on GPU 0, which turns it unhealthy on both channels; it is healthy again once
// --health-quiet-period has passed without another XID. For example, on a node without a GPU:
//
//	NODE_NAME=$(hostname) deviceplugin --simulate dgxh100 --kubeconfig admin.kubeconfig \
//	    --prepare-state-dir=false --health-quiet-period 30s -v 2
//	kill -USR1 $(pidof deviceplugin) # GPU 0: 10 devices fewer, health false in the annotation
//
// With --mig the simulated GPUs are in MIG mode and behave as the hardware does (package
// nvmlsim: nvidia-smi profile ids, an overlapping placement refused, MIG devices enumerated):
// a dgxa100 publishes 1g.5gb (4864 MiB), 2g.10gb, 3g.20gb and 7g.40gb on each GPU.
// --simulate-debug-address ADDRESS (default "", off) serves GET /debug/nvmlsim/mig there: the
// JSON of nvmlsim.MIGState, every GPU's MIG mode and live instances (profile, placement, GPU
// and compute instance ids, MIG UUID) and "overlaps", non-empty if two live instances share a
// memory slice. The address is logged ("Serving the simulation's MIG state"); port 0 picks a
// free one.
//
//	NODE_NAME=$(hostname) deviceplugin --simulate dgxa100 --mig --simulate-debug-address 127.0.0.1:8090 \
//	    --kubeconfig admin.kubeconfig --prepare-state-dir=false -v 2
//	curl -s http://127.0.0.1:8090/debug/nvmlsim/mig
//
// Exit status: 0 after SIGTERM or SIGINT, 1 when the plugin cannot run (the error says why
// and what to fix, e.g. the kubelet socket not in --kubelet-root-dir), 2 on bad flags or a
// missing node name.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
	"github.com/hamireg/hamireg/hamicore"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/nodeagent/nodedra"
	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlsim"
	"github.com/hamireg/hamireg/register"
)

// The scanner is the agent's device source.
var (
	_ nodeagent.Source         = (*nvmlscan.Scanner)(nil)
	_ nodeagent.TopologySource = (*nvmlscan.Scanner)(nil)
)

// simulatedXID is the XID that SIGUSR1 injects on GPU 0 in --simulate mode.
const simulatedXID = 79

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	xid := make(chan os.Signal, 1)
	signal.Notify(xid, syscall.SIGUSR1)
	code := run(ctx, os.Args[1:], os.Stderr, host{getenv: os.Getenv, xid: xid})
	stop()
	os.Exit(code)
}

// host is what run takes from its process; tests give their own.
type host struct {
	getenv func(string) string
	// xid receives a value per simulated XID (SIGUSR1).
	xid <-chan os.Signal
	// client, when set, replaces the clientset made from --kubeconfig or the cluster.
	client kubernetes.Interface
}

// run is the command. It returns the exit status.
func run(ctx context.Context, args []string, stderr io.Writer, h host) int {
	flags := flag.NewFlagSet("deviceplugin", flag.ContinueOnError)
	flags.SetOutput(stderr)
	splitCount := flags.Int("device-split-count", int(nvmlscan.DefaultSplitCount), "tasks that may share one GPU (deviceSplitCount)")
	memScaling := flags.Float64("device-memory-scaling", 1, "GPU memory scaling; above 1 oversubscribes (deviceMemoryScaling)")
	coreScaling := flags.Float64("device-cores-scaling", 1, "GPU core scaling (deviceCoreScaling)")
	preConfigured := flags.Int64("preconfigured-device-memory", 0, "MiB to assume for GPUs that report no memory (preConfiguredDeviceMemory)")
	hookPath := flags.String("hook-path", cmp.Or(h.getenv("HOOK_PATH"), hamicore.DefaultHookPath), "host folder of HAMi-core, libvgpu.so under <dir>/vgpu (HOOK_PATH)")
	prepare := flags.Bool("prepare-state-dir", true, "create each container's <hook-path>/vgpu/containers/<pod>_<container> folder, as HAMi does (needs <hook-path>/vgpu mounted at the same path)")
	rootDir := flags.String("kubelet-root-dir", "/var/lib/kubelet", "the kubelet's --root-dir; the plugin socket goes to <dir>/device-plugins")
	kubeconfig := flags.String("kubeconfig", "", "kubeconfig `FILE` (default: the in-cluster configuration)")
	qps := flags.Float64("kube-qps", 50, "client QPS to the API server (client-go's 5 makes each Allocate wait)")
	burst := flags.Int("kube-burst", 100, "client burst to the API server")
	simulate := flags.String("simulate", "", "run on go-nvml's simulated dgxa100, dgxh100, dgxh200 or dgxb200 instead of the driver")
	topoScore := flags.Bool("topology-score", h.getenv("ENABLE_TOPOLOGY_SCORE") == "true",
		"publish topology scores in hami.io/node-nvidia-score (HAMi: ENABLE_TOPOLOGY_SCORE=true)")
	numaTopology := flags.Bool("enable-numa-topology", false, "send each GPU's NUMA node to the kubelet's Topology Manager (HAMi: enablenumatopology)")
	nodeCapacity := flags.Bool("report-node-capacity", h.getenv("REPORT_NODE_CAPACITY") == "true",
		"write the healthy GPUs' nvidia.com/gpumem and gpucores into the Node's status (HAMi: REPORT_NODE_CAPACITY=true)")
	topoVersion := flags.String("topology-version", "master", "whose scoring rules: master (NVLinks, then NVSwitch links) or v2.9.0 (direct NVLinks only)")
	simSeed := flags.String("simulate-uuid-seed", "", "with --simulate, derive the GPUs' UUIDs from this `seed` instead of drawing them, so that a restart sees the same GPUs; \"\" = random")
	simTopology := flags.String("simulate-topology", string(nvmlsim.TopologyNVSwitch), "interconnect of the --simulate node: nvswitch, hybrid-cube-mesh or pcie")
	quiet := flags.Duration("health-quiet-period", nvmlscan.DefaultQuietPeriod, "time without a critical XID before an unhealthy GPU is healthy again")
	migMode := flags.Bool("mig", false, "operating mode mig: publish the GPUs' MIG profiles and realise MIG reservations at Allocate (HAMi master's dynamic MIG)")
	migAllowlist := flags.String("mig-allowlist", "", "migProfileAllowlist `FILE` (YAML or JSON, HAMi's device ConfigMap shape; default: HAMi's chart list, H200 entries first)")
	var migMatch mig.MatchRule
	flags.TextVar(&migMatch, "mig-model-match", mig.MatchWord, "how allowlist models match NVML names: word (at word boundaries) or substring (HAMi's strings.Contains)")
	var migProfiles nvmlscan.MIGDiscovery
	flags.TextVar(&migProfiles, "mig-profiles", nvmlscan.MIGDiscoveryBaseSlices, "how profile names resolve to NVML profiles: base (HAMi's slice-count mapping) or all (every profile id, REV profiles correct)")
	draOn := flags.Bool("dra", false, "also serve DRA: publish the GPUs DRA owns as a ResourceSlice (consumable memory and cores) and prepare their claims with HAMi-core's limits as CDI specs")
	draProfile := flags.String("dra-profile", "sdk", "DRA profile: sdk (driver "+dra.SDKDriver+") or hami (HAMi-DRA's driver "+dra.HAMiDriver+", for HAMi-DRA's webhook)")
	draGPUs := flags.String("dra-gpus", "", "with --dra, the GPUs DRA owns, a comma list of UUIDs or NVML indexes; the others stay with the device plugin (default: all)")
	cdiDir := flags.String("cdi-dir", draplugin.DefaultCDIDir, "with --dra, the `folder` of the claims' transient CDI specs (the container runtime's CDI spec folder)")
	draSyncDelay := flags.Duration("dra-slice-sync-delay", draplugin.DefaultSliceSyncDelay, "with --dra, how long a changed ResourceSlice waits before it is written (a burst of changes is one write)")
	draHealth := flags.Bool("dra-health", true, "with --dra, serve the kubelet's device health stream, which shows a failed GPU in the pods' status.containerStatuses[].allocatedResourcesStatus (kubelet 1.36+); false: health is only the slice's <driver>/unhealthy taint")
	listStrategy := flags.String("device-list-strategy", cmp.Or(h.getenv("DEVICE_LIST_STRATEGY"), hamicore.DeviceListEnvVar),
		"how a container is told its GPUs: a comma list of envvar or volume-mounts, cdi-annotations, cdi-cri (DEVICE_LIST_STRATEGY)")
	cdiKind := flags.String("cdi-kind", hamicore.DefaultCDIKind, "with a CDI device list strategy, the `kind` <vendor>/<class> of the CDI devices (its CDI spec must be on the host)")
	cdiPrefix := flags.String("cdi-annotation-prefix", cmp.Or(h.getenv("CDI_ANNOTATION_PREFIX"), hamicore.DefaultCDIAnnotationPrefix), "with cdi-annotations, the prefix of the CDI annotation key (CDI_ANNOTATION_PREFIX)")
	debugAddr := flags.String("simulate-debug-address", "", "with --simulate, serve GET /debug/nvmlsim/mig (the simulated GPUs' MIG instances, JSON) on this `address`; \"\" = off")
	metricsBind := flags.String("metrics-bind-address", defaultMetricsBindAddress, "serve /metrics, /healthz and /readyz on this `address` (HAMi's monitor port); \"\" or \"0\" = off")
	var mon monitorFlags
	addMonitorFlags(flags, &mon, h.getenv, func(msg string) { fmt.Fprintf(stderr, "deviceplugin: warning: %s\n", msg) })
	verbosity := flags.Int("v", 0, "log verbosity")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	usage := func(format string, args ...any) int {
		fmt.Fprintf(stderr, "deviceplugin: "+format+"\n", args...)
		return 2
	}
	if flags.NArg() > 0 {
		return usage("unexpected arguments %q", flags.Args())
	}
	if *splitCount < 0 || *splitCount > 1<<31-1 {
		return usage("--device-split-count %d is not within [0, 2147483647]", *splitCount)
	}
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(*verbosity), textlogger.Output(stderr)))
	ctx = klog.NewContext(ctx, logger)
	nodeName, err := register.NodeNameFromEnv(ctx, h.getenv)
	if err != nil {
		return usage("%v", err) // names the fix: NODE_NAME from spec.nodeName, as deploy/daemonset.yaml sets it
	}

	var topologyVersion annotation.Version
	switch *topoVersion {
	case "master":
	case "v2.9.0":
		topologyVersion = annotation.VersionV290
	default:
		return usage("--topology-version %q is not master or v2.9.0", *topoVersion)
	}
	env := hamicore.EnvOptions{HookPath: *hookPath, DeviceMemoryScaling: *memScaling,
		DeviceListStrategy: *listStrategy, CDIKind: *cdiKind, CDIAnnotationPrefix: *cdiPrefix}
	if err := env.Validate(); err != nil {
		return usage("--device-list-strategy, --cdi-kind, --cdi-annotation-prefix: %v", err)
	}
	metricsAddr, err := nodeagent.ParseMetricsAddress(*metricsBind)
	if err != nil {
		return usage("--metrics-bind-address: %v", err)
	}
	if *debugAddr != "" && *simulate == "" {
		return usage("--simulate-debug-address needs --simulate")
	}
	if *simSeed != "" && *simulate == "" {
		return usage("--simulate-uuid-seed needs --simulate")
	}
	mo, err := migOptions(*migMode, *migAllowlist, migMatch, migProfiles)
	if err != nil {
		return usage("%v", err)
	}
	draOpts, err := draOptions(*draOn, *draProfile, *draGPUs, *rootDir, *cdiDir, *draSyncDelay, *draHealth)
	if err != nil {
		return usage("%v", err)
	}
	lib := nvml.New()
	opts := nvmlscan.Options{Mode: mo.mode, MIGAllowlist: mo.allowlist, MIGModelMatch: mo.match, MIGProfileDiscovery: mo.discovery,
		TopologyVersion: topologyVersion, SplitCount: int32(*splitCount), MemoryScaling: memScaling, CoreScaling: coreScaling, PreConfiguredMemory: *preConfigured,
		Health: nvmlscan.HealthOptions{QuietPeriod: *quiet, ProbeInterval: min(*quiet, nvmlscan.DefaultProbeInterval)}}
	if *simulate != "" {
		node, err := nvmlsim.New(*simulate)
		if err != nil {
			return usage("--simulate: %v", err)
		}
		if *simSeed != "" {
			node.SetUUIDSeed(*simSeed)
		}
		if err := node.SetTopology(nvmlsim.Topology(*simTopology)); err != nil {
			return usage("--simulate-topology: %v", err)
		}
		if *migMode {
			node.EnableMIG()
		}
		lib, opts.Sysfs = node.Server, node.Sysfs
		var wg sync.WaitGroup
		defer wg.Wait()
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		wg.Go(func() { injectXIDs(sctx, node, h.xid) })
		if *debugAddr != "" {
			lis, err := net.Listen("tcp", *debugAddr)
			if err != nil {
				fmt.Fprintf(stderr, "deviceplugin: --simulate-debug-address: %v\n", err)
				return 1
			}
			wg.Go(func() { serveDebug(sctx, lis, node) })
		}
	}
	scanner, err := nvmlscan.New(lib, opts)
	if errors.Is(err, nvmlscan.ErrInvalidOptions) {
		return usage("%v", err)
	} else if err != nil {
		fmt.Fprintf(stderr, "deviceplugin: %v\n", err)
		return 1
	}
	defer func() { _ = scanner.Close() }()

	client, err := connect(*kubeconfig, float32(*qps), *burst, h.client)
	if err != nil {
		fmt.Fprintf(stderr, "deviceplugin: %v\n", err)
		return 1
	}
	var instances nodeagent.MIGInstances
	if *migMode {
		instances = scanner.MIG()
	}
	var world nodeagent.DRA // nil: no DRA; only this program's --dra links the DRA libraries
	if draOpts != nil {
		draOpts.Plugin.Env, draOpts.Plugin.PrepareStateDir = env, *prepare
		w, err := nodedra.New(client, nodeName, *draOpts)
		if err != nil {
			return usage("%v", err)
		}
		world = w
	}
	// The registry of /metrics: the agent's and the register writer's hamireg_* families; a
	// program adds its own collectors (the node monitor's) to reg before run serves it.
	reg := prometheus.NewRegistry()
	given := map[string]bool{}
	flags.Visit(func(f *flag.Flag) { given[f.Name] = true })
	monOpts, err := mon.options(func(name string) bool { return given[name] }, *prepare, *hookPath, scanner)
	if err != nil {
		return usage("%v", err)
	}
	if monOpts != nil {
		if err := prepareRoot(ctx, monOpts.Root); err != nil {
			fmt.Fprintf(stderr, "deviceplugin: %v\n", err)
			return 1
		}
	}
	agent, err := nodeagent.New(client, nodeName, scanner, nodeagent.Options{
		Monitor:        monOpts,
		Registerer:     reg,
		DRA:            world,
		MIG:            instances,
		TopologyScores: *topoScore,
		NodeCapacity:   *nodeCapacity,
		Kubelet:        kubeletplugin.Options{PluginDir: kubeletplugin.PluginDirFromRootDir(*rootDir), NUMATopology: *numaTopology},
		Allocator: nodeagent.HAMiCore{
			Env:             env,
			PrepareStateDir: *prepare,
		},
	})
	if err != nil {
		return usage("%v", err)
	}
	if err := agent.RunServing(ctx, metricsAddr, reg); err != nil {
		fmt.Fprintf(stderr, "deviceplugin: %v\n", err)
		return 1
	}
	logger.Info("Device plugin stopped")
	return 0
}

// connect returns client if set, else a clientset for the kubeconfig file or, when there is
// none, the in-cluster configuration.
func connect(kubeconfig string, qps float32, burst int, client kubernetes.Interface) (kubernetes.Interface, error) {
	if client != nil {
		return client, nil
	}
	cfg, err := rest.InClusterConfig()
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("load client configuration: %w (outside a cluster, give --kubeconfig)", err)
	}
	cfg.UserAgent, cfg.QPS, cfg.Burst = "hamireg-deviceplugin", qps, burst
	return kubernetes.NewForConfig(cfg)
}

// injectXIDs injects a critical XID on GPU 0 of node for every value of xid, until ctx ends.
func injectXIDs(ctx context.Context, node *nvmlsim.Node, xid <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-xid:
			klog.FromContext(ctx).Info("Simulating a critical XID", "xid", simulatedXID, "gpuUUID", node.UUID(0))
			node.XID(0, simulatedXID)
		}
	}
}

// migConfig is what the --mig flags select.
type migConfig struct {
	mode      string
	allowlist mig.Allowlist
	match     mig.MatchRule
	discovery nvmlscan.MIGDiscovery
}

// migOptions reads the --mig flags: the operating mode, the allowlist file (nil without one:
// nvmlscan's default), the model match rule and the profile discovery.
func migOptions(on bool, allowlistFile string, match mig.MatchRule, profiles nvmlscan.MIGDiscovery) (migConfig, error) {
	c := migConfig{match: match, discovery: profiles}
	if on {
		c.mode = nvmlscan.ModeMIG
	}
	if allowlistFile != "" {
		data, err := os.ReadFile(allowlistFile)
		if err != nil {
			return c, fmt.Errorf("--mig-allowlist: %w", err)
		}
		if c.allowlist, err = mig.ParseAllowlist(data); err != nil {
			return c, fmt.Errorf("--mig-allowlist %s: %w", allowlistFile, err)
		}
		if c.allowlist == nil {
			c.allowlist = mig.Allowlist{} // an empty file: no profile for any GPU
		}
	}
	return c, nil
}

// draOptions reads the --dra flags: nil without --dra; else the DRA world's options with
// the profile, the GPUs DRA owns (nil: all), the kubelet's plugin folders under rootDir, the
// CDI folder, the slice sync delay and whether the kubelet's health stream is served.
func draOptions(on bool, profile, gpus, rootDir, cdiDir string, syncDelay time.Duration, health bool) (*nodedra.Options, error) {
	if !on {
		return nil, nil
	}
	p, err := dra.ProfileByName(profile)
	if err != nil {
		return nil, fmt.Errorf("--dra-profile: %w", err)
	}
	o := &nodedra.Options{Plugin: draplugin.Options{
		Profile:        p,
		RegistrarDir:   filepath.Join(rootDir, "plugins_registry"),
		PluginDir:      filepath.Join(rootDir, "plugins", p.Driver),
		CDIDir:         cdiDir,
		SliceSyncDelay: syncDelay,

		DisableHealthService: !health,
	}}
	if gpus != "" {
		o.GPUs = strings.Split(gpus, ",")
	}
	return o, nil
}

// debugPath is where --simulate-debug-address serves the simulated GPUs' MIG state.
const debugPath = "/debug/nvmlsim/mig"

// serveDebug serves GET /debug/nvmlsim/mig on lis, the simulation's [nvmlsim.MIGState] in
// JSON, until ctx ends.
func serveDebug(ctx context.Context, lis net.Listener, node *nvmlsim.Node) {
	logger := klog.FromContext(ctx)
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+debugPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(node.MIGState()); err != nil {
			logger.V(4).Info("Debug response not written", "err", err)
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	stopped := context.AfterFunc(ctx, func() { _ = srv.Close() })
	defer stopped()
	logger.Info("Serving the simulation's MIG state", "address", "http://"+lis.Addr().String()+debugPath)
	if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
		logger.Error(err, "Simulation debug endpoint stopped")
	}
}
