package nvmlscan

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/annotation"
)

// maxNvLinks is the number of NVLinks HAMi asks about per GPU (NVML_NVLINK_MAX_LINKS of the
// NVML headers HAMi builds with; go-nvml's constant is larger).
const maxNvLinks = 18

// Scores of the PCIe common-ancestor levels, HAMi's: a closer common ancestor scores higher.
// Each NVLink between two GPUs adds [ScoreNvLink].
const (
	ScoreInternal   = 60 // same board (multi-GPU card)
	ScoreSingle     = 50 // one PCIe switch
	ScoreMultiple   = 40 // several PCIe switches
	ScoreHostBridge = 30 // one host bridge
	ScoreNode       = 20 // one NUMA node
	ScoreSystem     = 10 // across NUMA nodes (SMP interconnect)
	ScoreNvLink     = 100
)

// Sentinels of [Scanner.PairScores] (test with errors.Is).
var (
	// ErrTopology means NVML could not answer a topology query, or answered a level HAMi does
	// not know; no scores are computed (the register annotation is not affected).
	ErrTopology = errors.New("topology query failed")
	// ErrUnknownDevice means a device to score is not among the GPUs NVML lists (HAMi: "no
	// device with uuid").
	ErrUnknownDevice = errors.New("no device with uuid")
	// ErrAsymmetricLink marks a warning of [Scanner.PairScores]: two GPUs see different
	// numbers of NVLinks to each other, so the pair scores 0 both ways (HAMi master's rule and
	// its Warning Event reason AsymmetricGPUP2PLink; HAMi v2.9.0 panics).
	ErrAsymmetricLink = errors.New("asymmetric GPU P2P link")
)

// AsymmetricLinkError is the warning of one GPU pair whose link counts differ. It unwraps to
// [ErrAsymmetricLink].
type AsymmetricLinkError struct {
	// A and B are the GPUs' UUIDs; AB and BA the links (PCIe path and NVLinks) each sees to the
	// other.
	A, B   string
	AB, BA int
}

// Error implements error.
func (e *AsymmetricLinkError) Error() string {
	return fmt.Sprintf("GPU %s sees %d P2P link(s) to GPU %s, which sees %d back: the pair scores 0 both ways", e.A, e.AB, e.B, e.BA)
}

// Unwrap returns [ErrAsymmetricLink].
func (e *AsymmetricLinkError) Unwrap() error { return ErrAsymmetricLink }

// TopologyError is the error of a topology query; it unwraps to [ErrTopology] and to the
// cause (an [nvml.Return] where NVML failed).
type TopologyError struct {
	// A and B are the positions, in the list of devices to score, of the pair being scored.
	A, B int
	// Op says what failed, e.g. "get nvlink state of link 1".
	Op string
	// Err is the cause.
	Err error
}

// Error implements error; the text starts with HAMi's ("error getting NVLink for devices
// (0, 1)" and the like).
func (e *TopologyError) Error() string {
	return fmt.Sprintf("error getting topology for devices (%d, %d): %s: %v", e.A, e.B, e.Op, e.Err)
}

// Unwrap returns [ErrTopology] and the cause.
func (e *TopologyError) Unwrap() []error { return []error{ErrTopology, e.Err} }

// gpuLinks is what one GPU's NVLinks connect to.
type gpuLinks struct {
	remotes  []string // normalised remote bus id of each enabled link
	switches int      // enabled links to an NVSwitch (asked only by master's rule)
}

type topoGPU struct {
	dev   nvml.Device
	busID string
	links *gpuLinks // nil until asked
}

// PairScores computes HAMi's topology scores between devices (the GPUs to publish, in the
// order of the register annotation), for the score annotation hami.io/node-nvidia-score
// ([annotation.EncodePairScores]). It makes HAMi's NVML calls: the GPUs are listed by index
// (named "DGX Display" ones skipped), then for every ordered pair the PCIe common ancestor
// (INTERNAL 60, SINGLE 50, MULTIPLE 40, HOSTBRIDGE 30, NODE 20, SYSTEM 10) and the first GPU's
// NVLinks 0-17 (state and remote PCI bus id; NOT_SUPPORTED and INVALID_ARGUMENT skip a link).
// A pair scores its level plus 100 per NVLink whose remote end is the peer; with
// Options.TopologyVersion master (the default) a pair without direct NVLinks whose GPUs both
// have NVLinks to NVSwitches adds 100 × the smaller of the two switch-link counts (HAMi PR
// #2103; v2.9.0 scores HGX/DGX NVSwitch systems from PCIe alone). Scores keep the direction
// NVML answers give.
//
// Two GPUs that see different numbers of links to each other score 0 both ways and are
// reported in warnings as an [*AsymmetricLinkError] (HAMi master's rule, which this SDK
// applies to v2.9.0 too, where HAMi panics). err is a [*TopologyError] when a query fails
// (or [ErrUnknownDevice], [ErrClosed], the context's cause): no scores are returned then, and
// a node program still publishes its register annotation (HAMi writes neither).
func (s *Scanner) PairScores(ctx context.Context, devices []annotation.Device) (scores []annotation.PairScore, warnings []error, err error) {
	s.scanMu.Lock()
	defer s.scanMu.Unlock()
	if s.isClosed() {
		return nil, nil, fmt.Errorf("score topology: %w", ErrClosed)
	}
	logger := klog.FromContext(ctx)
	byUUID, err := s.topologyGPUs()
	if err != nil {
		return nil, nil, err
	}
	gpus := make([]*topoGPU, len(devices))
	for i, d := range devices {
		g, ok := byUUID[d.ID]
		if !ok {
			return nil, nil, fmt.Errorf("score topology: %w: %s", ErrUnknownDevice, d.ID)
		}
		gpus[i] = g
	}
	master := s.cfg.topologyVersion == annotation.VersionMaster
	type pair struct{ score, links int }
	pairs := make([][]pair, len(gpus))
	for i, a := range gpus {
		if ctx.Err() != nil {
			return nil, nil, fmt.Errorf("score topology: %w", context.Cause(ctx))
		}
		pairs[i] = make([]pair, len(gpus))
		for j, b := range gpus {
			if i == j {
				continue
			}
			level, ret := a.dev.GetTopologyCommonAncestor(b.dev)
			if ret != nvml.SUCCESS {
				return nil, nil, &TopologyError{A: i, B: j, Op: "get topology common ancestor", Err: ret}
			}
			score, ok := levelScore(level)
			if !ok {
				return nil, nil, &TopologyError{A: i, B: j, Op: "get topology common ancestor", Err: fmt.Errorf("unknown topology level %d", level)}
			}
			al, err := s.linksOf(a, master)
			if err != nil {
				return nil, nil, &TopologyError{A: i, B: j, Op: err.op, Err: err.err}
			}
			n := 0
			for _, r := range al.remotes {
				if r == b.busID {
					n++
				}
			}
			if master && n == 0 && len(al.remotes) > 0 && al.switches > 0 {
				bl, err := s.linksOf(b, master)
				if err != nil {
					return nil, nil, &TopologyError{A: j, B: i, Op: err.op, Err: err.err}
				}
				if bl.switches > 0 {
					n = min(al.switches, bl.switches)
				}
			}
			pairs[i][j] = pair{score: score + ScoreNvLink*n, links: 1 + n}
		}
	}
	for i := range gpus {
		for j := i + 1; j < len(gpus); j++ {
			if pairs[i][j].links != pairs[j][i].links {
				w := &AsymmetricLinkError{A: devices[i].ID, B: devices[j].ID, AB: pairs[i][j].links, BA: pairs[j][i].links}
				logger.Error(w, "Asymmetric GPU P2P link, scoring the pair 0", "gpuUUID", w.A, "peerUUID", w.B)
				warnings = append(warnings, w)
				pairs[i][j].score, pairs[j][i].score = 0, 0
			}
		}
	}
	scores = make([]annotation.PairScore, len(devices))
	for i, d := range devices {
		m := make(map[string]int, len(devices)-1)
		for j, peer := range devices {
			if i != j {
				m[peer.ID] = pairs[i][j].score
			}
		}
		scores[i] = annotation.PairScore{UUID: d.ID, Scores: m}
	}
	logger.V(4).Info("Computed topology scores", "devices", len(devices), "warnings", len(warnings))
	return scores, warnings, nil
}

// topologyGPUs lists the GPUs as HAMi's go-nvlib does, by UUID, with their bus ids.
func (s *Scanner) topologyGPUs() (map[string]*topoGPU, error) {
	n, ret := s.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, &TopologyError{A: -1, B: -1, Op: "count devices", Err: ret}
	}
	out := make(map[string]*topoGPU, n)
	for i := range n {
		dev, ret := s.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, &TopologyError{A: i, B: -1, Op: "get device handle", Err: ret}
		}
		name, ret := dev.GetName()
		if ret != nvml.SUCCESS {
			return nil, &TopologyError{A: i, B: -1, Op: "get device name", Err: ret}
		}
		if name == "DGX Display" || name == "NVIDIA DGX Display" {
			continue
		}
		uuid, ret := dev.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, &TopologyError{A: i, B: -1, Op: "get device uuid", Err: ret}
		}
		pci, ret := dev.GetPciInfo()
		if ret != nvml.SUCCESS {
			return nil, &TopologyError{A: i, B: -1, Op: "get pci info", Err: ret}
		}
		out[uuid] = &topoGPU{dev: dev, busID: topoBusID(busIDString(pci.BusId))}
	}
	return out, nil
}

type linkError struct {
	op  string
	err error
}

// linksOf asks a GPU's NVLinks once per PairScores call.
func (s *Scanner) linksOf(g *topoGPU, master bool) (*gpuLinks, *linkError) {
	if g.links != nil {
		return g.links, nil
	}
	l := &gpuLinks{}
	for link := range maxNvLinks {
		state, ret := g.dev.GetNvLinkState(link)
		if skipLink(ret) {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, &linkError{op: fmt.Sprintf("get nvlink state of link %d", link), err: ret}
		}
		if state != nvml.FEATURE_ENABLED {
			continue
		}
		pci, ret := g.dev.GetNvLinkRemotePciInfo(link)
		if skipLink(ret) {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, &linkError{op: fmt.Sprintf("get nvlink remote pci info of link %d", link), err: ret}
		}
		l.remotes = append(l.remotes, topoBusID(busIDString(pci.BusId)))
		if !master {
			continue
		}
		typ, ret := g.dev.GetNvLinkRemoteDeviceType(link)
		if skipLink(ret) {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, &linkError{op: fmt.Sprintf("get nvlink remote device type of link %d", link), err: ret}
		}
		if typ == nvml.NVLINK_DEVICE_TYPE_SWITCH {
			l.switches++
		}
	}
	g.links = l
	return l, nil
}

func skipLink(ret nvml.Return) bool {
	return ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT
}

// topoBusID compares bus ids as HAMi does: lower case, an 8-digit domain cut to 4.
func topoBusID(id string) string {
	id = strings.ToLower(id)
	if len(id) == len("00000000:00:00.0") && strings.HasPrefix(id, "0000") {
		id = id[4:]
	}
	return id
}

func levelScore(l nvml.GpuTopologyLevel) (int, bool) {
	switch l {
	case nvml.TOPOLOGY_INTERNAL:
		return ScoreInternal, true
	case nvml.TOPOLOGY_SINGLE:
		return ScoreSingle, true
	case nvml.TOPOLOGY_MULTIPLE:
		return ScoreMultiple, true
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return ScoreHostBridge, true
	case nvml.TOPOLOGY_NODE:
		return ScoreNode, true
	case nvml.TOPOLOGY_SYSTEM:
		return ScoreSystem, true
	default:
		return 0, false
	}
}
