package nodeagent

// NUMASource is a [Source] that also knows each GPU's NUMA node (nvmlscan's Scanner is one):
// NUMANodes returns them by UUID, a GPU without a known node (or without NUMA affinity)
// having no entry.
type NUMASource interface {
	NUMANodes() map[string]int
}

// NUMAReceiver is a [DRA] world that publishes the GPUs' NUMA nodes, as the standard device
// attribute resource.kubernetes.io/numaNode (nodedra's World is one). When the source is a
// [NUMASource], the agent hands the receiver the nodes of every scan just before
// SetDevices.
type NUMAReceiver interface {
	SetNUMANodes(numa map[string]int)
}

// handNUMA gives the DRA world the source's NUMA nodes when both sides take part.
func (a *Agent) handNUMA(world DRA) {
	src, ok := a.source.(NUMASource)
	if !ok {
		return
	}
	if r, ok := world.(NUMAReceiver); ok {
		r.SetNUMANodes(src.NUMANodes())
	}
}
