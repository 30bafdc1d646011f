package nodeagent_test

import (
	"net"
	"strconv"
	"testing"

	"github.com/hamireg/hamireg/nodeagent"
)

func TestMetricsAddress(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		in, want string
		ok       bool
	}{
		"HAMi's default":  {in: ":9394", want: ":9394", ok: true},
		"host and port":   {in: "127.0.0.1:0", want: "127.0.0.1:0", ok: true},
		"IPv6":            {in: "[::1]:9394", want: "[::1]:9394", ok: true},
		"off, empty":      {in: "", want: "", ok: true},
		"off, zero":       {in: "0", want: "", ok: true},
		"no port":         {in: "9394"},
		"named port":      {in: ":http"},
		"port too large":  {in: ":65536"},
		"negative port":   {in: ":-1"},
		"empty port":      {in: "127.0.0.1:"},
		"too many colons": {in: "::1:9394"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := nodeagent.ParseMetricsAddress(tc.in)
			if (err == nil) != tc.ok || got != tc.want {
				t.Errorf("ParseMetricsAddress(%q) = %q, %v; want %q, ok %v", tc.in, got, err, tc.want, tc.ok)
			}
		})
	}
}

// FuzzMetricsAddress: any flag value is answered without a panic, and an address accepted is
// host:port with a port of [0, 65535], or "" for none.
func FuzzMetricsAddress(f *testing.F) {
	for _, s := range []string{":9394", "0", "", "127.0.0.1:0", "[::1]:80", ":http", "a:b:c", ":99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := nodeagent.ParseMetricsAddress(in)
		if err != nil || got == "" {
			return
		}
		_, port, err := net.SplitHostPort(got)
		if err != nil {
			t.Fatalf("accepted %q: %v", in, err)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			t.Fatalf("accepted %q with port %q", in, port)
		}
	})
}
