package handshake_test

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/handshake"
)

// Example_usage compiles the package documentation's snippet.
func Example_usage() {
	step := func(node *corev1.Node, alloc, last int64, now time.Time) int64 {
		// snippet: doc
		v := handshake.FromAnnotations(node.Annotations, annotation.KeyNVIDIAHandshake, nil)
		d := handshake.Decide(handshake.Input{Handshake: v, Allocatable: alloc, Reported: last, Now: now}, handshake.Options{})
		last = d.Reported
		switch d.Action {
		case handshake.ActionNone: // leave the annotation alone
		case handshake.ActionStamp: // merge-patch the key to d.NewValue
		case handshake.ActionCleanup: // drop the node; delete the key (d.Delete) or write d.NewValue
		}
		// end snippet
		return last
	}
	_ = step
}
