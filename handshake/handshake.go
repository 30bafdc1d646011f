package handshake

import (
	"cmp"
	"strings"
	"time"
)

// Layout is the timestamp layout of handshake values (time.DateTime), written in the
// scheduler's local time zone with second resolution.
const Layout = "2006-01-02 15:04:05"

// DefaultWindow is how long a Requesting_ or Deleted_ stamp counts as fresh (hard-coded in HAMi).
const DefaultWindow = 60 * time.Second

// Prefixes of the values the scheduler writes.
const (
	PrefixRequesting = "Requesting_"
	PrefixDeleted    = "Deleted_"
)

// State classifies a handshake value the way HAMi's CheckHealth branches on it.
type State int

const (
	// StateAbsent means the annotation is not set.
	StateAbsent State = iota
	// StateRequesting means the value contains "Requesting" (HAMi matches a substring).
	StateRequesting
	// StateDeleted means the value contains "Deleted" (and not "Requesting").
	StateDeleted
	// StateOther means any other value, the empty string, or a pre-2.8 "Reported …" heartbeat.
	StateOther
)

// String returns the state's name.
func (s State) String() string {
	switch s {
	case StateAbsent:
		return "absent"
	case StateRequesting:
		return "requesting"
	case StateDeleted:
		return "deleted"
	case StateOther:
		return "other"
	default:
		return "unknown"
	}
}

// Value is a parsed handshake annotation value. Parsing never fails: what HAMi cannot parse is
// described by the fields (TimeOK false, HasSeparator false).
type Value struct {
	// Raw is the annotation value as found; Present says whether the key was set at all.
	Raw     string
	Present bool
	// State is the branch HAMi takes for this value.
	State State
	// HasSeparator reports whether the value contains "_" (HAMi v2.9.0 panics on a Requesting
	// value without it).
	HasSeparator bool
	// Time is the timestamp after the first "_", parsed with [Layout] in the given location;
	// TimeOK is false when it does not parse (e.g. the pre-2024 "2024.05.27 09:48:48" layout or
	// an RFC 3339 time).
	Time   time.Time
	TimeOK bool
}

// Parse classifies a handshake annotation value. present is whether the key exists on the
// Node; loc is the time zone of the timestamps (nil means time.Local, as HAMi uses).
func Parse(raw string, present bool, loc *time.Location) Value {
	v := Value{Raw: raw, Present: present}
	if !present {
		v.State = StateAbsent
		return v
	}
	switch {
	case strings.Contains(raw, "Requesting"):
		v.State = StateRequesting
	case strings.Contains(raw, "Deleted"):
		v.State = StateDeleted
	default:
		v.State = StateOther
		return v
	}
	_, rest, ok := strings.Cut(raw, "_")
	v.HasSeparator = ok
	if !ok {
		return v
	}
	loc = cmp.Or(loc, time.Local)
	if t, err := time.ParseInLocation(Layout, rest, loc); err == nil {
		v.Time, v.TimeOK = t, true
	}
	return v
}

// FromAnnotations parses the handshake value stored under key in a Node's annotations.
func FromAnnotations(annotations map[string]string, key string, loc *time.Location) Value {
	raw, ok := annotations[key]
	return Parse(raw, ok, loc)
}

// Requesting formats the value the scheduler stamps: "Requesting_" and now in loc (nil means
// time.Local) with [Layout].
func Requesting(now time.Time, loc *time.Location) string {
	return PrefixRequesting + format(now, loc)
}

// Deleted formats the cleanup value HAMi v2.9.0 writes ("Deleted_" and now); HAMi master
// deletes the key instead.
func Deleted(now time.Time, loc *time.Location) string {
	return PrefixDeleted + format(now, loc)
}

func format(now time.Time, loc *time.Location) string {
	return now.In(cmp.Or(loc, time.Local)).Format(Layout)
}
