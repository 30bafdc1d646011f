// Package nodedra is the DRA world of a node agent: a [World] publishes the GPUs it owns as
// a ResourceSlice and prepares their claims (package draplugin, on
// k8s.io/dynamic-resource-allocation), beside the device-plugin world of package nodeagent,
// with one owner per physical GPU.
//
// It is a package of its own so that only node programs that serve DRA link the DRA
// libraries (k8s.io/dynamic-resource-allocation, and through its kubelet plugin helper etcd's
// file utilities and zap): nodeagent knows DRA only as its small [nodeagent.DRA] interface. A
// program opts in by building a World and handing it to the agent as nodeagent.Options.DRA:
//
//	world, err := nodedra.New(client, nodeName, nodedra.Options{
//		Plugin: draplugin.Options{Profile: dra.SDKProfile()},
//		GPUs:   []string{"6", "7"}, // UUIDs or NVML indexes DRA owns; empty: all
//	})
//	if err != nil {
//		return err
//	}
//	agent, err := nodeagent.New(client, nodeName, scanner, nodeagent.Options{DRA: world})
//	if err != nil {
//		return err
//	}
//	return agent.Run(ctx) // runs the world too
//
// # Ownership
//
// Options.GPUs lists the GPUs the DRA world owns, by UUID or NVML index (empty: every GPU),
// in MIG mode or not ([World.Owns]). The agent keeps the owned GPUs out of the
// kubelet's device count, cordons them in the register annotation and refuses them at
// Allocate. The world publishes every GPU the agent scans (dra.Devices with the profile of
// Options.Plugin, PCI bus IDs from a nodeagent.PCISource), a device-plugin GPU with the
// NoSchedule taint <driver>/owned-by-hami, an unhealthy one with <driver>/unhealthy, and
// refuses at Prepare a GPU it does not own, or one that a live pod on the node holds through
// HAMi's pod annotation. That last check reads the agent's node-scoped pod informer through
// nodeagent.DRAHost: no API request per Prepare. Refusals wrap nodeagent.ErrOwnership.
//
// # MIG
//
// A GPU in MIG mode that the world owns is published as partitionable devices (dra.Slices:
// a counter set of its memory slices, a device per placement of each profile), withheld from
// the device plugin's MIG path (the kubelet's count, hami.io/device-cordon, Allocate
// refuses it, and the agent's MIG release leaves its instances alone). A claim that gets a
// placement is prepared by creating that instance with the agent's MIG realiser
// (nodeagent.Options.MIG, through nodeagent.DRAHost.MIG, under the agent's Allocate lock),
// and unprepared by destroying it.
//
// # Lifecycle and concurrency
//
// [New] validates the options and reads the DRA plugin's checkpoint; it starts nothing. The
// agent calls [World.Run] once its pod informer synced, beside its other parts, and joins it;
// a claim that reaches Prepare while no agent runs the world is refused with [ErrNotRunning].
// SetDevices, Owns and PreparedGPUs are safe for concurrent use.
//
// # RBAC
//
// The agent's ServiceAccount needs [ClusterRoleRules] besides nodeagent.ClusterRoleRules:
// resourceslices, resourceclaims (get), nodes (get) and pods (list, watch).
package nodedra
