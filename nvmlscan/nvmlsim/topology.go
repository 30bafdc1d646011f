package nvmlsim

import (
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Topology is the GPU interconnect of a simulated node, which nvmlscan's PairScores reads
// (common PCIe ancestors and NVLinks).
type Topology string

// The simulated interconnects.
const (
	// TopologyNVSwitch is the default, that of the DGX servers go-nvml simulates: every NVLink
	// of every GPU goes to an NVSwitch (12 per GPU on the A100, 18 on H100, H200 and B200),
	// GPUs 0-1, 2-3, 4-5 and 6-7 share a PCIe switch tree (MULTIPLE), the others on a NUMA node
	// meet at it (NODE), and across NUMA nodes at the SMP interconnect (SYSTEM).
	TopologyNVSwitch Topology = "nvswitch"
	// TopologyHybridCubeMesh is the DGX-1V's: six direct NVLinks per GPU (NV1 and NV2 in
	// nvidia-smi topo -m) in a hybrid cube mesh of two quads 0-3 and 4-7, one PCIe switch per
	// pair (SINGLE), NODE inside a quad, SYSTEM across. Pairs 2-3 and 6-7 have two NVLinks and
	// one PCIe switch, the best connected pairs of the node.
	TopologyHybridCubeMesh Topology = "hybrid-cube-mesh"
	// TopologyPCIe has no NVLink: the PCIe levels of TopologyNVSwitch.
	TopologyPCIe Topology = "pcie"
)

// ErrUnknownTopology is returned by [Node.SetTopology] for a topology [Topologies] does not
// list.
var ErrUnknownTopology = errors.New("unknown simulated topology")

// Topologies returns the topologies a node can simulate.
func Topologies() []Topology {
	return []Topology{TopologyHybridCubeMesh, TopologyNVSwitch, TopologyPCIe}
}

// hybridCubeMesh lists, per GPU, the GPU at the other end of each of its six NVLinks.
var hybridCubeMesh = [8][6]int{
	{1, 2, 3, 3, 4, 4}, {0, 2, 2, 3, 5, 5}, {0, 1, 1, 3, 3, 6}, {0, 0, 1, 2, 2, 7},
	{0, 0, 5, 6, 7, 7}, {1, 1, 4, 6, 6, 7}, {2, 4, 5, 5, 7, 7}, {3, 4, 4, 5, 6, 6},
}

// switchBus is the PCI bus of NVSwitch k in NVLink remote PCI answers.
func switchBus(k int) uint8 { return 0xc0 + uint8(k%4) }

// topology is a Topology resolved for one node.
type topology struct {
	name Topology
	// level[i][j] is the common PCIe ancestor of GPUs i and j.
	level [][]nvml.GpuTopologyLevel
	// links[i] lists the remote end of each NVLink of GPU i: a GPU index, or -1-k for
	// NVSwitch k.
	links [][]int
}

func newTopology(t Topology, models []string) (*topology, error) {
	n := len(models)
	top := &topology{name: t, level: make([][]nvml.GpuTopologyLevel, n), links: make([][]int, n)}
	for i := range n {
		top.level[i] = make([]nvml.GpuTopologyLevel, n)
		for j := range n {
			switch {
			case i/2 == j/2 && t == TopologyHybridCubeMesh:
				top.level[i][j] = nvml.TOPOLOGY_SINGLE
			case i/2 == j/2:
				top.level[i][j] = nvml.TOPOLOGY_MULTIPLE
			case i/4 == j/4:
				top.level[i][j] = nvml.TOPOLOGY_NODE
			default:
				top.level[i][j] = nvml.TOPOLOGY_SYSTEM
			}
		}
	}
	switch t {
	case TopologyPCIe:
	case TopologyNVSwitch:
		for i, model := range models {
			count := 18
			if strings.Contains(model, "A100") {
				count = 12
			}
			for k := range count {
				top.links[i] = append(top.links[i], -1-k)
			}
		}
	case TopologyHybridCubeMesh:
		for i := range n {
			for _, peer := range hybridCubeMesh[i%8] {
				if peer < n && i < 8 {
					top.links[i] = append(top.links[i], peer)
				}
			}
		}
	default:
		return nil, fmt.Errorf("%w %q (%s, %s, %s)", ErrUnknownTopology, t, TopologyHybridCubeMesh, TopologyNVSwitch, TopologyPCIe)
	}
	return top, nil
}

// SetTopology makes the node answer NVML's topology queries as t; [TopologyNVSwitch] until
// then. Safe while a scanner runs: the next query sees it.
func (n *Node) SetTopology(t Topology) error {
	models := make([]string, len(n.Server.Devices))
	for i := range models {
		models[i] = n.Device(i).Config.Name
	}
	top, err := newTopology(t, models)
	if err != nil {
		return fmt.Errorf("set simulated topology: %w", err)
	}
	n.topology.Store(top)
	return nil
}

// Topology returns the topology the node simulates.
func (n *Node) Topology() Topology { return n.topology.Load().name }

// wireTopology sets GPU i's topology queries.
func (n *Node) wireTopology(i int) {
	d := n.Device(i)
	d.GetTopologyCommonAncestorFunc = func(peer nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
		top := n.topology.Load()
		for j := range n.Server.Devices {
			if n.Server.Devices[j] == peer {
				return top.level[i][j], nvml.SUCCESS
			}
		}
		return 0, nvml.ERROR_INVALID_ARGUMENT
	}
	remote := func(link int) (int, nvml.Return) {
		top := n.topology.Load()
		if link < 0 || link >= len(top.links[i]) {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		return top.links[i][link], nvml.SUCCESS
	}
	d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
		if _, ret := remote(link); ret != nvml.SUCCESS {
			return 0, ret
		}
		return nvml.FEATURE_ENABLED, nvml.SUCCESS
	}
	d.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
		r, ret := remote(link)
		if ret != nvml.SUCCESS {
			return nvml.PciInfo{}, ret
		}
		bus := switchBus(-1 - r)
		if r >= 0 {
			bus = BusNumbers()[r]
		}
		return pciInfo(bus, 0), nvml.SUCCESS
	}
	d.GetNvLinkRemoteDeviceTypeFunc = func(link int) (nvml.IntNvLinkDeviceType, nvml.Return) {
		r, ret := remote(link)
		if ret != nvml.SUCCESS {
			return 0, ret
		}
		if r < 0 {
			return nvml.NVLINK_DEVICE_TYPE_SWITCH, nvml.SUCCESS
		}
		return nvml.NVLINK_DEVICE_TYPE_GPU, nvml.SUCCESS
	}
}

// pciInfo is a PciInfo with NVML's bus id text for bus ("00000000:18:00.0").
func pciInfo(bus uint8, deviceID uint32) nvml.PciInfo {
	p := nvml.PciInfo{PciDeviceId: deviceID, Bus: uint32(bus)}
	for j, c := range fmt.Sprintf("00000000:%02X:00.0", bus) {
		p.BusId[j] = int8(c)
	}
	return p
}
