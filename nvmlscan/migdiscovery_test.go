package nvmlscan_test

import (
	"errors"
	"testing"

	"github.com/hamireg/hamireg/nvmlscan"
)

// A MIGDiscovery reads back what it writes, so that it can be a flag; other words are refused
// with ErrInvalidOptions.
func TestMIGDiscoveryText(t *testing.T) {
	t.Parallel()
	for _, d := range []nvmlscan.MIGDiscovery{nvmlscan.MIGDiscoveryBaseSlices, nvmlscan.MIGDiscoveryAllProfiles} {
		text, err := d.MarshalText()
		if err != nil {
			t.Fatalf("%v: %v", d, err)
		}
		var got nvmlscan.MIGDiscovery = 99
		if err := got.UnmarshalText(text); err != nil || got != d {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", text, got, err, d)
		}
	}
	var d nvmlscan.MIGDiscovery
	if err := d.UnmarshalText([]byte("rev")); !errors.Is(err, nvmlscan.ErrInvalidOptions) {
		t.Errorf("UnmarshalText(rev) = %v, want ErrInvalidOptions", err)
	}
	if _, err := nvmlscan.MIGDiscovery(7).MarshalText(); !errors.Is(err, nvmlscan.ErrInvalidOptions) {
		t.Errorf("MarshalText(7) = %v, want ErrInvalidOptions", err)
	}
}
