//go:build !race

package dramap_test

// race: the test binary runs without the race detector, so examples/extender is built
// without it too.
const race = false
