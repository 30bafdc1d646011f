package nvmlscan_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/internal/vectors"
	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlsim"
)

type scoreGPU struct {
	BusID   string `json:"bus_id"`
	Name    string `json:"name"`
	UUID    string `json:"uuid"`
	NvLinks []struct {
		Link        int    `json:"link"`
		RemoteBusID string `json:"remote_bus_id"`
		RemoteType  string `json:"remote_type"`
		State       string `json:"state"`
	} `json:"nvlinks"`
}

type scoreInput struct {
	Available []string   `json:"available"`
	GPUs      []scoreGPU `json:"gpus"`
	Levels    [][]string `json:"topology_levels"`
}

type scoreFile struct {
	Vectors []struct {
		Name           string     `json:"name"`
		Input          scoreInput `json:"input"`
		WantAnnotation string     `json:"want_annotation"`
		WantError      string     `json:"want_error"`
		WantPanic      string     `json:"want_panic"`
		WantAsymmetric *bool      `json:"want_asymmetric"`
	} `json:"node_score_vectors"`
}

func pciInfo(busID string) nvml.PciInfo {
	var p nvml.PciInfo
	for i, c := range busID {
		p.BusId[i] = int8(c)
	}
	return p
}

var levels = map[string]nvml.GpuTopologyLevel{"INTERNAL": nvml.TOPOLOGY_INTERNAL, "SINGLE": nvml.TOPOLOGY_SINGLE,
	"MULTIPLE": nvml.TOPOLOGY_MULTIPLE, "HOSTBRIDGE": nvml.TOPOLOGY_HOSTBRIDGE, "NODE": nvml.TOPOLOGY_NODE, "SYSTEM": nvml.TOPOLOGY_SYSTEM}

var returns = map[string]nvml.Return{"ERROR_UNKNOWN": nvml.ERROR_UNKNOWN, "ERROR_NOT_SUPPORTED": nvml.ERROR_NOT_SUPPORTED,
	"ERROR_INVALID_ARGUMENT": nvml.ERROR_INVALID_ARGUMENT, "ERROR_GPU_IS_LOST": nvml.ERROR_GPU_IS_LOST}

// mockNVML answers HAMi's topology calls from a vector's input, as the vectors' harness did.
func mockNVML(t *testing.T, in scoreInput) *mock.Interface {
	t.Helper()
	devs := make([]*mock.Device, len(in.GPUs))
	for i := range in.GPUs {
		devs[i] = &mock.Device{}
	}
	for i, g := range in.GPUs {
		d := devs[i]
		d.GetNameFunc = func() (string, nvml.Return) { return g.Name, nvml.SUCCESS }
		d.GetUUIDFunc = func() (string, nvml.Return) { return g.UUID, nvml.SUCCESS }
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return pciInfo(g.BusID), nvml.SUCCESS }
		d.GetTopologyCommonAncestorFunc = func(peer nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			for j := range devs {
				if devs[j] == peer {
					l, ok := levels[in.Levels[i][j]]
					if !ok {
						t.Errorf("gpu %d: level %q to %d", i, in.Levels[i][j], j)
					}
					return l, nvml.SUCCESS
				}
			}
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		link := func(n int) (int, bool) {
			for k, l := range g.NvLinks {
				if l.Link == n {
					return k, true
				}
			}
			return 0, false
		}
		d.GetNvLinkStateFunc = func(n int) (nvml.EnableState, nvml.Return) {
			k, ok := link(n)
			if !ok {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			switch s := g.NvLinks[k].State; s {
			case "enabled":
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			case "disabled":
				return nvml.FEATURE_DISABLED, nvml.SUCCESS
			default:
				r, ok := returns[s]
				if !ok {
					t.Fatalf("state %q", s)
				}
				return 0, r
			}
		}
		d.GetNvLinkRemotePciInfoFunc = func(n int) (nvml.PciInfo, nvml.Return) {
			k, ok := link(n)
			if !ok {
				return nvml.PciInfo{}, nvml.ERROR_NOT_SUPPORTED
			}
			return pciInfo(g.NvLinks[k].RemoteBusID), nvml.SUCCESS
		}
		d.GetNvLinkRemoteDeviceTypeFunc = func(n int) (nvml.IntNvLinkDeviceType, nvml.Return) {
			k, ok := link(n)
			if !ok {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			if g.NvLinks[k].RemoteType == "switch" {
				return nvml.NVLINK_DEVICE_TYPE_SWITCH, nvml.SUCCESS
			}
			return nvml.NVLINK_DEVICE_TYPE_GPU, nvml.SUCCESS
		}
	}
	return &mock.Interface{
		InitFunc:           func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(devs), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(devs) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return devs[i], nvml.SUCCESS
		},
	}
}

// TestConformancePairScores computes the scores of topology.json's node_score_vectors with
// each version's rules from the same NVML answers and encodes them: byte for byte HAMi's
// annotation where HAMi writes one. Where HAMi fails, the SDK's rule is asserted: an NVML error
// is a classified *TopologyError (errors.Is the nvml.Return) and gives no scores; where v2.9.0
// panics on one-sided NVLinks, the pair scores 0 both ways with an AsymmetricLinkError
// warning, as in HAMi master (whose annotation for the vector is then the expected one).
func TestConformancePairScores(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		checked := 0
		var f scoreFile
		if !folder.Read(t, "topology.json", &f) {
			continue
		}
		version := vectors.Pick(folder, annotation.VersionMaster, annotation.VersionV290)
		for _, v := range f.Vectors {
			checked++
			t.Run(folder.Name()+"/"+v.Name, func(t *testing.T) {
				t.Parallel()
				ctx := testContext(t)
				s, err := nvmlscan.New(mockNVML(t, v.Input), nvmlscan.Options{TopologyVersion: version})
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = s.Close() }()
				devs := make([]annotation.Device, len(v.Input.Available))
				for i, id := range v.Input.Available {
					devs[i] = annotation.Device{ID: id}
				}
				scores, warnings, err := s.PairScores(ctx, devs)
				switch {
				case v.WantError != "":
					if !errors.Is(err, nvmlscan.ErrTopology) || !errors.Is(err, nvml.ERROR_UNKNOWN) || scores != nil {
						t.Fatalf("err %v, scores %v; want a topology error (HAMi: %s) and no scores", err, scores, v.WantError)
					}
					if !strings.HasPrefix(err.Error(), "error getting topology for devices (0, 1): get nvlink state of link 1") {
						t.Errorf("error text %q", err)
					}
					return
				case err != nil:
					t.Fatal(err)
				}
				want := v.WantAnnotation
				if v.WantPanic != "" {
					// The rule: every asymmetric pair scores 0 both ways, with a warning.
					if len(warnings) != 1 || !errors.Is(warnings[0], nvmlscan.ErrAsymmetricLink) {
						t.Fatalf("warnings %v, want one ErrAsymmetricLink (HAMi v2.9.0 panics: %s)", warnings, v.WantPanic)
					}
					for _, sc := range scores {
						for peer, n := range sc.Scores {
							if n != 0 {
								t.Errorf("%s → %s scores %d, want 0", sc.UUID, peer, n)
							}
						}
					}
					want = annotation.EncodePairScores(scores)
				}
				if got := annotation.EncodePairScores(scores); got != want {
					t.Errorf("annotation\n got %s\nwant %s", got, want)
				}
				if v.WantAsymmetric != nil && *v.WantAsymmetric != (len(warnings) > 0) {
					t.Errorf("warnings %v, HAMi asymmetric = %v", warnings, *v.WantAsymmetric)
				}
			})
		}
		t.Logf("checked %d vectors from %s (topology.json node_score_vectors)", checked, folder.Dir)
	}
}

func TestPairScoresErrors(t *testing.T) {
	t.Parallel()
	in := scoreInput{Available: []string{"GPU-a"}, Levels: [][]string{{""}}}
	in.GPUs = append(in.GPUs, scoreGPU{BusID: "00000000:07:00.0", Name: "NVIDIA A10", UUID: "GPU-a"})
	ctx := testContext(t)
	s, err := nvmlscan.New(mockNVML(t, in), nvmlscan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = s.PairScores(ctx, []annotation.Device{{ID: "GPU-missing"}})
	if !errors.Is(err, nvmlscan.ErrUnknownDevice) {
		t.Errorf("unknown device: %v", err)
	}
	scores, _, err := s.PairScores(ctx, nil)
	if err != nil || len(scores) != 0 {
		t.Errorf("no devices: %v %v", scores, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.PairScores(ctx, nil); !errors.Is(err, nvmlscan.ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
	if _, err := nvmlscan.New(mockNVML(t, in), nvmlscan.Options{TopologyVersion: 7}); !errors.Is(err, nvmlscan.ErrInvalidOptions) {
		t.Errorf("bad version: %v", err)
	}
}

// TestSimulatedTopology scores nvmlsim's simulated interconnects: the NVSwitch DGX (PCIe
// levels only with v2.9.0's rules, + 18 NVSwitch links with master's) and the DGX-1V hybrid
// cube mesh, whose scores are those of the vector dgx1_v100_hybrid_cube_mesh.
func TestSimulatedTopology(t *testing.T) {
	t.Parallel()
	mesh := [8][8]int{
		{0, 150, 120, 220, 210, 10, 10, 10}, {150, 0, 220, 120, 10, 210, 10, 10},
		{120, 220, 0, 250, 10, 10, 110, 10}, {220, 120, 250, 0, 10, 10, 10, 110},
		{210, 10, 10, 10, 0, 150, 120, 220}, {10, 210, 10, 10, 150, 0, 220, 120},
		{10, 10, 110, 10, 120, 220, 0, 250}, {10, 10, 10, 110, 220, 120, 250, 0},
	}
	pcie := func(extra int) (m [8][8]int) {
		for i := range 8 {
			for j := range 8 {
				switch {
				case i == j:
				case i/2 == j/2:
					m[i][j] = 40 + extra
				case i/4 == j/4:
					m[i][j] = 20 + extra
				default:
					m[i][j] = 10 + extra
				}
			}
		}
		return m
	}
	tests := map[string]struct {
		server   string
		topology nvmlsim.Topology
		version  annotation.Version
		want     [8][8]int
	}{
		"dgxh100 nvswitch, master": {server: "dgxh100", version: annotation.VersionMaster, want: pcie(1800)},
		"dgxa100 nvswitch, master": {server: "dgxa100", version: annotation.VersionMaster, want: pcie(1200)},
		"dgxh100 nvswitch, v2.9.0": {server: "dgxh100", version: annotation.VersionV290, want: pcie(0)},
		"pcie":                     {server: "dgxh200", topology: nvmlsim.TopologyPCIe, want: pcie(0)},
		"hybrid cube mesh, master": {server: "dgxh100", topology: nvmlsim.TopologyHybridCubeMesh, want: mesh},
		"hybrid cube mesh, v2.9.0": {server: "dgxb200", topology: nvmlsim.TopologyHybridCubeMesh, version: annotation.VersionV290, want: mesh},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			n, err := nvmlsim.New(tc.server)
			if err != nil {
				t.Fatal(err)
			}
			if tc.topology != "" {
				if err := n.SetTopology(tc.topology); err != nil {
					t.Fatal(err)
				}
			}
			s, err := nvmlscan.New(n.Server, nvmlscan.Options{Sysfs: n.Sysfs, TopologyVersion: tc.version, Health: nvmlscan.HealthOptions{Disabled: true}})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.Close() }()
			res, err := s.Scan(ctx)
			if err != nil {
				t.Fatal(err)
			}
			scores, warnings, err := s.PairScores(ctx, res.Devices)
			if err != nil || len(warnings) != 0 {
				t.Fatalf("PairScores: %v, warnings %v", err, warnings)
			}
			for i, sc := range scores {
				for j := range 8 {
					if got := sc.Scores[n.UUID(j)]; i != j && got != tc.want[i][j] {
						t.Errorf("GPU %d → %d: %d, want %d", i, j, got, tc.want[i][j])
					}
				}
			}
		})
	}
	n, err := nvmlsim.New("dgxh100")
	if err != nil {
		t.Fatal(err)
	}
	if err := n.SetTopology("torus"); !errors.Is(err, nvmlsim.ErrUnknownTopology) || n.Topology() != nvmlsim.TopologyNVSwitch {
		t.Errorf("SetTopology(torus) = %v", err)
	}
}
