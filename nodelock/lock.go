package nodelock

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/annotation"
)

// Key is the Node annotation that holds HAMi's node lock, shared by every vendor
// ([annotation.KeyNodeLock]).
const Key = annotation.KeyNodeLock

// Lock is a parsed node lock value: "<RFC 3339 time>,<namespace>,<pod>", or only the time in
// the legacy form that does not name its owner.
type Lock struct {
	// Time is when the lock was taken, in UTC.
	Time time.Time
	// Namespace and Name name the pod that holds the lock. Both are empty in a legacy lock;
	// HAMi also accepts a value with empty parts ("<time>,,"), which names no pod either.
	Namespace string
	Name      string
}

// NewLock returns the lock value that pod takes at now: the time truncated to the second
// (HAMi writes seconds) in UTC.
func NewLock(now time.Time, pod types.NamespacedName) Lock {
	return Lock{Time: now.Truncate(time.Second).UTC(), Namespace: pod.Namespace, Name: pod.Name}
}

// Owner returns the pod the lock names, and false when it names none (a legacy time-only
// lock, or one with an empty namespace or pod name, which no pod can have).
func (l Lock) Owner() (types.NamespacedName, bool) {
	if l.Namespace == "" || l.Name == "" {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: l.Namespace, Name: l.Name}, true
}

// String formats the lock as the annotation value: "<time>,<namespace>,<pod>", or only the
// time when both namespace and pod are empty. The time is RFC 3339 in UTC, with fractional
// seconds only when it has any, so that [Parse] of a formatted lock gives the same Lock.
// HAMi writes the same layout in its local time zone; both parse to the same instant.
func (l Lock) String() string {
	t := l.Time.UTC().Format(time.RFC3339Nano)
	if l.Namespace == "" && l.Name == "" {
		return t
	}
	return t + "," + l.Namespace + "," + l.Name
}

// Parse parses a node lock value as HAMi does: a value with a comma must have exactly three
// comma-separated parts, time, namespace and pod; a value without a comma is the time alone
// (the legacy form). The time is RFC 3339 in any zone and is returned in UTC. Parts are not
// trimmed or validated further, as HAMi does not. An error wraps [ErrMalformed] and is a
// [*MalformedError] saying what is wrong.
func Parse(value string) (Lock, error) {
	parts := strings.Split(value, ",")
	var l Lock
	switch len(parts) {
	case 1: // legacy: the time alone
	case 3:
		l.Namespace, l.Name = parts[1], parts[2]
	default:
		return Lock{}, &MalformedError{Value: value,
			Reason: fmt.Sprintf("expected 3 parts, got %d (want <RFC 3339 time>,<namespace>,<pod>)", len(parts))}
	}
	t, err := time.Parse(time.RFC3339, parts[0])
	if err != nil {
		return Lock{}, &MalformedError{Value: value, Reason: fmt.Sprintf("time %q is not RFC 3339", parts[0]), Err: err}
	}
	l.Time = t.UTC()
	return l, nil
}

// FromAnnotations returns the node lock in a Node's annotations: present is false when the
// key is not set; err is [Parse]'s error for a value that is set but malformed. The device
// plugin uses it to find the pod it is allocating for.
func FromAnnotations(annotations map[string]string) (l Lock, present bool, err error) {
	value, ok := annotations[Key]
	if !ok {
		return Lock{}, false, nil
	}
	l, err = Parse(value)
	return l, true, err
}
