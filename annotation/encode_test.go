package annotation

import "testing"

// TestHTMLSafeTable checks the bitmaps against encoding/json's rule for HTML-safe bytes.
func TestHTMLSafeTable(t *testing.T) {
	t.Parallel()
	for c := 0; c < 128; c++ {
		want := c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
		if got := htmlSafe(byte(c)); got != want {
			t.Errorf("htmlSafe(%#x) = %v, want %v", c, got, want)
		}
	}
}

// TestEncodeRepeatedStrings checks that reusing the escaped model and mode of the previous
// device gives the same bytes as escaping each one.
func TestEncodeRepeatedStrings(t *testing.T) {
	t.Parallel()
	devs := []Device{
		{ID: "a", Type: "NVIDIA <A100>", Mode: "hami-core"},
		{ID: "b", Type: "NVIDIA <A100>", Mode: "hami-core", Index: 1},
		{ID: "c", Type: "", Mode: "mig", Index: 2},
		{ID: "d", Type: "NVIDIA <A100>", Mode: "mig", Index: 3},
	}
	for _, shape := range []Shape{ShapeMaster, ShapeV290} {
		if got, want := EncodeShape(devs, shape), hamiMarshal(devs, shape); got != want {
			t.Errorf("%v:\n got %s\nwant %s", shape, got, want)
		}
	}
}
