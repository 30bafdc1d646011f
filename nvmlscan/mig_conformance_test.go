package nvmlscan_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/internal/vectors"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nvmlscan"
)

// registerVector is one vector of mig-register.json.
type registerVector struct {
	Name  string `json:"name"`
	Note  string `json:"note"`
	Input struct {
		Config struct {
			CoreScaling     float64         `json:"device_core_scaling"`
			MemoryScaling   float64         `json:"device_memory_scaling"`
			SplitCount      int32           `json:"device_split_count"`
			Allowlist       json.RawMessage `json:"mig_profile_allowlist"`
			AllowlistSource string          `json:"mig_profile_allowlist_source"`
			Mode            string          `json:"operating_mode"`
		} `json:"config"`
		Kubelet []struct {
			ID     string `json:"id"`
			Health string `json:"health"`
		} `json:"kubelet_devices"`
		NVML vecNVML `json:"nvml"`
	} `json:"input"`
	WantAnnotation string `json:"want_annotation"`
}

// allowlist is the vector's migProfileAllowlist: nil when the vector has none (v2.9.0), a
// non-nil empty list for "[]".
func (v registerVector) allowlist(t *testing.T) mig.Allowlist {
	t.Helper()
	raw := v.Input.Config.Allowlist
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	a, err := mig.ParseAllowlist(raw)
	if err != nil {
		t.Fatalf("parse allowlist: %v", err)
	}
	if a == nil {
		a = mig.Allowlist{}
	}
	return a
}

// scanVector scans the vector's NVML with its config and the given allowlist and rule, and
// applies the health rule: HAMi's health is the kubelet device's, the SDK's comes from its XID
// watch (off here, so every GPU is healthy); the kubelet's Unhealthy devices are set unhealthy.
func scanVector(t *testing.T, f vectors.Folder, v registerVector, allow mig.Allowlist, rule mig.MatchRule) (nvmlscan.Result, *fakeNVML) {
	t.Helper()
	c := v.Input.Config
	lib := newFakeNVML(t, v.Input.NVML)
	ms, cs := c.MemoryScaling, c.CoreScaling
	s, err := nvmlscan.New(lib, nvmlscan.Options{
		SplitCount:    c.SplitCount,
		MemoryScaling: &ms,
		CoreScaling:   &cs,
		Mode:          c.Mode,
		Sysfs:         fstest.MapFS{}, // no numa_node: NUMA 0, as on the generating machine
		Health:        nvmlscan.HealthOptions{Disabled: true},
		MIGVersion:    vectors.Pick(f, annotation.VersionMaster, annotation.VersionV290),
		MIGAllowlist:  allow,
		MIGModelMatch: rule,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	res := scan(testContext(t), t, s)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	unhealthy := map[string]bool{}
	for _, k := range v.Input.Kubelet {
		unhealthy[k.ID] = k.Health != "Healthy"
	}
	for i, d := range res.Devices {
		if !d.Health {
			t.Errorf("GPU %s unhealthy without an XID", d.ID)
		}
		res.Devices[i].Health = !unhealthy[d.ID]
	}
	return res, lib
}

// TestMIGRegisterConformance scans the NVML each mig-register.json vector fed HAMi's node
// agent, with the vector's configuration and HAMi's substring model match, and compares the
// annotation byte for byte with what HAMi wrote. Then, for master's vectors, it asserts the
// SDK's default word-bounded match rule: the scan is the same except for GPUs whose NVML name
// matches another entry (or none) at word boundaries, which get exactly that entry's profiles
// (or are skipped with ErrNoMIGProfile).
func TestMIGRegisterConformance(t *testing.T) {
	t.Parallel()
	for _, f := range vectors.Folders(t) {
		var file struct {
			Vectors []registerVector `json:"vectors"`
		}
		if !f.Read(t, "mig-register.json", &file) {
			continue
		}
		t.Logf("checked %d vectors from %s", len(file.Vectors), f.Dir)
		t.Run(f.Name(), func(t *testing.T) {
			t.Parallel()
			for _, v := range file.Vectors {
				t.Run(v.Name, func(t *testing.T) {
					t.Parallel()
					checkRegisterVector(t, f, v)
				})
			}
		})
	}
}

func checkRegisterVector(t *testing.T, f vectors.Folder, v registerVector) {
	t.Helper()
	allow := v.allowlist(t)
	if strings.HasPrefix(v.Input.Config.AllowlistSource, "chart default") {
		if diff := cmp.Diff(mig.ChartAllowlist(), allow, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("mig.ChartAllowlist() differs from the chart's (-sdk +chart):\n%s", diff)
		}
	}
	res, lib := scanVector(t, f, v, allow, mig.MatchSubstring)
	shape := vectors.Pick(f, annotation.ShapeMaster, annotation.ShapeV290)
	if got := annotation.EncodeShape(res.Devices, shape); got != v.WantAnnotation {
		t.Errorf("annotation:\n got %s\nwant %s", got, v.WantAnnotation)
	}
	// The GPUs HAMi dropped are reported, with the fix, instead of disappearing silently.
	published := map[string]bool{}
	for _, d := range res.Devices {
		published[d.ID] = true
	}
	var wantFailed []string
	for _, d := range v.Input.NVML.Devices {
		if !published[d.UUID] {
			wantFailed = append(wantFailed, d.UUID)
		}
	}
	var gotFailed []string
	for _, e := range res.Failed {
		gotFailed = append(gotFailed, e.UUID)
		if e.Op != nvmlscan.OpMIGProfiles || !errors.Is(e, nvmlscan.ErrNoMIGProfile) {
			t.Errorf("failed GPU %s: %v, want %s and ErrNoMIGProfile", e.UUID, e, nvmlscan.OpMIGProfiles)
		}
	}
	if diff := cmp.Diff(wantFailed, gotFailed); diff != "" {
		t.Errorf("failed GPUs (-want +got):\n%s", diff)
	}
	inits, shutdowns, migQueries := lib.counts()
	if inits != 1 || shutdowns != 1 || migQueries != 0 {
		t.Errorf("nvml Init %d, Shutdown %d, GetMigMode %d; want 1, 1, 0", inits, shutdowns, migQueries)
	}
	if f.V290 || allow == nil {
		return
	}

	// The SDK's default rule: word-bounded model match.
	word, _ := scanVector(t, f, v, allow, mig.MatchWord)
	byUUID := func(r nvmlscan.Result, uuid string) (annotation.Device, error) {
		for _, d := range r.Devices {
			if d.ID == uuid {
				return d, nil
			}
		}
		for _, e := range r.Failed {
			if e.UUID == uuid {
				return annotation.Device{}, e
			}
		}
		return annotation.Device{}, nil
	}
	for _, d := range v.Input.NVML.Devices {
		name := v.Input.NVML.Models[d.Model].Name
		_, hamiEntry, _ := allow.Match(name, mig.MatchSubstring)
		profiles, entry, _ := allow.Match(name, mig.MatchWord)
		got, gotErr := byUUID(word, d.UUID)
		var want annotation.Device
		var wantErr error
		switch {
		case entry == hamiEntry:
			want, wantErr = byUUID(res, d.UUID)
		case len(profiles) == 0:
			wantErr = nvmlscan.ErrNoMIGProfile
		default:
			// Exactly the word-matched entry's profiles: what HAMi publishes with an
			// allowlist of that entry alone, naming the GPU exactly.
			only, err := json.Marshal([]map[string][]string{{"models": {name}, "profiles": profiles}})
			if err != nil {
				t.Fatal(err)
			}
			v2 := v
			v2.Input.Config.Allowlist = only
			r, _ := scanVector(t, f, v2, v2.allowlist(t), mig.MatchSubstring)
			want, wantErr = byUUID(r, d.UUID)
		}
		if entry != hamiEntry {
			t.Logf("GPU %s (%q): word-bounded match uses allowlist entry %d, HAMi's substring match %d", d.UUID, name, entry, hamiEntry)
		}
		if (gotErr == nil) != (wantErr == nil) || (wantErr != nil && !errors.Is(gotErr, nvmlscan.ErrNoMIGProfile)) {
			t.Errorf("GPU %s with MatchWord: error %v, want %v", d.UUID, gotErr, wantErr)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("GPU %s with MatchWord (-want +got):\n%s", d.UUID, diff)
		}
	}
}
