package nodelock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
)

// Sentinel errors: test with errors.Is. Each comes with a typed error that carries the detail.
var (
	// ErrMalformed means a node lock value does not parse ([*MalformedError]).
	ErrMalformed = errors.New("malformed node lock")
	// ErrLocked means another pod holds the node's lock and it has not expired
	// ([*LockedError]); kube-scheduler retries the bind later.
	ErrLocked = errors.New("node lock contention")
	// ErrNotOwner means [Locker.Release] found a lock that this pod does not hold and left it
	// in place ([*NotOwnerError]).
	ErrNotOwner = errors.New("not the lock owner")
	// ErrInvalidOptions means [New] was given options or a client it cannot work with.
	ErrInvalidOptions = errors.New("invalid options")
	// ErrInvalidArgument means a node or pod name that cannot be written into a lock: empty, or
	// containing a comma.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrChanged means [Locker.ReleaseIf] found a lock value other than the one it was told
	// to remove and left it in place ([*ChangedError]).
	ErrChanged = errors.New("node lock changed")
)

// MalformedError describes a node lock value that does not parse. It unwraps to
// [ErrMalformed] and to the time.Parse error, if that was the problem.
type MalformedError struct {
	// Value is the annotation value.
	Value string
	// Reason says what is wrong, e.g. "expected 3 parts, got 2 (…)".
	Reason string
	// Err is the time parsing error; nil when the number of parts is wrong.
	Err error
}

// Error implements error, e.g.
//
//	parse node lock "2026-05-19T09:14:52Z,default": expected 3 parts, got 2 (want <RFC 3339 time>,<namespace>,<pod>): malformed node lock
func (e *MalformedError) Error() string {
	msg := fmt.Sprintf("parse node lock %q: %s", e.Value, e.Reason)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg + ": " + ErrMalformed.Error()
}

// Unwrap returns [ErrMalformed] and the time parsing error.
func (e *MalformedError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrMalformed}
	}
	return []error{ErrMalformed, e.Err}
}

// LockedError is the contention error of [Locker.Acquire]: the node is locked by someone
// else and the lock has not expired. It unwraps to [ErrLocked] (and, for a value that does
// not parse, to its [*MalformedError]). Its message starts with HAMi's words, which
// kube-scheduler shows in the pod's events.
type LockedError struct {
	// Node is the locked Node.
	Node string
	// Value is the lock annotation as found.
	Value string
	// Lock is the parsed value; the zero Lock when Value is malformed.
	Lock Lock
	// Since is when the lock was taken: Lock.Time, or for a malformed value the latest time
	// the API server recorded for a write of the key (metadata.managedFields), an upper
	// bound of when it was written.
	Since time.Time
	// Age is the time from Since to the decision; negative for a lock dated in the future.
	Age time.Duration
	// Timeout is the Locker's expiry: the lock is taken over once Age exceeds it.
	Timeout time.Duration
	// Err is the [*MalformedError] of a malformed value, nil otherwise.
	Err error
}

// Error implements error, e.g.
//
//	node gpu-1 has been locked within 5m0s by pod default/train-0 since 2026-05-19T09:14:52Z (1m30s ago)
func (e *LockedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "node %s has been locked within %v by %s", e.Node, e.Timeout, holder(e.Lock, e.Value, e.Err))
	if e.Err != nil {
		fmt.Fprintf(&b, ", last written at %s (%s)", e.Since.Format(time.RFC3339), ago(e.Age))
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
		return b.String()
	}
	fmt.Fprintf(&b, " since %s (%s)", e.Since.Format(time.RFC3339), ago(e.Age))
	return b.String()
}

// Unwrap returns [ErrLocked] and the parse error of a malformed value.
func (e *LockedError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrLocked}
	}
	return []error{ErrLocked, e.Err}
}

// Holder describes who holds the lock: "pod <namespace>/<name>", "an unknown owner (legacy
// lock without a pod)" or "an unreadable value …".
func (e *LockedError) Holder() string { return holder(e.Lock, e.Value, e.Err) }

// NotOwnerError is returned by [Locker.Release] when the lock on the node is not this pod's;
// nothing was removed. It unwraps to [ErrNotOwner].
type NotOwnerError struct {
	// Node is the Node.
	Node string
	// Pod is the pod that asked for the release.
	Pod types.NamespacedName
	// Value is the lock annotation as found.
	Value string
}

// Error implements error, with HAMi's log message in it, e.g.
//
//	release lock of node gpu-1 for pod default/a: NodeLock is not set by this pod: held by pod default/b since 2026-05-19T09:14:52Z: not the lock owner
func (e *NotOwnerError) Error() string {
	l, err := Parse(e.Value)
	h := holder(l, e.Value, err)
	if err == nil {
		h += " since " + l.Time.Format(time.RFC3339)
	}
	return fmt.Sprintf("release lock of node %s for pod %s: NodeLock is not set by this pod: held by %s: %v", e.Node, e.Pod, h, ErrNotOwner)
}

// Unwrap returns [ErrNotOwner].
func (e *NotOwnerError) Unwrap() error { return ErrNotOwner }

// holder describes the owner of a lock value for messages.
func holder(l Lock, value string, parseErr error) string {
	if parseErr != nil {
		return fmt.Sprintf("an unreadable value %q", value)
	}
	if pod, ok := l.Owner(); ok {
		return "pod " + pod.String()
	}
	return "an unknown owner (legacy lock without a pod)"
}

// ago formats an age for messages, to the second.
func ago(d time.Duration) string {
	if d < 0 {
		return (-d).Round(time.Second).String() + " in the future"
	}
	return d.Round(time.Second).String() + " ago"
}

// ChangedError is returned by [Locker.ReleaseIf] when the node's lock is no longer the value
// it was asked to remove (someone took, renewed or replaced it since it was read); nothing
// was removed. It unwraps to [ErrChanged].
type ChangedError struct {
	// Node is the Node.
	Node string
	// Want is the value the caller asked to remove; Value the lock annotation as found.
	Want, Value string
}

// Error implements error, e.g.
//
//	unlock node gpu-1: the lock is now "2026-05-19T09:20:00Z,default,b" (pod default/b), not "2026-05-19T09:14:52Z,default,a"; nothing was removed (read it again): node lock changed
func (e *ChangedError) Error() string {
	l, err := Parse(e.Value)
	return fmt.Sprintf("unlock node %s: the lock is now %q (%s), not %q; nothing was removed (read it again): %v",
		e.Node, e.Value, holder(l, e.Value, err), e.Want, ErrChanged)
}

// Unwrap returns [ErrChanged].
func (e *ChangedError) Unwrap() error { return ErrChanged }

// APIError is a failed request to the API server. It unwraps to the client's error, so
// apierrors.IsForbidden(err) and friends work.
type APIError struct {
	// Verb is "get" or "patch".
	Verb string
	// Resource is "node" or "pod".
	Resource string
	// Name is the Node's name or the pod's namespace/name.
	Name string
	// Err is the error of the client.
	Err error
}

// Error implements error. A Forbidden error names the permissions the lock needs, e.g.
//
//	patch node "gpu-1": forbidden (the node lock needs get and patch on nodes, get on pods: see nodelock.ClusterRoleRules): nodes "gpu-1" is forbidden: User "system:serviceaccount:kube-system:hami-scheduler" cannot patch resource "nodes" …
func (e *APIError) Error() string {
	if apierrors.IsForbidden(e.Err) {
		return fmt.Sprintf("%s %s %q: forbidden (the node lock needs get and patch on nodes, get on pods: see nodelock.ClusterRoleRules): %v",
			e.Verb, e.Resource, e.Name, e.Err)
	}
	return fmt.Sprintf("%s %s %q: %v", e.Verb, e.Resource, e.Name, e.Err)
}

// Unwrap returns the client's error.
func (e *APIError) Unwrap() error { return e.Err }

// transient reports whether the request may succeed when sent again: not a refusal (RBAC,
// authentication), not a missing object, not a request the server rejects as such. A 409
// Conflict is not transient: it is answered by reading the Node again.
func (e *APIError) transient() bool {
	err := e.Err
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false
	case apierrors.IsConflict(err), apierrors.IsForbidden(err), apierrors.IsUnauthorized(err), apierrors.IsNotFound(err),
		apierrors.IsBadRequest(err), apierrors.IsInvalid(err), apierrors.IsMethodNotSupported(err),
		apierrors.IsNotAcceptable(err), apierrors.IsUnsupportedMediaType(err), apierrors.IsRequestEntityTooLargeError(err):
		return false
	}
	return true
}
