//go:build !race

package extenderha_test

// race: the test binary runs without the race detector, so the extender is built without it
// too.
const race = false
