//go:build !race

package monitor_test

// race: the test binary runs without the race detector (benchmarks), so the plugin is
// built without it too.
const race = false
