package nodelock_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/hamireg/hamireg/nodelock"
)

// FuzzParse checks that Parse never panics, that every error is a *MalformedError wrapping
// ErrMalformed and naming the value, that what it accepts is what HAMi's rule accepts (one
// part or three, the first an RFC 3339 time), and that String of a parsed Lock parses back
// to the same Lock.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"2026-05-19T09:14:52Z,default,gpu-pod", "2026-05-19T17:14:52+08:00,kube-system,p", "2026-05-19T09:14:52Z",
		"2026-05-19T09:14:52Z,default", "2026-05-19T09:14:52Z,a,b,c", "yesterday,default,gpu-pod", "",
		"2026-05-19T09:14:52Z,,", "2026-05-19T09:14:52.123456789-07:00,a,b", "2026-05-19 09:14:52", ",,", "\xff,a,b",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		l, err := nodelock.Parse(value)
		parts := strings.Split(value, ",")
		if err != nil {
			var me *nodelock.MalformedError
			if !errors.Is(err, nodelock.ErrMalformed) || !errors.As(err, &me) || me.Value != value {
				t.Fatalf("Parse(%q): error %v is not a *MalformedError of the value", value, err)
			}
			if l != (nodelock.Lock{}) {
				t.Fatalf("Parse(%q): %+v returned with an error", value, l)
			}
			return
		}
		switch len(parts) {
		case 1:
			if l.Namespace != "" || l.Name != "" {
				t.Fatalf("Parse(%q): legacy value with owner %q/%q", value, l.Namespace, l.Name)
			}
		case 3:
			if l.Namespace != parts[1] || l.Name != parts[2] {
				t.Fatalf("Parse(%q): owner %q/%q, want %q/%q", value, l.Namespace, l.Name, parts[1], parts[2])
			}
		default:
			t.Fatalf("Parse(%q) accepted %d parts", value, len(parts))
		}
		if l.Time.Location().String() != "UTC" {
			t.Fatalf("Parse(%q): time in %v, want UTC", value, l.Time.Location())
		}
		back, err := nodelock.Parse(l.String())
		if err != nil {
			t.Fatalf("Parse(%q).String() = %q does not parse: %v", value, l.String(), err)
		}
		if back != l {
			t.Fatalf("Parse(%q) = %+v, but Parse(String()) = %+v", value, l, back)
		}
	})
}
