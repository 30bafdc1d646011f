// Package nvmlscan reads a node's NVIDIA GPUs from NVML and turns them into the devices of
// HAMi's register annotation (hami.io/node-nvidia-register), with HAMi's per-device formulas
// exactly, and watches NVML for critical XID errors to keep each GPU's health.
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
// # Lifecycle
//
// [New] validates the options and initialises NVML. [Scanner.Scan] enumerates the GPUs each
// time it is called; the caller decides how often (HAMi: every 30 s). [Scanner.Run] runs the
// XID health watch until its context ends; the health it keeps shows in the Health field of
// the scanned devices, in [Scanner.Unhealthy], and as a notification on
// [Scanner.Changed]. [Scanner.Close] stops Run, waits for a scan in progress and shuts
// NVML down.
//
// # Concurrency
//
// All methods are safe for concurrent use. Scans are serialised. Run starts one goroutine that
// waits for NVML events and joins it before returning; at most one Run per scanner runs at a
// time. Scan, Run and Close log through the logger of their context (klog.FromContext) and
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
