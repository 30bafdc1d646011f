//go:build race

package quickstart_test

// race: the test binary runs with the race detector, so the quickstart is built with it too.
const race = true
