package mig

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseAllowlist(t *testing.T) {
	t.Parallel()
	a100 := Allowlist{{Models: []string{"A100-SXM4-40GB"}, Profiles: []string{"1g.5gb", "7g.40gb"}}}
	tests := map[string]struct {
		data    string
		want    Allowlist
		wantErr string
	}{
		"empty":     {data: ""},
		"null":      {data: "null"},
		"yaml list": {data: "- models: [A100-SXM4-40GB]\n  profiles:\n  - 1g.5gb\n  - 7g.40gb\n", want: a100},
		"json list": {data: `[{"models":["A100-SXM4-40GB"],"profiles":["1g.5gb","7g.40gb"]}]`, want: a100},
		"device config document": {
			data: "nvidia:\n  resourceCountName: nvidia.com/gpu\n  migProfileAllowlist:\n  - models: [A100-SXM4-40GB]\n    profiles: [1g.5gb, 7g.40gb]\n",
			want: a100,
		},
		"nvidia section":        {data: "migProfileAllowlist:\n- models: [A100-SXM4-40GB]\n  profiles: [1g.5gb, 7g.40gb]\n", want: a100},
		"document without list": {data: "nvidia:\n  resourceCountName: nvidia.com/gpu\n"},
		"unknown entry fields ignored": {
			data: "- models: [A100-SXM4-40GB]\n  profiles: [1g.5gb, 7g.40gb]\n  comment: x\n", want: a100,
		},
		"no models":           {data: "- profiles: [1g.5gb]\n", wantErr: "entry 0 has no models"},
		"no profiles":         {data: "- models: [A30]\n- models: [B200]\n  profiles: []\n", wantErr: "entry 0 has no profiles"},
		"profile without dot": {data: "- models: [A30]\n  profiles: [1g]\n", wantErr: `entry 0: profile "1g"`},
		"prefix too short":    {data: "- models: [A30]\n  profiles: [g.5gb]\n", wantErr: `entry 0: profile "g.5gb"`},
		"prefix not g":        {data: "- models: [A30]\n  profiles: [1c.5gb]\n", wantErr: `entry 0: profile "1c.5gb"`},
		"second entry":        {data: "- models: [A30]\n  profiles: [1g.6gb]\n- models: [B200]\n  profiles: [1g.23gb, x]\n", wantErr: `entry 1: profile "x"`},
		"not yaml":            {data: "- [", wantErr: "invalid MIG profile allowlist"},
		"scalar":              {data: "3", wantErr: "invalid MIG profile allowlist"},
		"models not a list":   {data: "- models: {a: b}\n  profiles: [1g.5gb]\n", wantErr: "invalid MIG profile allowlist"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseAllowlist([]byte(tt.data))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("ParseAllowlist: %v", err)
				}
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("ParseAllowlist (-want +got):\n%s", diff)
				}
				return
			}
			if !errors.Is(err, ErrInvalidAllowlist) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("ParseAllowlist error = %v, want ErrInvalidAllowlist containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestChartAndDefaultAllowlistValidate(t *testing.T) {
	t.Parallel()
	for name, l := range map[string]Allowlist{"chart": ChartAllowlist(), "default": DefaultAllowlist()} {
		if err := l.Validate(); err != nil {
			t.Errorf("%s: Validate: %v", name, err)
		}
	}
	// Fresh values: changing one does not change the next.
	l := DefaultAllowlist()
	l[0].Models[0] = "changed"
	if ChartAllowlist()[0].Models[0] != "A30" || DefaultAllowlist()[0].Models[0] != "A30" {
		t.Error("ChartAllowlist/DefaultAllowlist share their slices")
	}
}

func TestMatch(t *testing.T) {
	t.Parallel()
	chart, def := ChartAllowlist(), DefaultAllowlist()
	const (
		a30, a100x40, a100x80, h100x80, h20, h200 = 0, 1, 2, 3, 5, 6
	)
	tests := map[string]struct {
		list       Allowlist
		name       string
		rule       MatchRule
		wantEntry  int
		wantOthers []int
	}{
		"chart substring A100-40GB":           {list: chart, name: "NVIDIA A100-SXM4-40GB", rule: MatchSubstring, wantEntry: a100x40},
		"chart word mock A100-40GB":           {list: chart, name: "Mock NVIDIA A100-SXM4-40GB", rule: MatchWord, wantEntry: a100x40},
		"chart word A30 mock":                 {list: chart, name: "NVIDIA A30-PCIE-24GB", rule: MatchWord, wantEntry: a30},
		"chart substring H200 gets H20":       {list: chart, name: "NVIDIA H200", rule: MatchSubstring, wantEntry: h20},
		"chart substring H200 NVL ambiguous":  {list: chart, name: "NVIDIA H200 NVL", rule: MatchSubstring, wantEntry: h20, wantOthers: []int{h200}},
		"chart word H200 NVL":                 {list: chart, name: "NVIDIA H200 NVL", rule: MatchWord, wantEntry: h200},
		"chart word H200 SXM matches none":    {list: chart, name: "NVIDIA H200", rule: MatchWord, wantEntry: -1},
		"chart substring A100 80GB PCIe none": {list: chart, name: "NVIDIA A100 80GB PCIe", rule: MatchSubstring, wantEntry: -1},
		"chart substring H100 HBM3 none":      {list: chart, name: "NVIDIA H100 80GB HBM3", rule: MatchSubstring, wantEntry: -1},
		"default word H200":                   {list: def, name: "NVIDIA H200", rule: MatchWord, wantEntry: h200},
		"default word H200 mock":              {list: def, name: "NVIDIA H200 141GB HBM3e", rule: MatchWord, wantEntry: h200},
		"default word H200 NVL":               {list: def, name: "NVIDIA H200 NVL", rule: MatchWord, wantEntry: h200},
		"default word H20":                    {list: def, name: "NVIDIA H20", rule: MatchWord, wantEntry: h20},
		"default word A100 80GB PCIe":         {list: def, name: "NVIDIA A100 80GB PCIe", rule: MatchWord, wantEntry: a100x80},
		"default word H100 HBM3":              {list: def, name: "NVIDIA H100 80GB HBM3", rule: MatchWord, wantEntry: h100x80},
		"default word GH200 not H200":         {list: def, name: "NVIDIA GH200 480GB", rule: MatchWord, wantEntry: -1},
		"default word A10 none":               {list: def, name: "NVIDIA A10", rule: MatchWord, wantEntry: -1},
		"default word B200 mock":              {list: def, name: "NVIDIA B200 180GB HBM3e", rule: MatchWord, wantEntry: 7},
		"word later occurrence": {
			list: Allowlist{{Models: []string{"H20"}, Profiles: []string{"1g.12gb"}}}, name: "H200 H20", rule: MatchWord, wantEntry: 0,
		},
		"empty model never matches": {
			list: Allowlist{{Models: []string{""}, Profiles: []string{"1g.12gb"}}}, name: "x", rule: MatchSubstring, wantEntry: -1,
		},
		"unknown rule": {list: chart, name: "NVIDIA A100-SXM4-40GB", rule: MatchRule(9), wantEntry: -1},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			profiles, entry, others := tt.list.Match(tt.name, tt.rule)
			if entry != tt.wantEntry {
				t.Fatalf("Match(%q, %v) entry = %d, want %d", tt.name, tt.rule, entry, tt.wantEntry)
			}
			var want []string
			if entry >= 0 {
				want = tt.list[entry].Profiles
			}
			if diff := cmp.Diff(want, profiles); diff != "" {
				t.Errorf("profiles (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantOthers, others); diff != "" {
				t.Errorf("others (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSliceKeyAndCount(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		profile   string
		wantKey   string
		wantCount int
		keyErr    bool
		countErr  bool
	}{
		"1g.5gb":       {profile: "1g.5gb", wantKey: "1g", wantCount: 1},
		"REV":          {profile: "1g.10gb+me", wantKey: "1g", wantCount: 1},
		"7g.141gb":     {profile: "7g.141gb", wantKey: "7g", wantCount: 7},
		"empty name":   {profile: "4g.", wantKey: "4g", wantCount: 4},
		"no dot":       {profile: "1g", keyErr: true, countErr: true},
		"short":        {profile: "g.5gb", keyErr: true, countErr: true},
		"not g":        {profile: "10.5gb", keyErr: true, countErr: true},
		"empty":        {profile: "", keyErr: true, countErr: true},
		"letters":      {profile: "xg.5gb", wantKey: "xg", countErr: true},
		"signed":       {profile: "+1g.5gb", wantKey: "+1g", countErr: true},
		"zero":         {profile: "0g.5gb", wantKey: "0g", countErr: true},
		"huge":         {profile: "99999999999999999999g.x", wantKey: "99999999999999999999g", countErr: true},
		"leading zero": {profile: "02g.10gb", wantKey: "02g", wantCount: 2},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			key, err := SliceKey(tt.profile)
			if (err != nil) != tt.keyErr || (err != nil && !errors.Is(err, ErrMalformed)) || key != tt.wantKey {
				t.Errorf("SliceKey(%q) = %q, %v; want %q, error %v", tt.profile, key, err, tt.wantKey, tt.keyErr)
			}
			n, err := SliceCount(tt.profile)
			if (err != nil) != tt.countErr || (err != nil && !errors.Is(err, ErrMalformed)) || n != tt.wantCount {
				t.Errorf("SliceCount(%q) = %d, %v; want %d, error %v", tt.profile, n, err, tt.wantCount, tt.countErr)
			}
		})
	}
}

func FuzzParseAllowlist(f *testing.F) {
	for _, s := range []string{
		"", "null", "[]", "- [", "3",
		"- models: [A100-SXM4-40GB]\n  profiles: [1g.5gb, 7g.40gb]\n",
		"nvidia:\n  migProfileAllowlist:\n  - models: [A30]\n    profiles: [1g.6gb]\n",
		`[{"models":["H20"],"profiles":["1g.12gb"]}]`,
		"- models: [A30]\n  profiles: [g.5gb]\n",
	} {
		f.Add([]byte(s), "NVIDIA A30-PCIE-24GB")
	}
	f.Fuzz(func(t *testing.T, data []byte, name string) {
		l, err := ParseAllowlist(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidAllowlist) {
				t.Fatalf("ParseAllowlist error %v is not ErrInvalidAllowlist", err)
			}
			return
		}
		if err := l.Validate(); err != nil {
			t.Fatalf("ParseAllowlist accepted a list Validate rejects: %v", err)
		}
		for _, rule := range []MatchRule{MatchWord, MatchSubstring} {
			profiles, entry, others := l.Match(name, rule)
			if entry < 0 {
				if profiles != nil || others != nil {
					t.Fatalf("Match(%q, %v): no entry but profiles %v, others %v", name, rule, profiles, others)
				}
				continue
			}
			for _, p := range profiles {
				if _, err := SliceKey(p); err != nil {
					t.Fatalf("validated profile %q: %v", p, err)
				}
			}
			for _, o := range others {
				if o <= entry || o >= len(l) {
					t.Fatalf("Match(%q, %v): other %d not after entry %d", name, rule, o, entry)
				}
			}
		}
		// A word match is a substring match.
		if _, w, _ := l.Match(name, MatchWord); w >= 0 {
			if _, s, _ := l.Match(name, MatchSubstring); s < 0 || s > w {
				t.Fatalf("Match(%q): word entry %d, substring entry %d", name, w, s)
			}
		}
	})
}
