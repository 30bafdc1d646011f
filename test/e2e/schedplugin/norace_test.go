//go:build !race

package schedplugin_test

// race builds the programs under test without the race detector, as this test binary.
const race = false
