//go:build !race

package acmeplugin_test

// race: the test binary runs without the race detector, so the plugin is built without it
// too.
const race = false
