//go:build !race

package mig_test

// race: the test binary runs without the race detector (benchmarks), so the programs are
// built without it too.
const race = false
