package handshake_test

import (
	"fmt"
	"time"

	"github.com/hamireg/hamireg/handshake"
)

func ExampleDecide() {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	opts := handshake.Options{Location: time.UTC}

	// First sighting: no handshake yet, 8 GPUs × 10 splits allocatable.
	d := handshake.Decide(handshake.Input{Handshake: handshake.Parse("", false, time.UTC), Allocatable: 80, Now: now}, opts)
	fmt.Println(d.Healthy, d.NeedUpdate, d.Action, d.NewValue)

	// Ten minutes later the stamp is old, which is normal: allocatable keeps the node healthy.
	later := now.Add(10 * time.Minute)
	v := handshake.Parse(d.NewValue, true, time.UTC)
	d = handshake.Decide(handshake.Input{Handshake: v, Allocatable: 80, Reported: d.Reported, Registered: true, Now: later}, opts)
	fmt.Println(d.Healthy, d.NeedUpdate, d.Action)

	// The device plugin died: allocatable dropped to 0, the node is cleaned up.
	d = handshake.Decide(handshake.Input{Handshake: v, Allocatable: 0, Reported: d.Reported, Registered: true, Now: later}, opts)
	fmt.Println(d.Healthy, d.Action, d.Delete)
	// Output:
	// true true stamp Requesting_2026-11-30 12:00:00
	// true false none
	// false cleanup true
}
