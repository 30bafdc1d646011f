//go:build !race

package attack_test

// race: the test binary runs without the race detector, so the programs are built without
// it too.
const race = false
