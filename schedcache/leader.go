package schedcache

import (
	"context"
	"strings"
	"sync"
)

// Leader tells the cache whether this replica may write. The cache keeps itself warm either way;
// only handshake writes are gated. Two implementations ship with the package: [Elector] (its own
// client-go leader election on a Lease) and [LeaseFollower] (follows the Lease that
// kube-scheduler holds, with an exact identity match). [AlwaysLeader] is the default.
//
// Implementations must be safe for concurrent use.
type Leader interface {
	// IsLeader reports whether this replica leads now. The cache asks it before every write.
	IsLeader() bool
	// Term returns the current leadership term. Its Changed channel is closed at the next
	// change, so any number of consumers can wait on it.
	Term() Term
}

// Term is one leadership term as seen by this replica.
type Term struct {
	// Leading reports whether this replica leads during the term.
	Leading bool
	// Seq increases at every change of leadership (gained or lost); it identifies the term.
	Seq uint64
	// Changed is closed when the term ends. Nil means it never ends.
	Changed <-chan struct{}
}

// AlwaysLeader returns a [Leader] that always leads (HAMi's --leader-elect=false): one replica,
// no election.
func AlwaysLeader() Leader { return alwaysLeader{} }

type alwaysLeader struct{}

func (alwaysLeader) IsLeader() bool { return true }
func (alwaysLeader) Term() Term     { return Term{Leading: true, Seq: 1} }

// HolderMatches reports whether a Lease holder identity belongs to identity: equal to it, or
// identity followed by "_" and anything (kube-scheduler's identities are "<hostname>_<uuid>").
// HAMi matches a bare prefix, so host "node-1" also claims "node-10_…" (HAMi issue #2154).
func HolderMatches(holder, identity string) bool {
	if identity == "" {
		return false
	}
	rest, ok := strings.CutPrefix(holder, identity)
	return ok && (rest == "" || rest[0] == '_')
}

// termState is the shared bookkeeping of the Leader implementations.
type termState struct {
	mu      sync.Mutex
	leading bool
	seq     uint64
	changed chan struct{}
}

func newTermState() *termState { return &termState{changed: make(chan struct{})} }

// set records the leadership state and reports whether it changed.
func (t *termState) set(leading bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.setLocked(leading)
}

func (t *termState) setLocked(leading bool) bool {
	if t.leading == leading {
		return false
	}
	t.leading = leading
	t.seq++
	close(t.changed)
	t.changed = make(chan struct{})
	return true
}

// start marks leadership gained unless ctx, the context of the term, already ended: client-go
// calls OnStartedLeading in a goroutine that may run after OnStoppedLeading.
func (t *termState) start(ctx context.Context) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ctx.Err() != nil {
		return false
	}
	return t.setLocked(true)
}

func (t *termState) isLeading() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.leading
}

func (t *termState) term() Term {
	t.mu.Lock()
	defer t.mu.Unlock()
	return Term{Leading: t.leading, Seq: t.seq, Changed: t.changed}
}
