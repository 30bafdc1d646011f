//go:build race

package attack_test

// race: the test binary runs with the race detector, so the programs are built with it too.
const race = true
