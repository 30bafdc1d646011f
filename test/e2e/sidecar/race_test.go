//go:build race

package sidecar_test

// race: the test binary runs with the race detector, so the extender is built with it too.
const race = true
