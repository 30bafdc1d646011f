//go:build race

package monitor_test

// race: the test binary runs with the race detector, so the plugin is built with it too.
const race = true
