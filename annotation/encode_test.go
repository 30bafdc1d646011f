package annotation

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"unicode/utf8"
)

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

// unsafe8 flags exactly the words holding a byte that appendString must escape.
func TestUnsafe8(t *testing.T) {
	t.Parallel()
	needsEscape := func(c byte) bool { return c >= utf8.RuneSelf || !htmlSafe(c) }
	for c := range 256 {
		for pos := range 8 {
			w := []byte("abcdefgh")
			w[pos] = byte(c)
			if got := unsafe8(load8(string(w), 0)) != 0; got != needsEscape(byte(c)) {
				t.Fatalf("byte %#x at %d: unsafe8 %v", c, pos, got)
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		var w [8]byte
		want := false
		for i := range w {
			w[i] = byte(rng.IntN(256))
			if rng.IntN(4) > 0 {
				w[i] = byte(0x20 + rng.IntN(0x60)) // mostly printable ASCII
			}
			want = want || needsEscape(w[i])
		}
		if got := unsafe8(load8(string(w[:]), 0)) != 0; got != want {
			t.Fatalf("%q: unsafe8 %v, want %v", w, got, want)
		}
	}
}

func TestEncodedSizeIsExact(t *testing.T) {
	t.Parallel()
	for _, v := range []uint64{0, 1, 9, 10, 99, 100, 999, 1000, 9999, 10000, 99999, 100000, 999999, 1000000, 1 << 63, 1<<64 - 1} {
		if got, want := digits(v), len(strconv.FormatUint(v, 10)); got != want {
			t.Errorf("digits(%d) = %d, want %d", v, got, want)
		}
	}
	devs := benchDevices(8)
	devs[0].Index, devs[1].Numa, devs[2].Devmem, devs[3] = 0, -3, -1<<31, Device{}
	for _, list := range [][]Device{nil, {{}}, {{}, {Health: true}}, devs[:1], devs} {
		for _, shape := range []Shape{ShapeMaster, ShapeV290} {
			if got, want := encodedSize(list, shape), len(EncodeShape(list, shape)); got != want {
				t.Errorf("%d devices, %v: size %d, encoding %d bytes", len(list), shape, got, want)
			}
		}
	}
}
