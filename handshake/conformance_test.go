package handshake

import (
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/hamireg/hamireg/internal/vectors"
)

type handshakeFile struct {
	Vectors []struct {
		Name           string   `json:"name"`
		Before         string   `json:"handshake_before"`
		Allocatable    int64    `json:"allocatable_gpu"`
		WantHealthy    bool     `json:"want_healthy"`
		WantNeedUpdate bool     `json:"want_need_update"`
		After          string   `json:"handshake_after"`
		APICalls       []string `json:"api_calls"`
		Panic          string   `json:"panic"`
	} `json:"vectors"`
	Sequence []struct {
		Step           int      `json:"step"`
		Allocatable    int64    `json:"allocatable_gpu"`
		SetBefore      *string  `json:"set_handshake_before"`
		Seen           string   `json:"handshake_seen"`
		WantHealthy    bool     `json:"want_healthy"`
		WantNeedUpdate bool     `json:"want_need_update"`
		After          string   `json:"handshake_after"`
		APICalls       []string `json:"api_calls"`
	} `json:"nvidia_wrapper_sequence"`
}

var placeholder = regexp.MustCompile(`\{now([+-]\d+)?s?\}`)

// expand replaces {now}, {now-120s}, {now+3600s} with timestamps relative to now (UTC, as the
// generator ran with TZ=UTC) and reports whether the annotation is present.
func expand(s string, now time.Time) (string, bool) {
	if s == "<absent>" {
		return "", false
	}
	return placeholder.ReplaceAllStringFunc(s, func(m string) string {
		sub := placeholder.FindStringSubmatch(m)
		off := 0
		if sub[1] != "" {
			off, _ = strconv.Atoi(sub[1])
		}
		return now.Add(time.Duration(off) * time.Second).In(time.UTC).Format(Layout)
	}), true
}

func TestConformanceCheck(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, folder := range vectors.Folders(t) {
		dir, version := folder.Dir, vectors.Pick(folder, VersionMaster, VersionV290)
		var f handshakeFile
		if !folder.Read(t, "handshake.json", &f) {
			continue
		}
		opts := Options{Location: time.UTC, Version: version}
		n := 0
		for _, v := range f.Vectors {
			n++
			raw, present := expand(v.Before, now)
			r := Check(Parse(raw, present, time.UTC), v.Allocatable, now, opts)
			if v.Panic != "" {
				// HAMi v2.9.0 panics here; this package answers as HAMi master does.
				if !r.Healthy || r.NeedUpdate || r.Action != ActionNone {
					t.Errorf("%s %s (HAMi panics: %s): got %+v, want master's (true,false) without writes", filepath.Base(dir), v.Name, v.Panic, r)
				}
				continue
			}
			if r.Healthy != v.WantHealthy || r.NeedUpdate != v.WantNeedUpdate {
				t.Errorf("%s %s: (healthy, needUpdate) = (%v, %v), want (%v, %v)", filepath.Base(dir), v.Name, r.Healthy, r.NeedUpdate, v.WantHealthy, v.WantNeedUpdate)
			}
			wantAfter, _ := expand(v.After, now)
			gotAfter, wantCalls := raw, []string{}
			if r.Action == ActionStamp {
				gotAfter = r.NewValue
			}
			if slices.Contains(v.APICalls, "patch nodes") {
				wantCalls = []string{"stamp"}
			}
			if gotAfter != wantAfter {
				t.Errorf("%s %s: value after = %q, want %q", filepath.Base(dir), v.Name, gotAfter, wantAfter)
			}
			if (r.Action == ActionStamp) != (len(wantCalls) == 1) {
				t.Errorf("%s %s: action %v, HAMi's API calls %v", filepath.Base(dir), v.Name, r.Action, v.APICalls)
			}
		}

		// The NVIDIA wrapper sequence, through Decide with the state a scheduler keeps.
		var reported int64
		registered := false
		current := ""
		present := false
		for _, s := range f.Sequence {
			n++
			if s.SetBefore != nil {
				current, present = expand(*s.SetBefore, now)
			}
			d := Decide(Input{Handshake: Parse(current, present, time.UTC), Allocatable: s.Allocatable,
				Reported: reported, Registered: registered, Now: now}, opts)
			reported = d.Reported
			wantH, wantU := s.WantHealthy, s.WantNeedUpdate
			if s.Step == 6 {
				// Deliberate difference (spec §6.3, §13 item 13): the handshake was removed while
				// allocatable is 0. HAMi re-stamps and answers (true, true), re-adding a node with
				// no allocatable GPU that it cleans up again a minute later. Decide still stamps
				// but keeps the node out until allocatable returns.
				if d.Action != ActionStamp || d.Healthy || d.NeedUpdate {
					t.Errorf("%s step 6: got %+v, want a stamp with healthy=false needUpdate=false", filepath.Base(dir), d)
				}
				wantH, wantU = false, false
			}
			if d.Healthy != wantH || d.NeedUpdate != wantU {
				t.Errorf("%s step %d: (healthy, needUpdate) = (%v, %v), want (%v, %v); %s", filepath.Base(dir), s.Step, d.Healthy, d.NeedUpdate, wantH, wantU, d.Reason)
			}
			if d.Action == ActionStamp {
				current, present = d.NewValue, true
			}
			wantAfter, _ := expand(s.After, now)
			if s.After != "<absent>" && current != wantAfter {
				t.Errorf("%s step %d: value after = %q, want %q", filepath.Base(dir), s.Step, current, wantAfter)
			}
			switch {
			case d.Action == ActionCleanup:
				registered = false
			case d.Healthy && d.NeedUpdate:
				registered = true
			}
		}
		t.Logf("checked %d vectors from %s (handshake.json, %v)", n, dir, version)
	}
}
