package mig_test

import (
	"errors"
	"testing"

	"github.com/hamireg/hamireg/mig"
)

// A MatchRule reads back what it writes, so that it can be a flag; other words are refused
// with ErrInvalidAllowlist.
func TestMatchRuleText(t *testing.T) {
	t.Parallel()
	for _, r := range []mig.MatchRule{mig.MatchWord, mig.MatchSubstring} {
		text, err := r.MarshalText()
		if err != nil {
			t.Fatalf("%v: %v", r, err)
		}
		var got mig.MatchRule = 99
		if err := got.UnmarshalText(text); err != nil || got != r {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", text, got, err, r)
		}
	}
	var r mig.MatchRule
	if err := r.UnmarshalText([]byte("prefix")); !errors.Is(err, mig.ErrInvalidAllowlist) {
		t.Errorf("UnmarshalText(prefix) = %v, want ErrInvalidAllowlist", err)
	}
	if _, err := mig.MatchRule(7).MarshalText(); !errors.Is(err, mig.ErrInvalidAllowlist) {
		t.Errorf("MarshalText(7) = %v, want ErrInvalidAllowlist", err)
	}
}
