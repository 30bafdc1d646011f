package nvmlscan

import (
	"strings"
	"testing"
)

func TestPCIBusIDNormal(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"00000000:07:00.0":   "0000:07:00.0",
		"00000000:3B:00.0":   "0000:3b:00.0",
		"0000:3b:00.0":       "0000:3b:00.0",
		"00000001:AF:00.1\t": "0001:af:00.1",
		"":                   "",
		"garbage":            "",
		"00000000:07":        "",
	} {
		if got := pciBusID(in); got != want {
			t.Errorf("pciBusID(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzPCIBusID: any input gives "" or a lower-case domain:bus:device.function with a 4-digit
// domain, and never panics.
func FuzzPCIBusID(f *testing.F) {
	for _, s := range []string{"00000000:07:00.0", "0000:3b:00.0", "", "::", "00000000:3B:00.0:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got := pciBusID(in)
		if got == "" {
			return
		}
		parts := strings.Split(got, ":")
		if len(parts) != 3 || len(parts[0]) != 4 || got != strings.ToLower(got) {
			t.Errorf("pciBusID(%q) = %q, not a normal bus ID", in, got)
		}
	})
}
