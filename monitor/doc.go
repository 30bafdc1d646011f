// Package monitor is HAMi's node monitor (vGPUmonitor) rebuilt as a part of the node agent:
// it finds the shared regions HAMi-core writes per container, ties each to its pod and
// container, reads them safely on every scrape (package [region]), serves HAMi's
// per-container metrics and runs HAMi's priority feedback.
//
// # Folders
//
// HAMi's device plugin gives every container it shares a GPU with a folder
// <Root>/containers/<pod UID>_<container> (Root is HAMi's monitor HOOK_PATH, /usr/local/vgpu);
// HAMi-core creates the region file <uuid>.cache in it at the container's first CUDA call,
// next to the libvgpu.so mount point. Every Options.Period (HAMi's 5 s) the monitor scans
// them with HAMi v2.10.0's rules, for both HAMi versions:
//
//   - the name is split at the first '_' into the pod UID and the container name, both
//     non-empty ("<uid>_main_x" is container "main_x"); any other name is logged
//     (`Skipping dir with unexpected name format: <name>`) and left alone, never removed;
//   - the folder of a pod that is not on the node is kept while its mtime is within
//     Options.ResyncInterval (HAMi's 5 min; a region adopted before stays adopted), then
//     logged (`Removing dirname <folder> in monitorpath`), dropped and removed;
//   - the region file is the first name ending in ".cache"; a folder with more than two
//     entries named libvgpu.so or *.cache fails with [ErrCacheCount] ("cache num not
//     matched"); a folder without one yet, or whose region does not read yet, is tried again
//     next round; a region that reads is adopted (`Adding ctr dirname <folder> in
//     monitorpath`). `Failed to load cache: <folder>, error: <err>` is logged at V(0) the
//     first time a folder fails with an error, at V(4) when it fails again the same way and
//     while HAMi-core has not initialised the region (HAMi logs every failure every round).
//
// The pods come from [Pods], the node agent's node-scoped pod informer, matched by pod UID:
// no hami.io/vgpu-node label is needed, and init containers (native sidecars included) are
// reported with Container.Init set. A folder naming a container that is not in its pod's
// spec is still reported, under the folder's container name. A round whose pods cannot be
// listed adopts and removes nothing.
//
// # DRA claim folders
//
// The SDK's DRA driver (package draplugin, hamicore.ClaimResponse) gives each prepared claim
// the folder <Root>/claims/<claim UID>, with the region <claim UID>.cache shared by every
// container using the claim. HAMi's monitor does not look there (HAMi-WebUI#99: no data in
// DRA mode). With Options.Claims, which resolves a claim UID to the ResourceClaim, the
// monitor ties the claim's region to the pods of the claim's namespace that use it
// (spec.resourceClaims[].resourceClaimName, or status.resourceClaimStatuses for a claim made
// from a template) and to their containers (init containers too) whose resources.claims name
// that pod claim: one [Container] per using container, Key "claims/<claim UID>", Claim set.
// Without Options.Claims, or for a UID it does not know, the folder is skipped (logged once).
// Claim folders are never removed: the DRA driver owns them and removes a claim's folder
// when it unprepares the claim.
//
// # Stricter than HAMi, and why
//
// HAMi maps a region once and never looks at its folder again: a region file replaced,
// truncated or removed keeps its stale mapping (a truncated file faults the monitor), and a
// removed folder's entry leaks (HAMi#2633). This package maps nothing: [Monitor.Containers]
// reads every adopted region afresh with positioned reads (a few KiB per container: the
// header, the tail and the slots below proc_num), so a scrape sees the region as it is now,
// and a file that changed under it gives that one [Container] an Err and never stops the
// others. Each scan re-validates what it adopted: an entry whose folder or file vanished is
// dropped, and a file replaced (another inode) or resized is adopted again. HAMi v2.9.0
// panics on a folder name without '_' and reads "<uid>_main_x" as container "main"; this
// package skips the first and reads "main_x", as v2.10.0 does.
//
// # Lifecycle and concurrency
//
// [New] validates the options and starts nothing. [Monitor.Run] scans at once, then every
// Options.Period on Options.Clock, and after each successful scan runs one round of the
// priority feedback over [Monitor.Containers] (unless Options.DisableFeedback); a scan that
// cannot read <Root>/containers is logged and the round's feedback is skipped. Run returns
// nil when its context ends and starts no goroutine; one Run at a time
// ([ErrAlreadyRunning]). [Monitor.Ready] is nil while the last scan read the folders and
// listed the pods ([ErrNotReady] before): the readiness probe. [Monitor.Containers] and
// Ready are safe for concurrent use with Run and each other; scans are serialised, and
// Containers holds the monitor's lock only to copy the adopted set, never across a read.
//
//	m, err := monitor.New(pods, monitor.Options{NodeName: nodeName})
//	if err != nil {
//		return err
//	}
//	go func() { _ = m.Run(ctx) }()
//	for _, c := range m.Containers(ctx) {
//		if c.Err != nil {
//			continue // this region changed under the read; the others are fine
//		}
//		for i := range c.Region.Devices {
//			mem, sm := c.Region.Usage(i)
//			fmt.Println(c.Pod, c.Name, c.Region.Devices[i].UUID(), mem.Total, sm)
//		}
//	}
package monitor
