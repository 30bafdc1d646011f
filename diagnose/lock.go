package diagnose

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/nodelock"
)

// lockVerdict is a node lock as read and judged: the state shown to the user and what the
// checks need besides.
type lockVerdict struct {
	state *LockState
	// holder is the holder pod, nil when gone, unknown or the value names none.
	holder *corev1.Pod
	// holderErr says why the holder could not be looked up ("" when it could).
	holderErr string
	// neverReleased says the holder is done (or runs) and the lock stayed: the node's plugin
	// does not release it (HAMi §8.1, #1130).
	neverReleased bool
}

// holderFunc looks a lock's holder pod up: (nil, nil) when it does not exist, an error when
// that could not be told.
type holderFunc func(types.NamespacedName) (*corev1.Pod, error)

// judgeLock reads hami.io/mutex.lock of the node and judges it; nil when there is none. It
// never fails: a value that does not parse is a stale lock with Error set.
func judgeLock(n *corev1.Node, now time.Time, timeout time.Duration, lookup holderFunc) *lockVerdict {
	value, present := n.Annotations[nodelock.Key]
	if !present {
		return nil
	}
	s := &LockState{Node: n.Name, Value: value}
	v := &lockVerdict{state: s}
	l, err := nodelock.Parse(value)
	if err != nil {
		s.Error = err.Error()
		s.Stale = "the value does not parse: HAMi's scheduler refuses every bind to the node and its device plugin every Allocate until it is removed"
		return v
	}
	s.Since = l.Time
	s.Age = now.Sub(l.Time)
	s.AgeSeconds = int64(s.Age / time.Second)
	s.Expired = s.Age > timeout
	owner, named := l.Owner()
	if !named {
		s.Stale = "the value names no pod (a legacy time-only lock): nobody will release it"
		return v
	}
	s.Holder = owner.String()
	p, err := lookup(owner)
	switch {
	case err != nil:
		v.holderErr = err.Error()
	case p != nil:
		v.holder = p
		s.HolderExists = true
		s.HolderNode = p.Spec.NodeName
		s.HolderBindPhase = p.Annotations[allocation.KeyBindPhase]
	}
	phase := allocation.BindPhase(s.HolderBindPhase)
	switch {
	case err == nil && p == nil:
		s.Stale = fmt.Sprintf("its holder pod %s no longer exists", s.Holder)
	case p == nil: // unknown holder: only the age can tell
	case s.HolderNode != "" && s.HolderNode != n.Name:
		s.Stale = fmt.Sprintf("its holder pod %s runs on node %s, not on %s", s.Holder, s.HolderNode, n.Name)
	case phase == allocation.PhaseSuccess || phase == allocation.PhaseFailed:
		v.neverReleased = true
		s.Stale = fmt.Sprintf("its holder pod %s is done allocating (bind-phase %s) and the lock stayed: the node's device plugin does not release it", s.Holder, phase)
	case p.Status.Phase == corev1.PodFailed:
		s.Stale = fmt.Sprintf("its holder pod %s has Failed (bind-phase %q): it will never be allocated", s.Holder, s.HolderBindPhase)
	case s.HolderNode == n.Name && (p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodSucceeded):
		v.neverReleased = true
		s.Stale = fmt.Sprintf("its holder pod %s is %s with bind-phase %q: the node's device plugin does not implement HAMi's allocation protocol and never releases the lock",
			s.Holder, p.Status.Phase, s.HolderBindPhase)
	}
	if s.Stale == "" && s.Expired {
		s.Stale = fmt.Sprintf("it is %s old, older than the lock timeout %s", s.Age.Round(time.Second), timeout)
	}
	return v
}

// LockOf reads the node lock of the node and its holder pod and judges it by the rules of
// the pod diagnosis (case P4): Stale says why nobody should wait for it. The error is
// ErrNoLock when the node has no lock, ErrNodeNotFound when there is no such Node, ErrAPI
// when the Node or the holder could not be read, ErrInvalidOptions for bad options. The
// identity needs get on nodes and pods ([LockRepairRules]).
func LockOf(ctx context.Context, client kubernetes.Interface, node string, opts Options) (*LockState, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	v, err := readLock(ctx, client, node, opts)
	if err != nil {
		return nil, err
	}
	return v.state, nil
}

// readLock is LockOf with the verdict.
func readLock(ctx context.Context, client kubernetes.Interface, node string, opts Options) (*lockVerdict, error) {
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("get node %s: %w (list them with: kubectl get nodes)", node, ErrNodeNotFound)
	case err != nil:
		return nil, fmt.Errorf("get node %s: %w: %w", node, ErrAPI, err)
	}
	var apiErr error
	lookup := func(pod types.NamespacedName) (*corev1.Pod, error) {
		p, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil, nil
		case err != nil:
			apiErr = fmt.Errorf("get pod %s (the lock's holder): %w: %w", pod, ErrAPI, err)
			return nil, apiErr
		}
		return p, nil
	}
	v := judgeLock(n, opts.Clock.Now(), opts.LockTimeout, lookup)
	if v == nil {
		return nil, fmt.Errorf("node %s: %w (annotation %s is not set)", node, ErrNoLock, nodelock.Key)
	}
	if apiErr != nil {
		return nil, apiErr
	}
	return v, nil
}

// RemoveStaleLock removes the node lock shown to the user (LockOf's answer) if it is still
// there, unchanged, and stale: it reads the lock again with LockOf's rules and refuses with
// ErrNotStale when the lock is live now or its value is not shown.Value any more, and with
// ErrNoLock when it is gone. The removal is nodelock's conditional write
// ([nodelock.Locker.ReleaseIf]), so a lock taken between the read and the write is never
// removed (ErrNotStale again). On success it logs what it removed ("Removed stale node
// lock", with the node, the value, the holder and why it was stale) through the context's
// logger. Other errors: ErrNodeNotFound, ErrAPI, ErrInvalidOptions.
func RemoveStaleLock(ctx context.Context, client kubernetes.Interface, shown LockState, opts Options) error {
	opts, err := opts.withDefaults()
	if err != nil {
		return err
	}
	if shown.Node == "" || shown.Value == "" {
		return fmt.Errorf("%w: the lock to remove names no node or value (pass LockOf's answer)", ErrInvalidOptions)
	}
	v, err := readLock(ctx, client, shown.Node, opts)
	if err != nil {
		return fmt.Errorf("remove stale lock of node %s: %w", shown.Node, err)
	}
	cur := v.state
	switch {
	case cur.Value != shown.Value:
		return fmt.Errorf("remove stale lock of node %s: %w: its value changed since it was shown, from %q to %q (look again: kubectl hami-doctor unlock %s)",
			shown.Node, ErrNotStale, shown.Value, cur.Value, shown.Node)
	case cur.Stale == "":
		return fmt.Errorf("remove stale lock of node %s: %w: %s (wait for it: it is released after the holder's Allocate, or taken over after %s)",
			shown.Node, ErrNotStale, liveLock(cur), opts.LockTimeout)
	}
	locker, err := nodelock.New(client.CoreV1(), nodelock.Options{Timeout: opts.LockTimeout})
	if err != nil {
		return fmt.Errorf("remove stale lock of node %s: %w: %w", shown.Node, ErrInvalidOptions, err)
	}
	if err := locker.ReleaseIf(ctx, shown.Node, shown.Value); err != nil {
		if errors.Is(err, nodelock.ErrChanged) {
			return fmt.Errorf("remove stale lock of node %s: %w: %w", shown.Node, ErrNotStale, err)
		}
		return fmt.Errorf("remove stale lock of node %s: %w: %w", shown.Node, ErrAPI, err)
	}
	klog.FromContext(ctx).Info("Removed stale node lock", "node", klog.KRef("", shown.Node), "lock", shown.Value,
		"holder", cur.Holder, "reason", cur.Stale)
	return nil
}

// liveLock says who holds a live lock, for messages.
func liveLock(s *LockState) string {
	return fmt.Sprintf("held by pod %s (bind-phase %q) for %s, within the lock timeout", s.Holder, s.HolderBindPhase, s.Age.Round(time.Second))
}

// LockRepairRules returns the RBAC rules [LockOf] and [RemoveStaleLock] need: get and patch
// nodes (read the lock, remove it with a conditional patch) and get pods (the holder). They
// are nodelock's ([nodelock.ClusterRoleRules]).
func LockRepairRules() []rbacv1.PolicyRule { return nodelock.ClusterRoleRules() }
