package allocation

import (
	"errors"
	"fmt"
)

// Sentinel errors: every error returned by this package's decoders is one of these (test with
// errors.Is), through a [*DecodeError] that carries the detail.
var (
	// ErrMalformed means a pod device list does not have the shape HAMi writes: a device
	// with fewer than four comma-separated fields, or (with [VersionMaster]) a memory or core
	// value that is not a 32-bit integer.
	ErrMalformed = errors.New("pod device annotation malformed")
)

// ErrInvalidConfig is wrapped by [Config.WithDefaults] and [ConfigFor] for a setting HAMi cannot
// work with.
var ErrInvalidConfig = errors.New("invalid allocation config")

// DecodeError says where a pod device list could not be decoded. It unwraps to
// [ErrMalformed].
type DecodeError struct {
	// Container is the index of the container entry (init containers first), Device the index
	// of the device within it.
	Container, Device int
	// Field is "memory" or "cores" for a bad number, "" for missing fields.
	Field string
	// Msg says what is wrong, in HAMi's words where HAMi has them.
	Msg string
}

// Error implements error.
func (e *DecodeError) Error() string {
	return fmt.Sprintf("decode pod devices: %v (container %d, device %d): %s", ErrMalformed, e.Container, e.Device, e.Msg)
}

// Unwrap returns [ErrMalformed].
func (e *DecodeError) Unwrap() error { return ErrMalformed }
