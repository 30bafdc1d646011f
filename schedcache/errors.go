package schedcache

import "errors"

// Sentinel errors. A [Registration] that is not registered carries an Err that is one of these
// or one of the annotation package's decode sentinels (annotation.ErrAbsent, ErrMalformed,
// ErrNoDevices, ErrInvalidElement), so callers can branch with errors.Is on every state.
var (
	// ErrInvalidOptions means New, NewElector or NewLeaseFollower rejected its arguments.
	ErrInvalidOptions = errors.New("invalid options")
	// ErrAlreadyRunning means Run was called a second time.
	ErrAlreadyRunning = errors.New("already running")
	// ErrUnhealthy means the node's devices decode but its handshake says it is gone: the
	// handshake expired with nothing allocatable, or allocatable dropped to 0.
	ErrUnhealthy = errors.New("node unhealthy")
	// ErrExcluded means the node's labels do not match Options.NodeSelector.
	ErrExcluded = errors.New("node excluded by selector")
)
