//go:build !race

package preemption_test

// race: the test binary runs without the race detector.
const race = false
