//go:build race

package harness

// raceEnabled: the test binary runs with the race detector, so the programs the harness
// builds on its own (examples/scheduler) get it too and a race there fails the test.
const raceEnabled = true
