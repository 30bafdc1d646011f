package nvmlsim

import (
	"crypto/sha256"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing/fstest"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"k8s.io/utils/clock"
)

// BusNumbers are the PCI bus numbers [Wire] gives GPUs 0-7, those of a DGX H100. GPUs 0-3
// are on NUMA node 0 and GPUs 4-7 on NUMA node 1 in [Node.Sysfs].
func BusNumbers() [8]uint8 {
	return [8]uint8{0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb}
}

// Node is a simulated GPU node. Create it with [New] or [Wire].
type Node struct {
	// Server is the simulated NVML library; pass it to nvmlscan.New.
	Server *server.Server
	// Sysfs holds bus/pci/devices/<bus id>/numa_node for every GPU; pass it as
	// nvmlscan.Options.Sysfs. It may be changed before the scanner is created.
	Sysfs fstest.MapFS

	events   chan event
	freed    atomic.Int32
	lost     []atomic.Bool
	topology atomic.Pointer[topology]

	// migMu guards mig, the GPUs' MIG state.
	migMu sync.Mutex
	mig   []*migGPU

	// usageMu guards usage, the GPUs' live usage and the answers SetReturn replaced. It is
	// never held together with migMu.
	usageMu sync.Mutex
	usage   []*gpuUsage
}

type event struct {
	data nvml.EventData
	ret  nvml.Return
}

// Wire wires srv, which must have at most 8 GPUs, and returns the node. It sets Func fields
// of srv and its devices, so it must be called before anything uses srv; callers that set Func
// fields of their own do so after Wire and before the scanner is created.
//
// What it wires: GetPciInfo with an NVML-style bus id ("00000000:18:00.0", see [BusNumbers]);
// GetSupportedEventTypes (XID, single- and double-bit ECC) and RegisterEvents (success) on every
// GPU; the usage queries GetMemoryInfo, GetUtilizationRates and GetComputeRunningProcesses,
// answering what [Node.SetMemoryUsed], [Node.SetUtilization] and [Node.SetProcesses] set (an
// idle GPU until then), and GetName and GetUUID, all of which [Node.SetReturn] can make fail; EventSetCreate returning an event set whose Wait delivers what [Node.XID], [Node.Event]
// and [Node.WaitError] queue (up to 64), or ERROR_TIMEOUT after its timeout; GetName wrapped
// so that [Node.SetLost] can make a GPU stop answering; and the topology queries
// (GetTopologyCommonAncestor, GetNvLinkState, GetNvLinkRemotePciInfo,
// GetNvLinkRemoteDeviceType) from [TopologyNVSwitch], which [Node.SetTopology] changes.
//
// It also replaces the simulated servers' MIG calls with ones that behave as a GPU does (see
// the package documentation, "MIG"): MIG mode stays off, as go-nvml leaves it, until
// [Node.EnableMIG] or SetMigMode turns it on.
func Wire(srv *server.Server) (*Node, error) {
	buses := BusNumbers()
	if len(srv.Devices) > len(buses) {
		return nil, fmt.Errorf("wire simulated node: %d GPUs, at most %d supported", len(srv.Devices), len(buses))
	}
	n := &Node{
		Server: srv,
		Sysfs:  fstest.MapFS{},
		events: make(chan event, 64),
		lost:   make([]atomic.Bool, len(srv.Devices)),
		usage:  make([]*gpuUsage, len(srv.Devices)),
	}
	for i := range srv.Devices {
		d := n.Device(i)
		bus := buses[i]
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			return pciInfo(bus, d.Config.PciDeviceId), nvml.SUCCESS
		}
		n.wireTopology(i)
		getName := d.GetNameFunc
		d.GetNameFunc = func() (string, nvml.Return) {
			if n.lost[i].Load() {
				return "", nvml.ERROR_GPU_IS_LOST
			}
			return getName()
		}
		d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
			return nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError, nvml.SUCCESS
		}
		d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
		numa := "0\n"
		if i >= 4 {
			numa = "1\n"
		}
		n.Sysfs[fmt.Sprintf("bus/pci/devices/0000:%02x:00.0/numa_node", bus)] = &fstest.MapFile{Data: []byte(numa)}
	}
	n.wireMIG()
	for i := range srv.Devices {
		n.wireUsage(i)
	}
	if err := n.SetTopology(TopologyNVSwitch); err != nil {
		return nil, fmt.Errorf("wire simulated node: %w", err)
	}
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{WaitFunc: n.wait, FreeFunc: n.free}, nvml.SUCCESS
	}
	return n, nil
}

func (n *Node) wait(timeoutMs uint32) (nvml.EventData, nvml.Return) {
	timer := clock.RealClock{}.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer timer.Stop()
	select {
	case e := <-n.events:
		return e.data, e.ret
	case <-timer.C():
		return nvml.EventData{}, nvml.ERROR_TIMEOUT
	}
}

func (n *Node) free() nvml.Return {
	n.freed.Add(1)
	return nvml.SUCCESS
}

// Device returns GPU i of the server.
func (n *Node) Device(i int) *server.Device { return n.Server.Devices[i].(*server.Device) }

// UUID returns the UUID of GPU i (the simulated servers draw them at random; see
// [Node.SetUUIDSeed]).
func (n *Node) UUID(i int) string { return n.Device(i).UUID }

// SetUUIDSeed replaces the GPUs' random UUIDs with ones derived from seed and the GPU's index
// (a version-4-shaped UUID from the SHA-256 of both), so that a program restarted with the
// same seed sees the same GPUs, as a real node does after a restart. Call it before a scanner
// reads the node.
func (n *Node) SetUUIDSeed(seed string) {
	for i := range n.Server.Devices {
		sum := sha256.Sum256([]byte(seed + "/" + strconv.Itoa(i)))
		b := sum[:16]
		b[6] = b[6]&0x0f | 0x40 // version 4
		b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
		n.Device(i).UUID = fmt.Sprintf("GPU-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
	}
}

// XID queues a critical XID event on GPU i.
func (n *Node) XID(i int, xid uint64) {
	n.Event(nvml.EventData{Device: n.Device(i), EventType: nvml.EventTypeXidCriticalError, EventData: xid})
}

// Event queues an arbitrary event.
func (n *Node) Event(data nvml.EventData) {
	n.events <- event{data: data, ret: nvml.SUCCESS}
}

// WaitError makes the next wait for events fail with ret.
func (n *Node) WaitError(ret nvml.Return) {
	n.events <- event{ret: ret}
}

// SetLost makes every name query of GPU i fail with ERROR_GPU_IS_LOST (lost true) or answer
// again (lost false), as a GPU that fell off the bus and came back. Safe while a scanner runs.
func (n *Node) SetLost(i int, lost bool) { n.lost[i].Store(lost) }

// Freed returns how many times event sets of this node were freed.
func (n *Node) Freed() int { return int(n.freed.Load()) }
