//go:build !race

package quickstart_test

// race: the test binary runs without the race detector, so the quickstart is built without it.
const race = false
