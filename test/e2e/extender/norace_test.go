//go:build !race

package extender_test

// race: the test binary runs without the race detector (benchmarks), so the extender is
// built without it too.
const race = false
