package annotation

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors: every error returned by the decoders in this package is one of these
// (test with errors.Is), usually wrapped in a [*DecodeError] that carries the detail.
var (
	// ErrAbsent means the node has no annotation under the vendor's register key.
	// HAMi's scheduler logs "Failed to get node devices" and skips the vendor.
	ErrAbsent = errors.New("annotation absent")
	// ErrMalformed means the value is not what HAMi's decoder accepts: bad JSON, a value of the
	// wrong type or out of range, a legacy string that does not parse. HAMi's scheduler logs
	// "failed to decode node devices" and the node does not register for that vendor.
	ErrMalformed = errors.New("annotation malformed")
	// ErrNoDevices means the value decoded to no devices (null or []). HAMi's scheduler logs
	// "no nvidia gpu device found" and the node does not register.
	ErrNoDevices = errors.New("annotation lists no devices")
	// ErrInvalidElement means the list contains a null element. HAMi's decoder accepts it and
	// its scheduler then crashes on the nil device; this package rejects it instead.
	ErrInvalidElement = errors.New("annotation has an invalid device element")
	// ErrIncompleteVendor means a [Vendor] lacks a field a part needs ([Vendor.Validate]).
	ErrIncompleteVendor = errors.New("incomplete vendor")
)

// DecodeError describes why a value could not be decoded. It unwraps to one of the sentinel
// errors ([ErrMalformed], [ErrInvalidElement], [ErrNoDevices], [ErrAbsent]).
type DecodeError struct {
	// Key is the annotation key, when known.
	Key string
	// Kind is the sentinel class of the failure.
	Kind error
	// Offset is the byte offset in the value where the problem was found (-1 if none).
	Offset int
	// Element is the index of the device element concerned (-1 if none).
	Element int
	// Field is the JSON key whose value was rejected ("" if none).
	Field string
	// Msg is the cause in words.
	Msg string
}

// Error implements error.
func (e *DecodeError) Error() string {
	var b strings.Builder
	b.WriteString("decode ")
	if e.Key != "" {
		b.WriteString(e.Key)
	} else {
		b.WriteString("register annotation")
	}
	b.WriteString(": ")
	b.WriteString(e.Kind.Error())
	if e.Offset >= 0 {
		fmt.Fprintf(&b, " at offset %d", e.Offset)
	}
	switch {
	case e.Element >= 0 && e.Field != "":
		fmt.Fprintf(&b, " (device %d, field %q)", e.Element, e.Field)
	case e.Element >= 0:
		fmt.Fprintf(&b, " (device %d)", e.Element)
	case e.Field != "":
		fmt.Fprintf(&b, " (field %q)", e.Field)
	}
	if e.Msg != "" {
		b.WriteString(": ")
		b.WriteString(e.Msg)
	}
	return b.String()
}

// Unwrap returns the sentinel class.
func (e *DecodeError) Unwrap() error { return e.Kind }
