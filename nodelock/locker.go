package nodelock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Client is the part of a clientset a [Locker] uses; clientset.CoreV1() is one.
type Client interface {
	corev1client.NodesGetter
	corev1client.PodsGetter
}

var _ Client = corev1client.CoreV1Interface(nil)

const (
	// DefaultTimeout is how old a lock must be to be taken over: HAMi's --node-lock-timeout
	// default (env HAMI_NODELOCK_EXPIRE).
	DefaultTimeout = 5 * time.Minute
	// FieldManager is the field manager named in the Locker's patches, so that
	// metadata.managedFields tells who wrote the lock.
	FieldManager = "hamireg-nodelock"
	// maxConflicts bounds how often one call reads the Node again after a 409 Conflict, that
	// is after someone else wrote the Node between the read and the patch.
	maxConflicts = 10
)

// DefaultBackoff returns the retry schedule for transient API errors, HAMi's: 5 tries, the
// first retry after 100 ms, doubling, each delay stretched by up to 50 % at random.
func DefaultBackoff() wait.Backoff {
	return wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: 5}
}

// Options configure a [Locker]. The zero value means the defaults documented on each field.
type Options struct {
	// Timeout is how old a lock must be before another pod takes it over. Default:
	// [DefaultTimeout] (5 min). Use the value HAMi's scheduler runs with when both take locks
	// on the same nodes.
	Timeout time.Duration
	// Clock is the source of the lock times and of the waits between retries. Default:
	// clock.RealClock{}.
	Clock clock.WithTicker
	// Backoff is the retry schedule for transient API errors (timeouts, 5xx, 429, network);
	// Steps is the number of tries. Default (the zero Backoff): [DefaultBackoff].
	Backoff wait.Backoff
	// Nodes, when set, is an informer's lister that a call reads the Node from first, instead
	// of a GET. Only two answers are taken from that copy: a write (the patch carries the
	// copy's resourceVersion, so a stale copy costs a 409 Conflict, after which the call reads
	// the Node from the API server), and [ErrLocked] for a lock of another pod that is not
	// expired and whose pod exists. Everything else (no lock to release, the pod's own lock,
	// someone else's lock at a release, an unreadable value, which needs managedFields) is
	// read again with a GET before it is answered. Default: nil, every read is a GET.
	Nodes corev1listers.NodeLister
	// Pods, when set, is an informer's lister that tells whether a lock's owner still holds
	// it: a pod found there is judged from that copy without a request (its phase and
	// creation time, see the package documentation's Takeover), one not found there is
	// looked up with a GET (the informer may not have delivered it yet). Default: nil, a GET.
	Pods corev1listers.PodLister
}

// Locker takes and releases HAMi's node lock; see the package documentation. It keeps no
// state between calls; create it with [New].
type Locker struct {
	client  Client
	timeout time.Duration
	clock   clock.WithTicker
	backoff wait.Backoff
	nodes   corev1listers.NodeLister
	pods    corev1listers.PodLister
}

// New returns a Locker that uses client (clientset.CoreV1()). It validates its arguments,
// returning an error wrapping [ErrInvalidOptions], and sends no request.
func New(client Client, opts Options) (*Locker, error) {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("new node locker: "+format+": %w", append(args, ErrInvalidOptions)...)
	}
	if client == nil {
		return nil, invalid("nil client")
	}
	l := &Locker{client: client, timeout: opts.Timeout, clock: opts.Clock, backoff: opts.Backoff, nodes: opts.Nodes, pods: opts.Pods}
	switch {
	case l.timeout < 0:
		return nil, invalid("negative Timeout %v", l.timeout)
	case l.timeout == 0:
		l.timeout = DefaultTimeout
	}
	if l.clock == nil {
		l.clock = clock.RealClock{}
	}
	b := l.backoff
	switch {
	case b == (wait.Backoff{}):
		l.backoff = DefaultBackoff()
	case b.Steps < 1:
		return nil, invalid("Backoff.Steps %d: at least one try is needed", b.Steps)
	case b.Duration < 0 || b.Cap < 0 || b.Factor < 0 || b.Jitter < 0:
		return nil, invalid("negative field in Backoff %+v", b)
	}
	return l, nil
}

// Timeout returns the age after which the Locker takes a lock over.
func (l *Locker) Timeout() time.Duration { return l.timeout }

// Acquire takes the lock on node for pod, as HAMi's scheduler does at bind. It GETs the
// Node and
//
//   - without a lock, writes "<now>,<namespace>,<pod>";
//   - with pod's own unexpired lock, succeeds without a write (HAMi master's re-lock);
//   - with a lock older than the timeout, or one whose owner no longer holds it, takes it
//     over, logging who held it and why: the owner pod does not exist (GET pod answers
//     NotFound), it finished (phase Succeeded or Failed), or the pod of that name was created
//     after the lock time (another pod under the same name);
//   - with an unreadable value, takes it over once the latest write of the key that the API
//     server recorded (managedFields) is older than the timeout, at once when none is recorded;
//   - otherwise returns a [*LockedError] (errors.Is [ErrLocked]) whose message starts with
//     HAMi's "node <node> has been locked within 5m0s".
//
// Every write is one JSON merge patch of the lock key carrying the resourceVersion that was
// read; a 409 Conflict reads the Node again and decides again, transient errors are retried
// with Options.Backoff. Other errors are [*APIError] values (apierrors.IsForbidden works).
// With Options.Nodes and Options.Pods, a free node costs one request (the patch) and a node
// locked by another live pod none.
func (l *Locker) Acquire(ctx context.Context, node string, pod types.NamespacedName) error {
	if err := validate(node, pod); err != nil {
		return fmt.Errorf("lock node %q for pod %s: %w", node, pod, err)
	}
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "node", klog.KRef("", node), "pod", klog.KRef(pod.Namespace, pod.Name))
	err := l.retry(ctx, logger, func(fromAPI bool) error {
		err := l.tryAcquire(ctx, logger, node, pod, fromAPI)
		if errors.Is(err, errConfirm) {
			err = l.tryAcquire(ctx, logger, node, pod, true)
		}
		return err
	})
	var locked *LockedError
	if err == nil || errors.As(err, &locked) {
		return err // a contention error keeps HAMi's words at the start
	}
	return fmt.Errorf("lock node %q for pod %s: %w", node, pod, err)
}

// errConfirm is tryAcquire's answer when the Node was read from Options.Nodes and the copy
// cannot decide: the caller reads it from the API server and decides again.
var errConfirm = errors.New("read the node from the API server")

// tryAcquire decides once, from the Node read from the API server, or from Options.Nodes
// when fromAPI is false (see there what that copy may decide).
func (l *Locker) tryAcquire(ctx context.Context, logger klog.Logger, node string, pod types.NamespacedName, fromAPI bool) error {
	n, cached, err := l.readNode(ctx, node, fromAPI)
	if err != nil {
		return err
	}
	now := l.clock.Now()
	want := NewLock(now, pod).String()
	value, present := n.Annotations[Key]
	if !present {
		if err := l.patch(ctx, node, n.ResourceVersion, &want); err != nil {
			return err
		}
		logger.V(3).Info("Node lock acquired", "lock", want)
		return nil
	}

	held, parseErr := Parse(value)
	if cached && parseErr != nil { // its write time is in managedFields, which informers drop
		return errConfirm
	}
	since := held.Time
	if parseErr != nil {
		since, _ = writtenAt(n)
	}
	age := now.Sub(since)
	locked := &LockedError{Node: node, Value: value, Lock: held, Since: since, Age: age, Timeout: l.timeout, Err: parseErr}
	owner, named := held.Owner()
	var reason string
	switch {
	case parseErr == nil && named && owner == pod && age <= l.timeout:
		if cached { // the copy may predate a release of this lock
			return errConfirm
		}
		logger.V(3).Info("Node lock already held by this pod", "lock", value)
		return nil
	case parseErr != nil && since.IsZero():
		reason = "unreadable value and no recorded write time"
	case age > l.timeout:
		reason = "expired"
	case parseErr == nil && named && owner != pod:
		var err error
		if reason, err = l.ownerGone(ctx, owner, held.Time); err != nil {
			return err
		}
		if reason == "" {
			return locked
		}
	default: // a lock without an owner to check, or unreadable, and not expired
		return locked
	}
	if err := l.patch(ctx, node, n.ResourceVersion, &want); err != nil {
		return err
	}
	logger.Info("Took over node lock", "reason", reason, "holder", locked.Holder(), "previous", value, "age", age.Round(time.Second), "lock", want)
	return nil
}

// Release removes the lock on node if pod holds it, as HAMi's device plugin does after the
// last Allocate of the pod and its scheduler does when a bind fails. The lock is pod's when
// the value ends in ",<namespace>,<pod>" (HAMi's test). No lock: nil. A lock of anyone else
// is left in place and reported as a [*NotOwnerError] (errors.Is [ErrNotOwner]; HAMi logs
// "NodeLock is not set by this pod"). The removal is a merge patch of the key to null with
// the resourceVersion read; conflicts and transient errors are handled as in [Locker.Acquire].
func (l *Locker) Release(ctx context.Context, node string, pod types.NamespacedName) error {
	if err := validate(node, pod); err != nil {
		return fmt.Errorf("unlock node %q for pod %s: %w", node, pod, err)
	}
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "node", klog.KRef("", node), "pod", klog.KRef(pod.Namespace, pod.Name))
	suffix := "," + pod.Namespace + "," + pod.Name
	removed, err := l.remove(ctx, logger, node, func(value string) error {
		if !strings.HasSuffix(value, suffix) {
			return &NotOwnerError{Node: node, Pod: pod, Value: value}
		}
		return nil
	})
	var notOwner *NotOwnerError
	switch {
	case err == nil && removed == "":
		logger.V(4).Info("No node lock to release")
	case err == nil:
		logger.V(3).Info("Node lock released", "lock", removed)
	case errors.As(err, &notOwner):
		return err
	default:
		return fmt.Errorf("unlock node %q for pod %s: %w", node, pod, err)
	}
	return nil
}

// ForceRelease removes whatever lock is on node, logging whose it was; no lock: nil. It is
// for operators and for cleaning up after a pod that will never be allocated; it uses the
// same conditional patch as [Locker.Release], so a lock written after its read is not lost
// silently but read and removed in turn.
func (l *Locker) ForceRelease(ctx context.Context, node string) error {
	if node == "" {
		return fmt.Errorf("force unlock node: empty node name: %w", ErrInvalidArgument)
	}
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "node", klog.KRef("", node))
	removed, err := l.remove(ctx, logger, node, func(string) error { return nil })
	if err != nil {
		return fmt.Errorf("force unlock node %q: %w", node, err)
	}
	if removed != "" {
		held, parseErr := Parse(removed)
		logger.Info("Force-released node lock", "holder", holder(held, removed, parseErr), "previous", removed)
	}
	return nil
}

// ReleaseIf removes the lock on node only if its value is still exactly value, the one a
// caller read and showed (a repair that a person confirmed); it is the conditional removal
// for operators that [Locker.ForceRelease] is not. A different value, whoever holds it, is
// left in place and reported as a [*ChangedError] (errors.Is [ErrChanged]). No lock: nil,
// as in [Locker.Release] (the value is gone either way; a caller that must know whether it
// removed it reads the Node first). The removal is the same merge patch of the key to null
// conditional on the resourceVersion read, so a lock written between the read and the
// patch gets a 409 Conflict, is read again and compared again. An empty node or value is
// [ErrInvalidArgument]; API failures are [*APIError] values.
func (l *Locker) ReleaseIf(ctx context.Context, node, value string) error {
	switch {
	case node == "":
		return fmt.Errorf("unlock node: empty node name: %w", ErrInvalidArgument)
	case value == "":
		return fmt.Errorf("unlock node %q: empty lock value (pass the value that was read): %w", node, ErrInvalidArgument)
	}
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "node", klog.KRef("", node))
	removed, err := l.remove(ctx, logger, node, func(found string) error {
		if found != value {
			return &ChangedError{Node: node, Want: value, Value: found}
		}
		return nil
	})
	var changed *ChangedError
	switch {
	case errors.As(err, &changed):
		return err
	case err != nil:
		return fmt.Errorf("unlock node %q: %w", node, err)
	case removed == "":
		logger.V(3).Info("No node lock to release", "expected", value)
	default:
		held, parseErr := Parse(removed)
		logger.Info("Released node lock", "holder", holder(held, removed, parseErr), "previous", removed)
	}
	return nil
}

// remove removes the lock from node if check accepts its value (returns nil), with a
// merge patch of the key to null conditional on the resourceVersion read, retried as
// [Locker.retry] does. It returns the value removed, "" when there was no lock.
func (l *Locker) remove(ctx context.Context, logger klog.Logger, node string, check func(value string) error) (string, error) {
	var removed string
	err := l.retry(ctx, logger, func(fromAPI bool) error {
		n, cached, err := l.readNode(ctx, node, fromAPI)
		if err != nil {
			return err
		}
		value, present := n.Annotations[Key]
		if cached && (!present || check(value) != nil) { // the copy may predate the lock
			if n, err = l.getNode(ctx, node); err != nil {
				return err
			}
			value, present = n.Annotations[Key]
		}
		if !present {
			return nil
		}
		if err := check(value); err != nil {
			return err
		}
		if err := l.patch(ctx, node, n.ResourceVersion, nil); err != nil {
			return err
		}
		removed = value
		return nil
	})
	return removed, err
}

// retry runs op until it succeeds or fails for good. A 409 Conflict (the Node changed after
// op read it) runs op again at once, up to maxConflicts times: op reads the Node again and
// decides again, from the API server (fromAPI true) from then on. A transient [*APIError] is
// retried after the next delay of the backoff. Any other error ends the loop.
func (l *Locker) retry(ctx context.Context, logger klog.Logger, op func(fromAPI bool) error) error {
	b := l.backoff
	conflicts, tries := 0, 1
	for {
		err := op(conflicts > 0)
		var apiErr *APIError
		switch {
		case err == nil:
			return nil
		case !errors.As(err, &apiErr):
			return err
		case apierrors.IsConflict(err) && conflicts < maxConflicts:
			conflicts++
			logger.V(4).Info("Node changed since it was read, reading it again", "conflicts", conflicts)
			continue
		case !apiErr.transient() || ctx.Err() != nil:
			return err
		case b.Steps <= 1:
			return fmt.Errorf("%w (gave up after %d tries)", err, tries)
		}
		delay := b.Step()
		tries++
		logger.V(2).Info("Node lock request failed, retrying", "err", err, "retryIn", delay)
		t := l.clock.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (retry cancelled: %w)", err, context.Cause(ctx))
		case <-t.C():
		}
	}
}

// readNode returns the Node from Options.Nodes unless fromAPI is set or the lister has no
// copy, else from the API server; cached tells which. The copy is the informer's: read only.
func (l *Locker) readNode(ctx context.Context, node string, fromAPI bool) (n *corev1.Node, cached bool, err error) {
	if l.nodes != nil && !fromAPI {
		if n, err := l.nodes.Get(node); err == nil {
			return n, true, nil
		}
	}
	n, err = l.getNode(ctx, node)
	return n, false, err
}

func (l *Locker) getNode(ctx context.Context, node string) (*corev1.Node, error) {
	n, err := l.client.Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, &APIError{Verb: "get", Resource: "node", Name: node, Err: err}
	}
	return n, nil
}

// Reasons a lock's owner no longer holds it, as logged at a takeover.
const (
	reasonOwnerNotFound = "owner pod not found"
	reasonOwnerFinished = "owner pod finished"
	reasonOwnerReplaced = "owner pod created after the lock: another pod under the name"
)

// ownerGone returns why the pod a lock taken at lockTime names no longer holds it, "" when
// it does: the pod does not exist, it finished (phase Succeeded or Failed: it will never be
// allocated), or the pod of that name was created after the lock was taken (it is another
// pod under the same name, which kube-scheduler has not bound yet). A copy in Options.Pods
// decides the same way without a request (each answer holds for any later state of the pod:
// a phase never leaves Succeeded or Failed, a creation time never changes); a pod not found
// there is looked up with a GET.
func (l *Locker) ownerGone(ctx context.Context, owner types.NamespacedName, lockTime time.Time) (string, error) {
	if l.pods != nil {
		if p, err := l.pods.Pods(owner.Namespace).Get(owner.Name); err == nil {
			return ownerState(p, lockTime), nil
		}
	}
	p, err := l.client.Pods(owner.Namespace).Get(ctx, owner.Name, metav1.GetOptions{})
	switch {
	case err == nil:
		return ownerState(p, lockTime), nil
	case apierrors.IsNotFound(err):
		return reasonOwnerNotFound, nil
	default:
		return "", &APIError{Verb: "get", Resource: "pod", Name: owner.String(), Err: err}
	}
}

// ownerClockSkew is how far the API server's clock (a pod's creation time) may run ahead of
// the clock of the lock's writer (the lock time) before a pod created after the lock time
// counts as another pod under the owner's name. A takeover on a skewed clock would hand a
// held node to a second pod, so the doubt goes to the owner.
const ownerClockSkew = 5 * time.Second

// ownerState is ownerGone for a pod that exists. The creation time is the API server's, the
// lock time the locker's clock, both in whole seconds: a pod created in the second of the
// lock, or up to ownerClockSkew after it, still counts as the owner.
func ownerState(p *corev1.Pod, lockTime time.Time) string {
	switch {
	case p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed:
		return reasonOwnerFinished
	case !p.CreationTimestamp.IsZero() && p.CreationTimestamp.Time.Truncate(time.Second).After(lockTime.Add(ownerClockSkew)):
		return reasonOwnerReplaced
	}
	return ""
}

// lockPatch is the merge patch of the lock key, in HAMi's field order:
// {"metadata":{"annotations":{"hami.io/mutex.lock":…},"resourceVersion":"…"}}. The
// resourceVersion makes the API server refuse the patch with 409 Conflict when the Node
// changed after it was read.
type lockPatch struct {
	Metadata struct {
		Annotations     map[string]*string `json:"annotations"`
		ResourceVersion string             `json:"resourceVersion"`
	} `json:"metadata"`
}

// patch sets the lock key to value, or removes it when value is nil, if the Node still has
// resourceVersion rv.
func (l *Locker) patch(ctx context.Context, node, rv string, value *string) error {
	var p lockPatch
	p.Metadata.Annotations = map[string]*string{Key: value}
	p.Metadata.ResourceVersion = rv
	body, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("encode lock patch of node %q: %w", node, err)
	}
	if _, err := l.client.Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
		return &APIError{Verb: "patch", Resource: "node", Name: node, Err: err}
	}
	return nil
}

// writtenAt returns the latest time that metadata.managedFields records for an entry that
// owns the lock key: the API server stamps an entry when its manager changes a field it owns,
// so the value was written at or before that time.
func writtenAt(n *corev1.Node) (time.Time, bool) {
	var latest time.Time
	for _, e := range n.ManagedFields {
		if e.Time == nil || e.FieldsV1 == nil {
			continue
		}
		var fields struct {
			Metadata struct {
				Annotations map[string]json.RawMessage `json:"f:annotations"`
			} `json:"f:metadata"`
		}
		if json.Unmarshal(e.FieldsV1.GetRawBytes(), &fields) != nil {
			continue
		}
		if _, owns := fields.Metadata.Annotations["f:"+Key]; owns && e.Time.After(latest) {
			latest = e.Time.UTC()
		}
	}
	return latest, !latest.IsZero()
}

// validate checks that the node is named and that the pod's namespace and name can be
// written into a lock value and read back.
func validate(node string, pod types.NamespacedName) error {
	switch {
	case node == "":
		return fmt.Errorf("empty node name: %w", ErrInvalidArgument)
	case pod.Namespace == "" || pod.Name == "":
		return fmt.Errorf("pod %q: namespace and name must be set: %w", pod.String(), ErrInvalidArgument)
	case strings.Contains(pod.Namespace, ",") || strings.Contains(pod.Name, ","):
		return fmt.Errorf("pod %q: a comma cannot be written into a node lock: %w", pod.String(), ErrInvalidArgument)
	}
	return nil
}
