package schedcache

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"

	"k8s.io/klog/v2"
)

// Runnable is leader-only work: Run blocks until ctx is done and returns nil then. [Handshaker]
// is one; [Elector] and [LeaseFollower] run one for each leadership term, with a context that
// ends with the term.
type Runnable interface {
	Run(ctx context.Context) error
}

var (
	_ Runnable = (*Handshaker)(nil)
	_ Runnable = (*Cache)(nil)
	_ Runnable = (*Elector)(nil)
	_ Runnable = (*LeaseFollower)(nil)
)

// errTermEnded is the cause of a term context's end when leadership was lost.
var errTermEnded = errors.New("leadership lost")

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

// termRunner runs a Runnable once per leadership term and joins it when the term ends.
type termRunner struct {
	work    Runnable
	leading atomic.Bool
	terms   atomic.Uint64

	mu     sync.Mutex // serialises start and stop
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// start begins a term unless one runs or ctx, the term's parent, already ended (client-go calls
// OnStartedLeading in a goroutine that may run after OnStoppedLeading).
func (t *termRunner) start(ctx context.Context) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done != nil || ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	t.cancel, t.done = cancel, done
	t.leading.Store(true)
	t.terms.Add(1)
	go func() {
		defer close(done)
		if err := t.work.Run(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Leader-only work failed")
		}
	}()
}

// stop ends the current term, if any, and waits until its work returned.
func (t *termRunner) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done == nil {
		return
	}
	t.leading.Store(false)
	t.cancel(errTermEnded)
	<-t.done
	t.cancel, t.done = nil, nil
}
