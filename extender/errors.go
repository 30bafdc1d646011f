package extender

import (
	"errors"
	"fmt"
)

// Sentinel errors.
var (
	// ErrInvalidOptions means New rejected its arguments.
	ErrInvalidOptions = errors.New("invalid options")
	// ErrAlreadyRunning means Run was called a second time.
	ErrAlreadyRunning = errors.New("already running")
	// ErrBadRequest means a request to a route did not decode or lacked a required field.
	ErrBadRequest = errors.New("bad request")
	// ErrNotReady means the node cache or the pod usage had not synced before the request's
	// context ended.
	ErrNotReady = errors.New("extender not ready")
	// ErrPodNotFound means a bind named a pod the extender cannot find (or with another UID).
	ErrPodNotFound = errors.New("pod not found")
)

// RequestError is a request that the extender refused: the route, and why (it unwraps to
// [ErrBadRequest] and to the decoding error, if any).
type RequestError struct {
	Route string
	Err   error
}

func (e *RequestError) Error() string {
	return fmt.Sprintf("%s: %v: %v", e.Route, ErrBadRequest, e.Err)
}

// Unwrap returns ErrBadRequest and the underlying error.
func (e *RequestError) Unwrap() []error { return []error{ErrBadRequest, e.Err} }
