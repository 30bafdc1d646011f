package annotation

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/hamireg/hamireg/internal/vectors"
)

type scoreVectorFile struct {
	Vectors []struct {
		Name           string `json:"name"`
		WantAnnotation string `json:"want_annotation"`
		WantScores     []struct {
			UUID  string         `json:"uuid"`
			Score map[string]int `json:"score"`
		} `json:"want_scores"`
	} `json:"node_score_vectors"`
}

// TestConformancePairScores: for every node_score_vectors entry with an annotation, the
// parsed scores encode to HAMi's device plugin bytes, and those bytes decode back to them.
func TestConformancePairScores(t *testing.T) {
	t.Parallel()
	for _, folder := range vectors.Folders(t) {
		checked := 0
		var f scoreVectorFile
		if !folder.Read(t, "topology.json", &f) {
			continue
		}
		for _, v := range f.Vectors {
			if v.WantAnnotation == "" {
				continue // HAMi failed on this input (nvmlscan's tests check what the SDK does)
			}
			checked++
			var scores []PairScore
			for _, s := range v.WantScores {
				scores = append(scores, PairScore{UUID: s.UUID, Scores: s.Score})
			}
			if got := EncodePairScores(scores); got != v.WantAnnotation {
				t.Errorf("%s/%s: EncodePairScores\n got %s\nwant %s", folder.Name(), v.Name, got, v.WantAnnotation)
			}
			back, err := DecodePairScores(v.WantAnnotation)
			if err != nil {
				t.Errorf("%s/%s: DecodePairScores: %v", folder.Name(), v.Name, err)
			}
			if diff := cmp.Diff(scores, back, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("%s/%s: decode (-want +got):\n%s", folder.Name(), v.Name, diff)
			}
		}
		t.Logf("checked %d vectors from %s (topology.json node_score_vectors)", checked, folder.Dir)
	}
}

func TestPairScores(t *testing.T) {
	t.Parallel()
	devs := []Device{{ID: "GPU-a"}, {ID: "GPU-b"}, {ID: "GPU-c"}}
	tests := map[string]struct {
		value   string
		want    []PairScore
		wantErr error
		byDev   []map[string]int
	}{
		"absent entries":  {value: `null`},
		"empty list":      {value: `[]`, want: []PairScore{}},
		"one gpu":         {value: `[{"uuid":"GPU-a","score":{}}]`, want: []PairScore{{UUID: "GPU-a", Scores: map[string]int{}}}, byDev: []map[string]int{{}, nil, nil}},
		"case and extras": {value: `[{"UUID":"GPU-b","Score":{"GPU-a":7},"x":1}]`, want: []PairScore{{UUID: "GPU-b", Scores: map[string]int{"GPU-a": 7}}}, byDev: []map[string]int{nil, {"GPU-a": 7}, nil}},
		"unknown uuid dropped, last wins": {
			value: `[{"uuid":"GPU-x","score":{"GPU-a":1}},{"uuid":"GPU-c","score":{"GPU-a":1}},{"uuid":"GPU-c","score":{"GPU-a":2}}]`,
			want: []PairScore{{UUID: "GPU-x", Scores: map[string]int{"GPU-a": 1}}, {UUID: "GPU-c", Scores: map[string]int{"GPU-a": 1}},
				{UUID: "GPU-c", Scores: map[string]int{"GPU-a": 2}}},
			byDev: []map[string]int{nil, nil, {"GPU-a": 2}},
		},
		"null element":   {value: `[null]`, want: []PairScore{{}}},
		"not json":       {value: `[{`, wantErr: ErrMalformed},
		"float score":    {value: `[{"uuid":"GPU-a","score":{"GPU-b":1.5}}]`, wantErr: ErrMalformed},
		"wrong type":     {value: `[{"uuid":1}]`, wantErr: ErrMalformed},
		"object at top":  {value: `{"uuid":"GPU-a"}`, wantErr: ErrMalformed},
		"empty string":   {value: ``, wantErr: ErrMalformed},
		"string numbers": {value: `[{"uuid":"GPU-a","score":{"GPU-b":"50"}}]`, wantErr: ErrMalformed},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := DecodePairScores(tc.value)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				var de *DecodeError
				if !errors.As(err, &de) || de.Key != KeyNVIDIAScore {
					t.Fatalf("err %v: not a *DecodeError of %s", err, KeyNVIDIAScore)
				}
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("DecodePairScores (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.byDev, ScoresByDevice(devs, got)); diff != "" {
				t.Errorf("ScoresByDevice (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEncodePairScores(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		in   []PairScore
		want string
	}{
		"nil":        {want: `[]`},
		"nil map":    {in: []PairScore{{UUID: "GPU-a"}}, want: `[{"uuid":"GPU-a","score":{}}]`},
		"sorted":     {in: []PairScore{{UUID: "GPU-b", Scores: map[string]int{"GPU-c": 10, "GPU-a": 50}}}, want: `[{"uuid":"GPU-b","score":{"GPU-a":50,"GPU-c":10}}]`},
		"html safe":  {in: []PairScore{{UUID: "<&>", Scores: map[string]int{"<": -1}}}, want: `[{"uuid":"\u003c\u0026\u003e","score":{"\u003c":-1}}]`},
		"order kept": {in: []PairScore{{UUID: "GPU-z"}, {UUID: "GPU-a"}}, want: `[{"uuid":"GPU-z","score":{}},{"uuid":"GPU-a","score":{}}]`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := EncodePairScores(tc.in); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

// hamiPairScore is the scheduler's DevicePairScore, as HAMi declares it.
type hamiPairScore struct {
	ID     string         `json:"uuid,omitempty"`
	Scores map[string]int `json:"score,omitempty"`
}

// FuzzDecodePairScores: the decoder never panics, classifies every error, accepts exactly
// what encoding/json accepts into HAMi's struct with the same values, and what it accepts
// re-encodes to a value that decodes to the same scores.
func FuzzDecodePairScores(f *testing.F) {
	for _, s := range []string{`[{"uuid":"a","score":{"b":1}}]`, `[]`, `null`, `[null]`, `[{"uuid":1}]`, `[{"score":{"b":1.5}}]`,
		`[{"UUID":"a","SCORE":{"b":-1},"uuid":"c"}]`, `{}`, ``, `[{"score":null}]`, "[{\"uuid\":\"\xff\"}]", `[{"score":{"b":99999999999999999999}}]`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		got, err := DecodePairScores(value)
		checkClassified(t, err)
		var ref []hamiPairScore
		herr := json.Unmarshal([]byte(value), &ref)
		if (herr == nil) != (err == nil) {
			t.Fatalf("encoding/json err %v, DecodePairScores err %v", herr, err)
		}
		if err != nil {
			if !errors.Is(err, ErrMalformed) || got != nil {
				t.Fatalf("err %v not ErrMalformed, or scores %v returned with it", err, got)
			}
			return
		}
		if (ref == nil) != (got == nil) || len(ref) != len(got) {
			t.Fatalf("decoded %v, encoding/json %v", got, ref)
		}
		for i := range ref {
			if ref[i].ID != got[i].UUID || !cmp.Equal(ref[i].Scores, got[i].Scores) {
				t.Fatalf("entry %d: %+v, encoding/json %+v", i, got[i], ref[i])
			}
		}
		enc := EncodePairScores(got)
		back, err := DecodePairScores(enc)
		if err != nil {
			t.Fatalf("decode own encoding %s: %v", enc, err)
		}
		if diff := cmp.Diff(got, back, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("round trip (-first +second):\n%s", diff)
		}
	})
}
