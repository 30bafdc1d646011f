// Package handshake implements the scheduler's liveness handshake on GPU nodes: the annotation
// hami.io/node-handshake (NVIDIA; other vendors use hami.io/node-handshake-<vendor>) whose value
// is "Requesting_<2006-01-02 15:04:05>" after the scheduler stamps it, "Deleted_<time>" after a
// HAMi v2.9.0 cleanup, or absent after a HAMi master cleanup.
//
// The package is pure: no I/O, no clock reads, no logging. [Parse] classifies a value exactly
// the way HAMi's CheckHealth branches on it (substring match, the timestamp after the first
// "_" in the scheduler's local time zone), [Requesting] and [Deleted] format values, [Check] is
// HAMi's shared vendor-agnostic health check and [Decide] adds the NVIDIA wrapper's allocatable
// tracking and the cleanup decision. Callers supply the current time and remember
// Decision.Reported between calls; both functions follow HAMi master by default and v2.9.0 with
// Options.Version, and never panic.
//
// Reading a handshake correctly: an old Requesting_ timestamp on a healthy NVIDIA node is
// normal. Since HAMi v2.8 nobody refreshes it; after 60 s it expires and the node stays
// registered only because its allocatable count is above zero.
//
// One deliberate difference from HAMi is documented on [Decide]: a node with allocatable 0 is
// never reported healthy by a fresh stamp, which removes HAMi's add/cleanup flap.
//
// Usage:
//
//	v := handshake.FromAnnotations(node.Annotations, annotation.KeyNVIDIAHandshake, nil)
//	d := handshake.Decide(handshake.Input{Handshake: v, Allocatable: alloc, Reported: last, Now: now}, handshake.Options{})
//	last = d.Reported
//	switch d.Action {
//	case handshake.ActionNone: // leave the annotation alone
//	case handshake.ActionStamp: // merge-patch the key to d.NewValue
//	case handshake.ActionCleanup: // drop the node; delete the key (d.Delete) or write d.NewValue
//	}
package handshake
