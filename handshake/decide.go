package handshake

import (
	"time"

	"github.com/hamireg/hamireg/annotation"
)

// Version selects whose semantics the decision functions follow: HAMi's release,
// [annotation.Version].
type Version = annotation.Version

const (
	// VersionMaster is HAMi master (v2.10), the default: a Deleted_ value is re-stamped at once,
	// an unparsable Requesting_ value counts as healthy, cleanup deletes the key.
	VersionMaster = annotation.VersionMaster
	// VersionV290 is HAMi v2.9.0: Deleted_ has a 60 s cooldown, an unparsable Requesting_ time
	// is the zero time (expired), cleanup writes Deleted_<now>.
	VersionV290 = annotation.VersionV290
)

// Options tune the decision functions. The zero value means HAMi master's defaults.
type Options struct {
	// Window is how long a stamp counts as fresh. Zero means [DefaultWindow] (60 s).
	Window time.Duration
	// Location is the time zone of timestamps. Nil means time.Local, as HAMi.
	Location *time.Location
	// Version selects HAMi master (default) or v2.9.0 semantics.
	Version Version
}

func (o Options) window() time.Duration {
	if o.Window <= 0 {
		return DefaultWindow
	}
	return o.Window
}

// Action is the write the scheduler should make to the handshake annotation.
type Action int

const (
	// ActionNone means: leave the annotation alone.
	ActionNone Action = iota
	// ActionStamp means: write NewValue ("Requesting_<now>").
	ActionStamp
	// ActionCleanup means the node is unhealthy and registered; remove it from the cache and clean
	// the handshake up (master: delete the key; v2.9.0: write NewValue "Deleted_<now>").
	ActionCleanup
)

// String returns the action's name.
func (a Action) String() string {
	switch a {
	case ActionNone:
		return "none"
	case ActionStamp:
		return "stamp"
	case ActionCleanup:
		return "cleanup"
	default:
		return "unknown"
	}
}

// Result is the outcome of HAMi's shared, vendor-agnostic health check ([Check]).
type Result struct {
	// Healthy and NeedUpdate are CheckHealth's two results.
	Healthy, NeedUpdate bool
	// Action is ActionStamp when the check writes a new Requesting_ value, else ActionNone.
	Action Action
	// NewValue is the value to write for ActionStamp.
	NewValue string
	// Reason says in words why, for logs and the doctor.
	Reason string
}

// Check is HAMi's shared CheckHealth for one vendor of one node, as a pure function: the parsed
// handshake value, the node's allocatable count of the vendor's resource, and the current time.
// It never panics (HAMi v2.9.0 does on a Requesting value without "_"; this returns HAMi
// master's answer for it instead).
func Check(v Value, allocatable int64, now time.Time, opts Options) Result {
	window := opts.window()
	stamp := func(reason string) Result {
		return Result{Healthy: true, NeedUpdate: true, Action: ActionStamp, NewValue: Requesting(now, opts.Location), Reason: reason}
	}
	switch v.State {
	case StateRequesting:
		ts := v.Time
		if !v.HasSeparator {
			return Result{Healthy: true, Reason: "Requesting value without a timestamp: kept as is (HAMi v2.9.0 crashes on it)"}
		}
		if !v.TimeOK {
			if opts.Version == VersionMaster {
				return Result{Healthy: true, Reason: "Requesting timestamp does not parse: kept as is"}
			}
			ts = time.Time{} // v2.9.0 ignores the parse error: the zero time, long expired
		}
		if now.Before(ts.Add(window)) {
			return Result{Healthy: true, Reason: "handshake fresh"}
		}
		if allocatable > 0 {
			return Result{Healthy: true, Reason: "Handshake expired but Allocatable still present, skipping NodeCleanUp"}
		}
		return Result{Reason: "handshake expired and allocatable is 0"}
	case StateDeleted:
		if opts.Version == VersionMaster {
			return stamp("Deleted handshake: re-stamped")
		}
		if !v.HasSeparator || !v.TimeOK {
			return Result{Healthy: true, Reason: "Deleted value without a parsable timestamp: kept as is"}
		}
		if now.Before(v.Time.Add(window)) {
			return Result{Healthy: true, Reason: "Deleted handshake within its cooldown"}
		}
		return stamp("Recovering stale Deleted_ handshake")
	case StateAbsent:
		return stamp("New timestamp for annotation")
	default:
		return stamp("New timestamp for annotation (replacing a foreign value)")
	}
}

// Input is what the scheduler knows about one node for [Decide].
type Input struct {
	// Handshake is the parsed handshake annotation ([Parse]).
	Handshake Value
	// Allocatable is the node's current allocatable count of the vendor's resource.
	Allocatable int64
	// Reported is the allocatable count this scheduler saw for the node last time (0 when it
	// never saw the node or forgot it on cleanup); Decision.Reported is the value to keep.
	Reported int64
	// RegisterChanged is true when the raw register annotation differs from the value last
	// seen (HAMi master reloads the devices then).
	RegisterChanged bool
	// Registered is true when the node is currently in the scheduler's cache for this vendor.
	Registered bool
	// Now is the current time.
	Now time.Time
}

// Decision is the outcome of [Decide].
type Decision struct {
	// Healthy reports whether the node may stay in or enter the cache.
	Healthy bool
	// NeedUpdate reports whether the node's devices should be (re)loaded into the cache.
	NeedUpdate bool
	// Action is the write to make to the handshake annotation.
	Action Action
	// NewValue is the value to write for ActionStamp, and for ActionCleanup in v2.9.0.
	NewValue string
	// Delete is true for ActionCleanup in master: remove the handshake key.
	Delete bool
	// Reported is the allocatable count to remember for the next call.
	Reported int64
	// Reason says in words why.
	Reason string
}

// Decide is HAMi's NVIDIA health decision for one node as a pure function: the shared
// [Check] followed by the allocatable tracking of HAMi's NVIDIA wrapper, then the cleanup
// decision the scheduler makes for an unhealthy registered node.
//
// One deliberate difference from HAMi, in both versions: a node whose allocatable count is 0 is
// never reported healthy because of a fresh stamp. HAMi re-stamps an absent or foreign value,
// answers healthy with needUpdate, re-adds the node although no GPU is allocatable, and cleans
// it up again a minute later, for as long as the annotation stays (the flap of spec §6.3). Here
// the stamp is still written, but the node is not (re-)added until allocatable returns.
func Decide(in Input, opts Options) Decision {
	r := Check(in.Handshake, in.Allocatable, in.Now, opts)
	d := Decision{Healthy: r.Healthy, NeedUpdate: r.NeedUpdate, Action: r.Action, NewValue: r.NewValue,
		Reported: in.Reported, Reason: r.Reason}
	switch {
	case in.Allocatable <= 0:
		if in.Reported != 0 {
			d.Reported = 0
			d.Healthy = false
			d.Reason = "allocatable dropped to 0: devices vanished"
		} else if r.Action == ActionStamp {
			d.Healthy, d.NeedUpdate = false, false
			d.Reason = r.Reason + "; allocatable is 0, so the node is not added (HAMi would add it and flap)"
		}
	case in.Reported != in.Allocatable:
		d.Reported = in.Allocatable
		d.Healthy, d.NeedUpdate = true, true
		if in.Reported == 0 {
			d.Reason = "first sighting with allocatable devices"
		} else {
			d.Reason = "allocatable count changed"
		}
	case in.RegisterChanged && opts.Version == VersionMaster:
		d.NeedUpdate = true
		d.Reason = "register annotation changed"
	}
	if !d.Healthy && in.Registered {
		d.Action = ActionCleanup
		d.NewValue = ""
		if opts.Version == VersionMaster {
			d.Delete = true
			d.Reported = 0
		} else {
			d.NewValue = Deleted(in.Now, opts.Location)
		}
		d.Reason = "Device is unhealthy, cleaning up node: " + d.Reason
	}
	return d
}
