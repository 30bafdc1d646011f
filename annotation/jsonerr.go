package annotation

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"

	"github.com/hamireg/hamireg/internal/hamiwire"
)

// jsonError turns an error of encoding/json into a [*DecodeError] wrapping [ErrMalformed], with
// the byte offset of the problem in data. With elem >= 0 the error came from decoding raw, the
// elem-th element of the list in data.
//
// encoding/json counts a syntax error's offset after the offending byte and a type error's
// after the value (or after the opening bracket of an object or array); DecodeError.Offset is
// where the offending byte or value starts, so that an excerpt can point at it. Finding that
// start re-reads the value; it runs only on the failure path.
func jsonError(err error, data []byte, elem int, raw []byte) *DecodeError {
	de := &DecodeError{Kind: ErrMalformed, Offset: -1, Element: -1, Msg: err.Error()}
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		de.Offset = int(syntax.Offset)
		if de.Offset > 0 && !strings.HasPrefix(syntax.Error(), "unexpected end") {
			de.Offset-- // the offending byte, which encoding/json has already counted
		}
	case errors.As(err, &typ):
		de.Field, _, _ = strings.Cut(typ.Field, ".") // the device's key, for a nested value too
		de.Msg = typeMessage(typ)
		if elem < 0 {
			de.Offset = valueStart(data, typ.Offset)
		} else {
			de.Element = elem
			de.Offset = elementStart(data, elem) + valueStart(raw, typ.Offset)
		}
	}
	return de
}

// typeMessage says what was wrong with a value: "number 1.5 is not an int32", "cannot decode
// string into bool".
func typeMessage(e *json.UnmarshalTypeError) string {
	if strings.HasPrefix(e.Value, "number ") {
		switch k := e.Type.Kind(); {
		case k >= reflect.Int && k <= reflect.Int64:
			return e.Value + " is not an " + k.String()
		case k >= reflect.Uint && k <= reflect.Uintptr:
			return e.Value + " is not an unsigned integer (" + k.String() + ")"
		case k == reflect.Float32 || k == reflect.Float64:
			return e.Value + " does not fit a " + k.String()
		}
	}
	return "cannot decode " + e.Value + " into " + typeWords(e.Type)
}

// typeWords names a wire type for an error message.
func typeWords(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[[]json.RawMessage]():
		return "a device list"
	case reflect.TypeFor[hamiwire.DeviceMaster](), reflect.TypeFor[hamiwire.DeviceV290]():
		return "a device"
	case reflect.TypeFor[[]hamiwire.MigProfile]():
		return "a MIG profile list"
	case reflect.TypeFor[hamiwire.MigProfile]():
		return "a MIG profile"
	case reflect.TypeFor[[]hamiwire.MigPlacement]():
		return "a MIG placement list"
	case reflect.TypeFor[hamiwire.MigPlacement]():
		return "a MIG placement"
	case reflect.TypeFor[[][]hamiwire.MigTemplate](), reflect.TypeFor[[]hamiwire.MigTemplate]():
		return "a MIG template list"
	case reflect.TypeFor[hamiwire.MigTemplate]():
		return "a MIG template"
	case reflect.TypeFor[map[string]any]():
		return "a custom info map"
	case reflect.TypeFor[[]hamiwire.PairScore]():
		return "a pair score list"
	case reflect.TypeFor[hamiwire.PairScore]():
		return "a device pair score"
	case reflect.TypeFor[map[string]int]():
		return "a score map"
	}
	return t.String()
}

// valueStart returns where the value that encoding/json reported at offset off of the valid
// JSON data begins: the last token starting before off that does not close an object or array.
// (off is just past a scalar, just past an opening bracket, or one byte further for a number
// that overflows float64.)
func valueStart(data []byte, off int64) int {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // a token must never fail on a number's range
	start := 0
	for {
		prev := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return start
		}
		s := int(prev) + separators(data[prev:])
		if int64(s) >= off {
			return start
		}
		if d, ok := tok.(json.Delim); !ok || d == '[' || d == '{' {
			start = s
		}
	}
}

// elementStart returns where the i-th element of the valid JSON list data begins.
func elementStart(data []byte, i int) int {
	dec := json.NewDecoder(bytes.NewReader(data))
	if _, err := dec.Token(); err != nil { // '['
		return -1
	}
	for n := 0; ; n++ {
		prev := dec.InputOffset()
		if n == i {
			return int(prev) + separators(data[prev:])
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return -1
		}
	}
}

// separators counts the whitespace, commas and colons at the start of b: what the JSON decoder
// skips before the next token.
func separators(b []byte) int {
	n := 0
	for n < len(b) && strings.IndexByte(" \t\r\n,:", b[n]) >= 0 {
		n++
	}
	return n
}
