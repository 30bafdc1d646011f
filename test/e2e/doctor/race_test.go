//go:build race

package doctor_test

// race: the test binary runs with the race detector, so the programs are built with it too.
const race = true
