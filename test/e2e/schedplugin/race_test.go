//go:build race

package schedplugin_test

// race builds the programs under test with the race detector, as this test binary has it.
const race = true
