package register

import (
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Sentinel errors: test with errors.Is. Errors about the Node are [*WriteError] values that
// unwrap to one of these and to the API error behind them.
var (
	// ErrNoNodeName means no node name was given: [New] got an empty name, or neither
	// NODE_NAME nor the legacy NodeName variable is set ([NodeNameFromEnv]).
	ErrNoNodeName = errors.New("node name not set")
	// ErrInvalidNodeName means the node name is not a valid Node name (a DNS subdomain).
	ErrInvalidNodeName = errors.New("invalid node name")
	// ErrInvalidOptions means [New] was given options it cannot work with.
	ErrInvalidOptions = errors.New("invalid options")
	// ErrForbidden means the API server refused the request for lack of RBAC permission. The
	// [*WriteError] message names the identity and the kubectl auth can-i check to run.
	ErrForbidden = errors.New("forbidden")
	// ErrNodeNotFound means the Node does not exist (yet). [Writer.Run] waits for it to appear
	// instead of retrying.
	ErrNodeNotFound = errors.New("node not found")
	// ErrAPI is any other failure of a request to the API server (network, timeout, server
	// error, conflict); it is retried with backoff.
	ErrAPI = errors.New("api request failed")
	// ErrAlreadyRunning means [Writer.Run] was called while another Run of the same Writer
	// had not returned.
	ErrAlreadyRunning = errors.New("writer already running")
	// ErrNoDevices means [Writer.Sync] was called before the first [Writer.SetDevices]: the
	// Writer does not know yet what to write.
	ErrNoDevices = errors.New("no devices set")
)

// WriteError describes a failed read or write of the Node. It unwraps to its class (one of
// [ErrForbidden], [ErrNodeNotFound], [ErrAPI]) and to the underlying error, so that both
// errors.Is(err, register.ErrForbidden) and apierrors.IsForbidden(err) hold.
type WriteError struct {
	// Verb is the API verb that failed: "patch", "get", "list" or "watch".
	Verb string
	// Node is the name of the Node.
	Node string
	// Key is the annotation key being written.
	Key string
	// User is the identity the API server named in a Forbidden answer, e.g.
	// "system:serviceaccount:kube-system:hami-device-plugin"; empty when unknown.
	User string
	// Kind is the class of the failure: [ErrForbidden], [ErrNodeNotFound] or [ErrAPI].
	Kind error
	// Err is the error returned by the client (nil when the Node was simply absent from the
	// informer's cache).
	Err error
}

// Error implements error. A Forbidden error names the ServiceAccount (or user) and the
// command that checks the permission, e.g.
//
//	patch node "gpu-1" annotation hami.io/node-nvidia-register: forbidden: ServiceAccount
//	kube-system/hami-device-plugin may not patch nodes; check with `kubectl auth can-i patch
//	nodes --as=system:serviceaccount:kube-system:hami-device-plugin`: nodes "gpu-1" is
//	forbidden: User "system:serviceaccount:kube-system:hami-device-plugin" cannot patch …
func (e *WriteError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s node %q", e.Verb, e.Node)
	if e.Verb == "patch" && e.Key != "" {
		fmt.Fprintf(&b, " annotation %s", e.Key)
	}
	b.WriteString(": ")
	b.WriteString(e.Kind.Error())
	if errors.Is(e.Kind, ErrForbidden) {
		b.WriteString(": ")
		b.WriteString(forbiddenHint(e.Verb, e.User))
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns the class and the underlying error.
func (e *WriteError) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

const serviceAccountPrefix = "system:serviceaccount:"

// forbiddenHint says who may not do what and how to check it.
func forbiddenHint(verb, user string) string {
	if rest, ok := strings.CutPrefix(user, serviceAccountPrefix); ok {
		if ns, name, ok := strings.Cut(rest, ":"); ok {
			return fmt.Sprintf("ServiceAccount %s/%s may not %s nodes; check with `kubectl auth can-i %s nodes --as=%s`",
				ns, name, verb, verb, user)
		}
	}
	if user != "" {
		return fmt.Sprintf("user %q may not %s nodes; check with `kubectl auth can-i %s nodes --as=%s`", user, verb, verb, user)
	}
	return fmt.Sprintf("the device plugin's ServiceAccount may not %s nodes; check with `kubectl auth can-i %s nodes --as=system:serviceaccount:NAMESPACE:NAME`",
		verb, verb)
}

// forbiddenUser returns the identity named in the API server's RBAC denial message:
// `nodes "x" is forbidden: User "system:serviceaccount:ns:sa" cannot patch resource …`.
func forbiddenUser(msg string) string {
	_, rest, ok := strings.Cut(msg, `User "`)
	if !ok {
		return ""
	}
	user, rest, ok := strings.Cut(rest, `"`)
	if !ok || !strings.HasPrefix(rest, " cannot") {
		return ""
	}
	return user
}

// classify turns a client error into a [*WriteError].
func classify(verb, node, key string, err error) *WriteError {
	we := &WriteError{Verb: verb, Node: node, Key: key, Kind: ErrAPI, Err: err}
	switch {
	case apierrors.IsForbidden(err):
		we.Kind = ErrForbidden
		we.User = forbiddenUser(err.Error())
	case apierrors.IsNotFound(err):
		we.Kind = ErrNodeNotFound
	}
	return we
}
