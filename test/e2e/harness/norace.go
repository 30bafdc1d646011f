//go:build !race

package harness

// raceEnabled: the test binary runs without the race detector.
const raceEnabled = false
