package nvmlscan_test

import (
	"errors"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"

	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/nvmlscan"
)

var _ nodeagent.MIGInstances = (*nvmlscan.MIGManager)(nil)

const (
	gpu0 = "GPU-0a1b2c3d-0000-1111-2222-333344445555"
	gpu1 = "GPU-1a1b2c3d-0000-1111-2222-333344445555"
)

// migNode is a fake node of the given models and MIG modes (current = pending unless
// pending is given), with the given existing instances on GPU 0.
func migNode(t *testing.T, models []string, modes []int, existing ...vecInstance) *fakeNVML {
	t.Helper()
	all := loadModels(t)
	in := vecNVML{Models: all}
	for i, m := range models {
		uuid := gpu0
		if i == 1 {
			uuid = gpu1
		}
		d := vecDevice{Index: i, Model: m, UUID: uuid, MigModeCurrent: modes[i], MigModePending: modes[i]}
		if i == 0 {
			d.Existing = existing
		}
		in.Devices = append(in.Devices, d)
	}
	return newFakeNVML(t, in)
}

// migScanner is a MIG-mode scanner over lib, closed at the end of the test.
func migScanner(t *testing.T, lib nvml.Interface, opts nvmlscan.Options) *nvmlscan.Scanner {
	t.Helper()
	opts.Mode = nvmlscan.ModeMIG
	opts.Sysfs = fstest.MapFS{}
	opts.Health.Disabled = true
	if opts.MIGAllowlist == nil {
		opts.MIGAllowlist = mig.ChartAllowlist()
	}
	s, err := nvmlscan.New(lib, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// inst is a MIG device on GPU 0 (the compute instance is always 0: one per GPU instance).
func inst(profile string, id uint32, start, size uint32, gi uint32, migUUID string) mig.Instance {
	return mig.Instance{GPUUUID: gpu0, Profile: profile, ProfileID: id, Placement: mig.Placement{Start: start, Size: size},
		Runtime: mig.Runtime{MigUUID: migUUID, GPUInstanceID: gi}}
}

const (
	migUUID1 = "MIG-5a5a0000-0001-0000-1111-abcdef000001"
	migUUID2 = "MIG-5a5a0000-0002-0000-1111-abcdef000002"
	migUUID3 = "MIG-5a5a0000-0003-0000-1111-abcdef000003"
)

// TestMIGManagerCreate realises reservations on an A100-40GB as mig-allocate.json's vectors
// do, and refuses what HAMi refuses, with the SDK's classified errors.
func TestMIGManagerCreate(t *testing.T) {
	t.Parallel()
	taken := vecInstance{GPUInstanceID: 3, ComputeInstanceID: 0, MigUUID: migUUID3, Placement: mig.Placement{Start: 0, Size: 2}, Profile: nvml.GPU_INSTANCE_PROFILE_2_SLICE}
	rev, err := mig.ParseAllowlist([]byte(`[{"models": ["A100-SXM4-40GB"], "profiles": ["1g.5gb", "1g.10gb", "2g.10gb"]}]`))
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		models    []string
		modes     []int
		pending   int // GPU 0's pending mode when not -1
		existing  []vecInstance
		opts      nvmlscan.Options
		gpu       string
		profile   string
		placement mig.Placement
		want      mig.Instance
		wantErr   error
		errText   string
		wantLive  []mig.Instance
	}{
		"2g at 0 (single_2g_on_idle_mig_gpu)": {
			profile: "2g.10gb", placement: mig.Placement{Start: 0, Size: 2},
			want: inst("2g.10gb", 14, 0, 2, 1, migUUID1),
		},
		"1g at 6 (single_1g_at_highest_placement)": {
			profile: "1g.5gb", placement: mig.Placement{Start: 6, Size: 1},
			want: inst("1g.5gb", 19, 6, 1, 1, migUUID1),
		},
		"MIG off is switched on (mig_mode_disabled_is_enabled_on_allocate)": {
			modes: []int{0}, profile: "2g.10gb", placement: mig.Placement{Start: 0, Size: 2},
			want: inst("2g.10gb", 14, 0, 2, 1, migUUID1),
		},
		"mode change pending (mig_mode_enable_pending_fails)": {
			modes: []int{0}, pending: 1, profile: "2g.10gb", placement: mig.Placement{Start: 0, Size: 2},
			wantErr: nvmlscan.ErrMIGModePending, errText: "a GPU reset is outstanding",
		},
		"placement taken (placement_taken_by_untracked_instance)": {
			existing: []vecInstance{taken}, profile: "1g.5gb", placement: mig.Placement{Start: 1, Size: 1},
			wantErr: nvmlscan.ErrPlacementTaken, errText: "2g.10gb at 0+2 (MIG device " + migUUID3,
			wantLive: []mig.Instance{inst("", 14, 0, 2, 3, migUUID3)},
		},
		"placement not possible (reserved_placement_not_possible_for_profile)": {
			profile: "2g.10gb", placement: mig.Placement{Start: 1, Size: 2}, wantErr: nvmlscan.ErrPlacementNotPossible,
		},
		"REV name realised as the base profile published (rev_profile_name_realized_as_base_profile)": {
			opts: nvmlscan.Options{MIGAllowlist: rev}, profile: "1g.10gb", placement: mig.Placement{Start: 6, Size: 1},
			want: inst("1g.10gb", 19, 6, 1, 1, migUUID1),
		},
		"REV name realised as its own profile with all-profile discovery": {
			opts: nvmlscan.Options{MIGAllowlist: rev, MIGProfileDiscovery: nvmlscan.MIGDiscoveryAllProfiles}, profile: "1g.10gb",
			placement: mig.Placement{Start: 6, Size: 2}, want: inst("1g.10gb", 15, 6, 2, 1, migUUID1),
		},
		"REV placement of the base profile refused with all-profile discovery": {
			opts: nvmlscan.Options{MIGAllowlist: rev, MIGProfileDiscovery: nvmlscan.MIGDiscoveryAllProfiles}, profile: "1g.10gb",
			placement: mig.Placement{Start: 5, Size: 1}, wantErr: nvmlscan.ErrPlacementNotPossible,
		},
		"profile not published": {
			profile: "4g.20gb", placement: mig.Placement{Start: 0, Size: 4}, wantErr: nvmlscan.ErrUnknownProfile,
		},
		"unknown GPU": {
			gpu: "GPU-deadbeef-0000-1111-2222-333344445555", profile: "1g.5gb", placement: mig.Placement{Start: 6, Size: 1},
			wantErr: nvmlscan.ErrUnknownGPU,
		},
		"GPU without MIG": {
			models: []string{"A10"}, profile: "1g.5gb", placement: mig.Placement{Start: 6, Size: 1},
			wantErr: nvmlscan.ErrMIGNotSupported,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			models := tc.models
			if models == nil {
				models = []string{"A100-SXM4-40GB"}
			}
			modes := tc.modes
			if modes == nil {
				modes = []int{1}
			}
			lib := migNode(t, models, modes, tc.existing...)
			if tc.pending != 0 {
				lib.gpus[0].pending = tc.pending
			}
			m := migScanner(t, lib, tc.opts).MIG()
			gpu := tc.gpu
			if gpu == "" {
				gpu = gpu0
			}
			got, err := m.Create(testContext(t), gpu, tc.profile, tc.placement)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("Create: %v, want %v containing %q", err, tc.wantErr, tc.errText)
				}
				if diff := cmp.Diff(tc.wantLive, lib.live(0)); diff != "" {
					t.Errorf("instances left (-want +got):\n%s", diff)
				}
				return
			}
			if err != nil {
				t.Fatalf("Create: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("instance (-want +got):\n%s", diff)
			}
			want := tc.want
			want.Profile = ""
			if diff := cmp.Diff([]mig.Instance{want}, lib.live(0)); diff != "" {
				t.Errorf("NVML's instances (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMIGManagerCreateCleansUp destroys the GPU and compute instances it created when a later
// step fails.
func TestMIGManagerCreateCleansUp(t *testing.T) {
	t.Parallel()
	lib := migNode(t, []string{"A100-SXM4-40GB"}, []int{1})
	lib.gpus[0].dev.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	m := migScanner(t, lib, nvmlscan.Options{}).MIG()
	if _, err := m.Create(testContext(t), gpu0, "3g.20gb", mig.Placement{Start: 4, Size: 4}); !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Fatalf("Create: %v, want ERROR_UNKNOWN", err)
	}
	if live := lib.live(0); len(live) != 0 {
		t.Errorf("instances left behind: %v", live)
	}
}

// TestMIGManagerLifecycle lists, creates and destroys instances on two GPUs, one with an
// instance nobody tracked, and keeps NVML's Init and Shutdown balanced.
func TestMIGManagerLifecycle(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	lib := migNode(t, []string{"A100-SXM4-40GB", "A10"}, []int{1, 0},
		vecInstance{GPUInstanceID: 3, MigUUID: migUUID3, Placement: mig.Placement{Start: 0, Size: 2}, Profile: nvml.GPU_INSTANCE_PROFILE_2_SLICE})
	s := migScanner(t, lib, nvmlscan.Options{})
	m := s.MIG()
	a, err := m.Create(ctx, gpu0, "1g.5gb", mig.Placement{Start: 6, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create(ctx, gpu0, "3g.20gb", mig.Placement{Start: 2, Size: 4})
	if !errors.Is(err, nvmlscan.ErrPlacementNotPossible) {
		t.Fatalf("3g.20gb at 2: %v, %v", b, err)
	}
	if _, err := m.Create(ctx, gpu0, "2g.10gb", mig.Placement{Start: 0, Size: 2}); !errors.Is(err, nvmlscan.ErrPlacementTaken) {
		t.Fatalf("2g.10gb over an untracked instance: %v", err)
	}
	b, err = m.Create(ctx, gpu0, "2g.10gb", mig.Placement{Start: 2, Size: 2})
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.Instances(ctx)
	if err != nil {
		t.Fatal(err)
	}
	untracked := inst("2g.10gb", 14, 0, 2, 3, migUUID3)
	want := []mig.Instance{untracked, a, b} // NVML's order: GPU instance id (3, then 4 and 5)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Instances (-want +got):\n%s", diff)
	}
	for _, i := range []mig.Instance{a, a, untracked} { // twice: Destroy is idempotent
		if err := m.Destroy(ctx, i); err != nil {
			t.Errorf("Destroy %v: %v", i, err)
		}
	}
	// A GPU instance id that now names another instance is left alone.
	stale := b
	stale.Placement = mig.Placement{Start: 4, Size: 2}
	if err := m.Destroy(ctx, stale); err != nil {
		t.Errorf("Destroy stale: %v", err)
	}
	if got, err = m.Instances(ctx); err != nil || !cmp.Equal(got, []mig.Instance{b}) {
		t.Errorf("Instances after destroying: %v, %v; want %v", got, err, b)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if inits, shutdowns, _ := lib.counts(); inits != 1 || shutdowns != 1 {
		t.Errorf("nvml Init %d, Shutdown %d; want 1 each", inits, shutdowns)
	}
	if _, err := m.Instances(ctx); !errors.Is(err, nvmlscan.ErrClosed) {
		t.Errorf("Instances after Close: %v", err)
	}
	if _, err := m.Create(ctx, gpu0, "1g.5gb", mig.Placement{Start: 6, Size: 1}); !errors.Is(err, nvmlscan.ErrClosed) {
		t.Errorf("Create after Close: %v", err)
	}
	if err := m.Destroy(ctx, b); !errors.Is(err, nvmlscan.ErrClosed) {
		t.Errorf("Destroy after Close: %v", err)
	}
}
