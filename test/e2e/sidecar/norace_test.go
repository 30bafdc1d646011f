//go:build !race

package sidecar_test

// race: the test binary runs without the race detector, so the extender is built without it
// too.
const race = false
