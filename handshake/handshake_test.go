package handshake

import (
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	t.Parallel()
	loc := time.FixedZone("UTC+8", 8*3600)
	tests := map[string]struct {
		raw     string
		present bool
		state   State
		sep     bool
		timeOK  bool
	}{
		"absent":              {"", false, StateAbsent, false, false},
		"empty":               {"", true, StateOther, false, false},
		"requesting":          {"Requesting_2026-05-19 09:14:52", true, StateRequesting, true, true},
		"requesting bare":     {"Requesting", true, StateRequesting, false, false},
		"requesting rfc3339":  {"Requesting_2026-05-19T09:14:52Z", true, StateRequesting, true, false},
		"requesting dots":     {"Requesting_2024.05.27 09:48:48", true, StateRequesting, true, false},
		"substring":           {"NotRequestingAnything", true, StateRequesting, false, false},
		"deleted":             {"Deleted_2026-05-19 09:14:52", true, StateDeleted, true, true},
		"deleted bare":        {"Deleted", true, StateDeleted, false, false},
		"reported heartbeat":  {"Reported 2025-04-17 06:39:20.812216312 +0000 UTC", true, StateOther, false, false},
		"requesting wins":     {"Deleted_Requesting_x", true, StateRequesting, true, false},
		"trailing garbage":    {"Requesting_2026-05-19 09:14:52x", true, StateRequesting, true, false},
		"underscore in time":  {"Requesting__2026-05-19 09:14:52", true, StateRequesting, true, false},
		"garbage":             {"hello", true, StateOther, false, false},
		"unicode":             {"Requesting_\xff", true, StateRequesting, true, false},
		"location is applied": {"Requesting_2026-05-19 17:14:52", true, StateRequesting, true, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			v := Parse(tc.raw, tc.present, loc)
			if v.State != tc.state || v.HasSeparator != tc.sep || v.TimeOK != tc.timeOK {
				t.Errorf("Parse(%q) = state %v sep %v timeOK %v, want %v %v %v", tc.raw, v.State, v.HasSeparator, v.TimeOK, tc.state, tc.sep, tc.timeOK)
			}
		})
	}
	v := Parse("Requesting_2026-05-19 17:14:52", true, loc)
	if want := time.Date(2026, 5, 19, 9, 14, 52, 0, time.UTC); !v.Time.Equal(want) {
		t.Errorf("time in UTC+8 = %v, want %v", v.Time, want)
	}
}

func TestFormatRoundTrip(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 23, 59, 59, 999, time.UTC)
	for _, loc := range []*time.Location{time.UTC, time.FixedZone("x", -7*3600)} {
		v := Parse(Requesting(now, loc), true, loc)
		if v.State != StateRequesting || !v.TimeOK || !v.Time.Equal(now.Truncate(time.Second)) {
			t.Errorf("Requesting round trip in %v: %+v", loc, v)
		}
		if got := Deleted(now, loc); Parse(got, true, loc).State != StateDeleted {
			t.Errorf("Deleted(%v) = %q does not parse as deleted", now, got)
		}
	}
	if got := Requesting(now, time.UTC); got != "Requesting_2026-11-30 23:59:59" {
		t.Errorf("Requesting = %q", got)
	}
}

func TestCheckWindow(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	stamp := Requesting(now.Add(-30*time.Second), time.UTC)
	for _, tc := range []struct {
		window  time.Duration
		healthy bool
	}{{0, true}, {20 * time.Second, false}, {31 * time.Second, true}, {30 * time.Second, false}} {
		r := Check(Parse(stamp, true, time.UTC), 0, now, Options{Window: tc.window, Location: time.UTC})
		if r.Healthy != tc.healthy {
			t.Errorf("window %v: healthy = %v, want %v (%s)", tc.window, r.Healthy, tc.healthy, r.Reason)
		}
	}
}

func TestDecideTransitions(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	fresh := Parse(Requesting(now, time.UTC), true, time.UTC)
	expired := Parse(Requesting(now.Add(-2*time.Minute), time.UTC), true, time.UTC)
	absent := Parse("", false, time.UTC)
	tests := map[string]struct {
		in      Input
		opts    Options
		healthy bool
		update  bool
		action  Action
		del     bool
		rep     int64
	}{
		"first sighting stamps and adds":   {Input{Handshake: absent, Allocatable: 10}, Options{}, true, true, ActionStamp, false, 10},
		"steady":                           {Input{Handshake: fresh, Allocatable: 10, Reported: 10, Registered: true}, Options{}, true, false, ActionNone, false, 10},
		"expired with allocatable":         {Input{Handshake: expired, Allocatable: 10, Reported: 10, Registered: true}, Options{}, true, false, ActionNone, false, 10},
		"register changed reloads":         {Input{Handshake: expired, Allocatable: 10, Reported: 10, RegisterChanged: true}, Options{}, true, true, ActionNone, false, 10},
		"register change ignored in 2.9.0": {Input{Handshake: expired, Allocatable: 10, Reported: 10, RegisterChanged: true}, Options{Version: VersionV290}, true, false, ActionNone, false, 10},
		"allocatable vanished cleans up":   {Input{Handshake: expired, Allocatable: 0, Reported: 10, Registered: true}, Options{}, false, false, ActionCleanup, true, 0},
		"v2.9.0 cleanup writes Deleted":    {Input{Handshake: expired, Allocatable: 0, Reported: 10, Registered: true}, Options{Version: VersionV290}, false, false, ActionCleanup, false, 0},
		"expired and zero, not cached":     {Input{Handshake: expired}, Options{}, false, false, ActionNone, false, 0},
		"zero allocatable is not re-added": {Input{Handshake: absent}, Options{}, false, false, ActionStamp, false, 0},
		"count change reloads":             {Input{Handshake: fresh, Allocatable: 8, Reported: 10, Registered: true}, Options{}, true, true, ActionNone, false, 8},
		"negative allocatable is zero":     {Input{Handshake: expired, Allocatable: -1, Reported: 10, Registered: true}, Options{}, false, false, ActionCleanup, true, 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tc.in.Now = now
			tc.opts.Location = time.UTC
			d := Decide(tc.in, tc.opts)
			if d.Healthy != tc.healthy || d.NeedUpdate != tc.update || d.Action != tc.action || d.Delete != tc.del || d.Reported != tc.rep {
				t.Errorf("Decide = %+v, want healthy %v update %v action %v delete %v reported %d", d, tc.healthy, tc.update, tc.action, tc.del, tc.rep)
			}
			if d.Action == ActionCleanup && tc.opts.Version == VersionV290 && d.NewValue != Deleted(now, time.UTC) {
				t.Errorf("v2.9.0 cleanup value = %q", d.NewValue)
			}
			if d.Reason == "" {
				t.Error("no reason")
			}
		})
	}
}

// TestNoFlap runs the scenario of spec §6.3 for ten minutes of 15 s cycles: a node keeps its
// register annotation while allocatable stays 0 and the handshake is removed by each cleanup.
// HAMi adds and removes it every minute; Decide never adds it.
func TestNoFlap(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	value, present := "", false
	var reported int64
	registered := false
	adds := 0
	for cycle := 0; cycle < 40; cycle++ {
		d := Decide(Input{Handshake: Parse(value, present, time.UTC), Reported: reported, Registered: registered, Now: now}, Options{Location: time.UTC})
		reported = d.Reported
		switch d.Action {
		case ActionStamp:
			value, present = d.NewValue, true
		case ActionCleanup:
			value, present = "", false
			registered = false
		case ActionNone:
		}
		if d.Healthy && d.NeedUpdate && !registered {
			registered = true
			adds++
		}
		now = now.Add(15 * time.Second)
	}
	if adds != 0 {
		t.Errorf("node with allocatable 0 was added %d times in 10 minutes", adds)
	}
}
