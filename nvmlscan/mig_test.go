package nvmlscan_test

import (
	"errors"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nvmlscan"
)

func placements(size uint32, starts ...uint32) []annotation.MigPlacement {
	out := make([]annotation.MigPlacement, len(starts))
	for i, s := range starts {
		out[i] = annotation.MigPlacement{Start: s, Size: size}
	}
	return out
}

// TestScanMIGDiscovery scans an A100-40GB (the NVML of mig-register.json) in MIG mode with the
// two profile discovery rules and an allowlist naming REV profiles.
func TestScanMIGDiscovery(t *testing.T) {
	t.Parallel()
	allow, err := mig.ParseAllowlist([]byte(`[{"models": ["A100-SXM4-40GB"], "profiles": ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "7g.79gb"]}]`))
	if err != nil {
		t.Fatal(err)
	}
	base1g := annotation.MigProfile{Name: "1g.5gb", MemoryMB: 4864, Core: 15, SliceCount: 1, Placements: placements(1, 0, 1, 2, 3, 4, 5, 6)}
	twoG := annotation.MigProfile{Name: "2g.10gb", MemoryMB: 9856, Core: 29, SliceCount: 2, Placements: placements(2, 0, 2, 4)}
	with := func(p annotation.MigProfile, name string) annotation.MigProfile { p.Name = name; return p }
	tests := map[string]struct {
		discovery nvmlscan.MIGDiscovery
		want      []annotation.MigProfile
	}{
		"base slices (HAMi: REV names collapse, 7g.79gb has the 7g profile)": {
			discovery: nvmlscan.MIGDiscoveryBaseSlices,
			want: []annotation.MigProfile{base1g, with(base1g, "1g.5gb+me"), with(base1g, "1g.10gb"), twoG,
				{Name: "7g.79gb", MemoryMB: 40192, Core: 100, SliceCount: 7, Placements: placements(8, 0)}},
		},
		"all profiles (REV profiles with their own memory and placements, 7g.79gb exists nowhere)": {
			discovery: nvmlscan.MIGDiscoveryAllProfiles,
			want: []annotation.MigProfile{base1g, with(base1g, "1g.5gb+me"),
				{Name: "1g.10gb", MemoryMB: 9856, Core: 15, SliceCount: 1, Placements: placements(2, 0, 2, 4, 6)}, twoG},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			lib := migNode(t, []string{"A100-SXM4-40GB"}, []int{1})
			s := migScanner(t, lib, nvmlscan.Options{MIGAllowlist: allow, MIGProfileDiscovery: tc.discovery})
			res := scan(testContext(t), t, s)
			if len(res.Devices) != 1 || len(res.Failed) != 0 {
				t.Fatalf("devices %v, failed %v", res.Devices, res.Failed)
			}
			d := res.Devices[0]
			if d.Count != 7 || d.Devmem != 40960 || d.Devcore != 100 || d.Mode != nvmlscan.ModeMIG {
				t.Errorf("count %d devmem %d devcore %d mode %q; want 7 40960 100 mig", d.Count, d.Devmem, d.Devcore, d.Mode)
			}
			if diff := cmp.Diff(tc.want, d.MIGProfiles); diff != "" {
				t.Errorf("profiles (-want +got):\n%s", diff)
			}
		})
	}
}

// TestScanMIGDefaults: with the SDK's defaults (mig.DefaultAllowlist, word-bounded match) the
// real NVML names HAMi's chart misses register with their own profiles, where HAMi gives an
// H200 the H20 profiles and drops an A100 80GB PCIe.
func TestScanMIGDefaults(t *testing.T) {
	t.Parallel()
	lib := migNode(t, []string{"H200", "A100-80GB-PCIe"}, []int{1, 1})
	s, err := nvmlscan.New(lib, nvmlscan.Options{Mode: nvmlscan.ModeMIG, Health: nvmlscan.HealthOptions{Disabled: true}, Sysfs: fstest.MapFS{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	res := scan(testContext(t), t, s)
	var got [][]string
	for _, d := range res.Devices {
		var names []string
		for _, p := range d.MIGProfiles {
			names = append(names, p.Name)
		}
		got = append(got, names)
	}
	want := [][]string{{"1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"}, {"1g.10gb", "2g.20gb", "3g.40gb", "7g.79gb"}}
	if diff := cmp.Diff(want, got); diff != "" || len(res.Failed) != 0 {
		t.Errorf("profiles (-want +got):\n%s\nfailed: %v", diff, res.Failed)
	}
}

// TestScanMIGNoProfile: a MIG GPU without profiles is reported with the fix, not dropped
// silently.
func TestScanMIGNoProfile(t *testing.T) {
	t.Parallel()
	lib := migNode(t, []string{"A100-80GB-PCIe", "A10"}, []int{1, 0})
	s := migScanner(t, lib, nvmlscan.Options{MIGModelMatch: mig.MatchSubstring})
	res := scan(testContext(t), t, s)
	if len(res.Devices) != 0 || len(res.Failed) != 2 {
		t.Fatalf("devices %v, failed %v; want none and 2", res.Devices, res.Failed)
	}
	for i, text := range []string{`no MIG allowlist entry matches the NVML name "NVIDIA A100 80GB PCIe"`, `NVIDIA A10`} {
		e := res.Failed[i]
		if e.Op != nvmlscan.OpMIGProfiles || !errors.Is(e, nvmlscan.ErrNoMIGProfile) || !strings.Contains(e.Error(), text) ||
			!strings.Contains(e.Error(), "migProfileAllowlist") {
			t.Errorf("failed[%d] = %v; want %s, ErrNoMIGProfile, naming %q and the allowlist", i, e, nvmlscan.OpMIGProfiles, text)
		}
	}
	if err := res.Err(); !errors.Is(err, nvmlscan.ErrNoMIGProfile) {
		t.Errorf("Err() = %v", err)
	}
}

// TestScanMIGV290 publishes v2.9.0's MIG devices: mode "mig", count = split count, no
// profiles, and no MIG query.
func TestScanMIGV290(t *testing.T) {
	t.Parallel()
	lib := migNode(t, []string{"A100-SXM4-40GB"}, []int{1})
	lib.gpus[0].dev.GetGpuInstanceProfileInfoFunc = func(int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
		t.Error("v2.9.0 shape queried a MIG profile")
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_UNKNOWN
	}
	s := migScanner(t, lib, nvmlscan.Options{MIGVersion: annotation.VersionV290, SplitCount: 4})
	res := scan(testContext(t), t, s)
	want := []annotation.Device{{ID: gpu0, Count: 4, Devmem: 40960, Devcore: 100, Type: "NVIDIA A100-SXM4-40GB", Mode: "mig", Health: true}}
	if diff := cmp.Diff(want, res.Devices); diff != "" {
		t.Errorf("devices (-want +got):\n%s", diff)
	}
}

func TestMIGOptionsInvalid(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		opts    nvmlscan.Options
		wantErr error
	}{
		"allowlist entry without models": {nvmlscan.Options{MIGAllowlist: mig.Allowlist{{Profiles: []string{"1g.5gb"}}}}, mig.ErrInvalidAllowlist},
		"allowlist profile not <N>g.":    {nvmlscan.Options{MIGAllowlist: mig.Allowlist{{Models: []string{"A100"}, Profiles: []string{"5gb"}}}}, mig.ErrInvalidAllowlist},
		"model match rule":               {nvmlscan.Options{MIGModelMatch: 7}, nvmlscan.ErrInvalidOptions},
		"profile discovery":              {nvmlscan.Options{MIGProfileDiscovery: 7}, nvmlscan.ErrInvalidOptions},
		"MIG version":                    {nvmlscan.Options{MIGVersion: 7}, nvmlscan.ErrInvalidOptions},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			lib := migNode(t, []string{"A100-SXM4-40GB"}, []int{1})
			_, err := nvmlscan.New(lib, tc.opts)
			if !errors.Is(err, nvmlscan.ErrInvalidOptions) || !errors.Is(err, tc.wantErr) {
				t.Errorf("New: %v, want ErrInvalidOptions and %v", err, tc.wantErr)
			}
			if inits, _, _ := lib.counts(); inits != 0 {
				t.Errorf("nvml initialised %d times for invalid options", inits)
			}
		})
	}
}

// TestScanMIGMatchWarnings: the word-bounded match says at V(2) when HAMi's substring rule
// would give the GPU another entry's profiles, and when several entries match.
func TestScanMIGMatchWarnings(t *testing.T) {
	t.Parallel()
	allow, err := mig.ParseAllowlist([]byte(`[{"models": ["H20"], "profiles": ["1g.12gb"]}, {"models": ["H200"], "profiles": ["1g.18gb"]}, {"models": ["NVIDIA H200"], "profiles": ["7g.141gb"]}]`))
	if err != nil {
		t.Fatal(err)
	}
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true), ktesting.Verbosity(2)))
	ctx := klog.NewContext(t.Context(), logger)
	lib := migNode(t, []string{"H200"}, []int{1})
	s := migScanner(t, lib, nvmlscan.Options{MIGAllowlist: allow})
	res := scan(ctx, t, s)
	if len(res.Devices) != 1 || len(res.Devices[0].MIGProfiles) != 1 || res.Devices[0].MIGProfiles[0].Name != "1g.18gb" {
		t.Fatalf("devices %+v", res.Devices)
	}
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	for _, want := range []string{
		`Several MIG allowlist entries match the GPU, the first one is used gpuUUID="` + gpu0 + `" name="NVIDIA H200" entry=1 others=[2]`,
		`HAMi's substring model match would use another MIG allowlist entry for this GPU gpuUUID="` + gpu0 + `" name="NVIDIA H200" entry=1 hamiEntry=0`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s:\n%s", want, logs)
		}
	}
}
