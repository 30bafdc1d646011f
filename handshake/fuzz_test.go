package handshake

import (
	"strings"
	"testing"
	"time"
)

// FuzzParse checks that parsing and both decision functions never panic on any value, agree
// with a direct restatement of HAMi's branch rules, and that stamps always parse back fresh.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "Requesting", "Requesting_", "Requesting_2026-05-19 09:14:52", "Deleted_2026-05-19 09:14:52",
		"Deleted", "NotRequestingAnything", "Requesting_2024.05.27 09:48:48", "Reported 2025-04-17", "hello", "_", "Requesting_\xff"} {
		f.Add(s, true, int64(10), int64(0), int64(0), false)
	}
	f.Fuzz(func(t *testing.T, raw string, present bool, allocatable, reported, offsetSec int64, v290 bool) {
		loc := time.UTC
		v := Parse(raw, present, loc)
		switch {
		case !present:
			if v.State != StateAbsent {
				t.Fatalf("absent key parsed as %v", v.State)
			}
		case strings.Contains(raw, "Requesting"):
			if v.State != StateRequesting {
				t.Fatalf("%q: state %v, want requesting", raw, v.State)
			}
		case strings.Contains(raw, "Deleted"):
			if v.State != StateDeleted {
				t.Fatalf("%q: state %v, want deleted", raw, v.State)
			}
		default:
			if v.State != StateOther {
				t.Fatalf("%q: state %v, want other", raw, v.State)
			}
		}
		if v.TimeOK {
			_, rest, _ := strings.Cut(raw, "_")
			if got := v.Time.In(loc).Format(Layout); got != rest {
				t.Fatalf("%q: time %q does not format back to %q", raw, got, rest)
			}
		}
		now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC).Add(time.Duration(offsetSec%(1<<31)) * time.Second)
		opts := Options{Location: loc}
		if v290 {
			opts.Version = VersionV290
		}
		r := Check(v, allocatable, now, opts)
		if r.Action == ActionStamp {
			back := Parse(r.NewValue, true, loc)
			if back.State != StateRequesting || !back.TimeOK {
				t.Fatalf("stamp %q does not parse back", r.NewValue)
			}
			if fresh := Check(back, 0, now, opts); !fresh.Healthy || fresh.Action != ActionNone {
				t.Fatalf("own stamp %q is not fresh: %+v", r.NewValue, fresh)
			}
		}
		if r.Action == ActionCleanup {
			t.Fatal("Check never cleans up")
		}
		d := Decide(Input{Handshake: v, Allocatable: allocatable, Reported: reported, Registered: present, Now: now}, opts)
		if d.Healthy && d.Action == ActionCleanup {
			t.Fatalf("healthy node cleaned up: %+v", d)
		}
		if allocatable <= 0 && d.Healthy && d.NeedUpdate && d.Action == ActionStamp {
			t.Fatalf("node with allocatable %d added by a stamp: %+v", allocatable, d)
		}
		if d.Reason == "" {
			t.Fatal("decision without reason")
		}
	})
}
