//go:build race

package dramap_test

// race: the test binary runs with the race detector, so examples/extender is built with it too.
const race = true
