// Package nvmlscan reads a node's NVIDIA GPUs from NVML and turns them into the devices of
// HAMi's register annotation (hami.io/node-nvidia-register), with HAMi's per-device formulas
// exactly, watches NVML for critical XID errors to keep each GPU's health, and reads the GPUs'
// live usage for a node monitor ([Scanner.Usage]).
//
// It is the only package of this SDK that imports go-nvml, and so the only one that needs cgo,
// with the two under it: nvmlscan/nvmlsim (go-nvml's simulated servers wired for a scanner, for
// programs such as a --simulate mode) and nvmlscan/nvmlscantest (the same for tests).
// Any [nvml.Interface] will do: nvml.New() on a GPU node, or one of go-nvml's simulated servers
// (mock/dgxa100, dgxh100, dgxh200, dgxb200, mock/server) in tests.
//
// # Differences from HAMi's node agent (wire format unchanged)
//
//   - NVML is initialised once per [Scanner] and shut down by [Scanner.Close]; HAMi does both
//     on every 30-s scan. After a failed Init nothing else is called (a call into NVML after
//     ERROR_LIBRARY_NOT_FOUND kills the process), and the [*InitError] says how to fix it.
//   - A GPU whose query fails is skipped and reported as a [*DeviceError] in [Result.Failed];
//     the other GPUs still register. HAMi's agent panics (CrashLoopBackOff) and the node
//     loses all of its GPUs.
//   - Devices come back in canonical order, so an unchanged node always encodes to the same
//     annotation value.
//   - A GPU marked unhealthy by an XID becomes healthy again after a quiet period in which it
//     answers queries (the rule is on [Scanner.Run]); HAMi's is unhealthy until the agent
//     restarts.
//   - Options are validated in [New] and default to the chart's values; HAMi panics on a device
//     configuration without them.
//   - Topology scores ([Scanner.PairScores], for hami.io/node-nvidia-score) are HAMi's, with
//     either version's rules (Options.TopologyVersion); two GPUs that see different link
//     counts to each other score 0 with an [*AsymmetricLinkError] warning (HAMi master's rule)
//     where HAMi v2.9.0 panics, and a failed NVML query is a [*TopologyError] for the caller,
//     which still publishes its devices (HAMi's plugin writes neither annotation).
//
// # MIG
//
// In [ModeMIG] a scan publishes what HAMi master's node agent publishes (Options.MIGVersion
// annotation.VersionMaster, the default; [ExampleScanner_Scan_mig]): per GPU devmem = whole
// MiB without memory scaling, devcore = 100, and "migProfiles", found through NVML:
//
//   - The 100 % reference is the largest MultiprocessorCount of the base GPU instance
//     profiles (1, 2, 3, 4, 6, 7 and 8 slices): 98 SMs on an A100, not its 108.
//   - The GPU's profile names come from the first entry of Options.MIGAllowlist whose models
//     match its NVML name (the allowlist is policy only).
//   - Each name is resolved to a GPU instance profile by Options.MIGProfileDiscovery, and
//     published with MemoryMB = NVML's MemorySizeMB (MiB), SliceCount, Core = ceil(SMs × 100 /
//     the reference) and NVML's possible placements, unfiltered. A profile whose NVML query
//     fails is skipped ("skip MIG profile placement discovery", with the step).
//   - count = the largest InstanceCount of the published profiles (7 on an A100).
//   - GetMigMode is not called: a MIG-capable GPU with MIG off publishes the same profiles;
//     [MIGManager.Create] switches MIG on when it realises an instance.
//
// With annotation.VersionV290 a MIG GPU publishes mode "mig" and count = Options.SplitCount
// only, and no MIG query is made: HAMi v2.9.0's scheduler takes the geometries from its own
// knownMigGeometries.
//
// [Scanner.MIG] returns the [MIGManager], which realises the reservations of
// hami.io/vgpu-mig-allocations on the node (package nodeagent's MIGInstances): it lists the
// MIG devices, creates a GPU instance of a published profile at exactly the reserved placement
// with the compute instance filling it, and destroys them.
//
// # MIG: differences from HAMi (wire format unchanged)
//
// Each is a rule, tested in mig_conformance_test.go, mig_test.go and migmanager_test.go:
//
//   - Model match at word boundaries (mig.MatchWord, the default of Options.MIGModelMatch): a
//     model matches when it occurs in the NVML name with no letter or digit right before or
//     after it. HAMi's strings.Contains (mig.MatchSubstring) gives an "NVIDIA H200" the
//     chart's "H20" profiles. A log line at V(2) names the other entries that match as well,
//     and says when HAMi's rule would choose another entry. The default allowlist
//     (mig.DefaultAllowlist, used when Options.MIGAllowlist is nil) adds the NVML names real
//     boards report and the chart misses ("NVIDIA A100 80GB PCIe", "NVIDIA H100 80GB HBM3",
//     "NVIDIA H200"); mig.ChartAllowlist with mig.MatchSubstring reproduces HAMi byte for byte.
//   - A MIG GPU without profiles is not dropped silently (HAMi: the GPU disappears from the
//     node): the scan logs "skip MIG device with no discovered profile capacity" and reports
//     it in [Result.Failed] as a [*DeviceError] with [OpMIGProfiles] and [ErrNoMIGProfile],
//     whose text names the fix; the node agent records it as an Event on the Node.
//   - The base profiles are queried in a fixed order (HAMi ranges over a map).
//   - REV profiles. With [MIGDiscoveryBaseSlices] (the default, HAMi's rule) only a name's
//     slice prefix counts: "1g.10gb" on an A100-40GB and "1g.5gb+me" are published with the
//     memory and placements of the base 1g.5gb profile, as HAMi does. With
//     [MIGDiscoveryAllProfiles] every GPU instance profile id is asked, named as nvidia-smi
//     names it (memory share rounded up to eighths of the GPU's memory in GiB, suffix "+me",
//     "+me.all", "+gfx" or "-me"), and a name is published with the memory, SMs and placements
//     of its own profile. A name no profile of the GPU has is not published (V(2) log line):
//     the chart's "7g.79gb" for the A100-80GB, whose nvidia-smi name is "7g.80gb", is one; a
//     GPU left without profiles is reported with [ErrNoMIGProfile].
//   - The MIG manager uses the scanner's one NVML initialisation (HAMi's device plugin calls
//     nvmlInit 3-5 times per Allocate without a Shutdown), resolves a profile name to the very
//     profile the node published under it (so a REV name is realised as what was published),
//     checks the placement against NVML's possible placements ([ErrPlacementNotPossible]),
//     names the instance in the way of an occupied placement ([ErrPlacementTaken]), refuses a
//     GPU whose MIG mode change waits for a reset ([ErrMIGModePending]), destroys what it
//     created when a later step fails, and never destroys a GPU instance whose id now belongs
//     to another profile or placement than the one asked for ([MIGManager.Destroy]).
//
// # Usage of the host GPUs (node monitor)
//
// [Scanner.Usage] reads what HAMi's node monitor (vGPUmonitor) exports as its host families,
// for every GPU of the host in NVML index order: memory used and total
// (nvmlDeviceGetMemoryInfo, v1), core and memory-controller utilisation
// (nvmlDeviceGetUtilizationRates), the name behind HAMi's device_type label ("NVIDIA-" +
// name), and beyond HAMi the GPU's compute processes by host PID
// (nvmlDeviceGetComputeRunningProcesses), which a monitor joins with HAMi-core's per-process
// accounting. A GPU in MIG mode is reported as the parent GPU, as HAMi does (NVML answers its
// utilisation ERROR_NOT_SUPPORTED). Each failed query sets its own error field, a
// [*DeviceError] that errors.Is [ErrNotSupported] when NVML answers ERROR_NOT_SUPPORTED;
// HAMi's rule on them is: memory not supported (unified memory) skips only the memory series,
// any other memory error every host series of the GPU, a failed utilisation query the
// utilisation series ([ExampleScanner_Usage]):
//
//	gpus, err := scanner.Usage(ctx) // NVML stays initialised: no Init/Shutdown per scrape
//	if err != nil {
//		return err // NVML cannot count the GPUs, ctx ended, or the scanner is closed
//	}
//	for _, g := range gpus {
//		deviceType := "NVIDIA-" + g.Name // HAMi's device_type label
//		if g.MemoryErr != nil && !errors.Is(g.MemoryErr, nvmlscan.ErrNotSupported) {
//			fmt.Println(g.Index, "no host series:", errors.Is(g.MemoryErr, nvml.ERROR_UNKNOWN))
//			continue // HAMi exports no host series of this GPU
//		}
//		if g.MemoryErr == nil { // else not supported (unified memory): no memory series
//			fmt.Println(g.Index, deviceType, "memory used", g.MemoryUsed, "of", g.MemoryTotal)
//		}
//		if g.UtilErr == nil {
//			fmt.Println(g.Index, deviceType, "utilization", g.UtilGPU, g.UtilMemory)
//		}
//		for _, p := range g.Processes {
//			fmt.Println(g.Index, "host pid", p.PID, "uses", p.UsedMemory)
//		}
//	}
//
// Differences from HAMi's monitor: NVML is initialised once for the scanner, not on every
// scrape (HAMi calls nvmlInit and nvmlShutdown in every Collect); a GPU whose handle, UUID or
// name cannot be read is left out and logged at V(2), and no NVML answer makes Usage panic.
//
// # Lifecycle
//
// [New] validates the options and initialises NVML. [Scanner.Scan] enumerates the GPUs each
// time it is called; the caller decides how often (HAMi: every 30 s). [Scanner.Run] runs the
// XID health watch until its context ends; the health it keeps shows in the Health field of
// the scanned devices, in [Scanner.Unhealthy], and as a notification on
// [Scanner.Changed]. [Scanner.Close] stops Run, waits for a scan in progress and shuts
// NVML down. The [MIGManager] of [Scanner.MIG] works on the scanner's NVML and fails with
// [ErrClosed] after Close.
//
// # Concurrency
//
// All methods are safe for concurrent use. Scans, usage reads and the MIG manager's calls
// are serialised. Run starts one goroutine that waits for NVML events and joins it before
// returning; at most one Run per scanner runs at a time. Scan, Run, Close and the MIG
// manager, and Usage, log through the logger of their context (klog.FromContext) and
// keep no global state.
//
// # Usage
//
// A node program hands the Scanner to package github.com/hamireg/hamireg/nodeagent as its
// device source ([Scanner.Devices], [Scanner.Changed] and [Scanner.Run] are what it calls). On
// its own ([ExampleScanner]):
//
//	s, err := nvmlscan.New(nvml.New(), nvmlscan.Options{}) // chart defaults
//	if err != nil {
//		return err // errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND): the pod did not get the driver
//	}
//	defer s.Close()
//	wg.Go(func() { cancel(s.Run(ctx)) }) // XID health watch; Close stops it and waits for it
//	res, err := s.Scan(ctx)
//	if err != nil {
//		return err
//	}
//	value := annotation.Encode(res.Devices) // hami.io/node-nvidia-register
package nvmlscan
