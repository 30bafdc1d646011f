package schedcache

import (
	"cmp"
	"context"
	"fmt"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// Defaults of [ElectorOptions], the same as kube-scheduler's.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// ElectorOptions configure an [Elector]. Namespace, Name and Identity are required.
type ElectorOptions struct {
	// Namespace and Name of the Lease to campaign for. Use a Lease of your own, not
	// kube-scheduler's (follow that one with a [LeaseFollower]).
	Namespace, Name string
	// Identity of this replica, unique among replicas (e.g. the pod name).
	Identity string
	// LeaseDuration is how long a standby waits after the last renewal it observed before it
	// takes over. Zero means [DefaultLeaseDuration] (15 s).
	LeaseDuration time.Duration
	// RenewDeadline is how long the leader retries renewing before it gives up. Zero means
	// [DefaultRenewDeadline] (10 s).
	RenewDeadline time.Duration
	// RetryPeriod is the wait between attempts. Zero means [DefaultRetryPeriod] (2 s).
	RetryPeriod time.Duration
}

// Elector runs leader-only work (a [Handshaker]) inside client-go's leader election on a Lease
// of its own: the work's Run is started when this replica acquires the Lease and its context
// ends when the replica loses it; the Elector waits for it to return before it campaigns
// again. It releases the Lease when its context is cancelled so that a standby takes over at
// once. The components themselves know nothing about leader election.
type Elector struct {
	client  kubernetes.Interface
	opts    ElectorOptions
	term    termRunner
	running atomic.Bool
}

// NewElector validates opts and returns an Elector that runs work while it leads. It does
// nothing until Run.
func NewElector(client kubernetes.Interface, work Runnable, opts ElectorOptions) (*Elector, error) {
	if client == nil || work == nil {
		return nil, fmt.Errorf("new elector: nil client or work: %w", ErrInvalidOptions)
	}
	if opts.Namespace == "" || opts.Name == "" || opts.Identity == "" {
		return nil, fmt.Errorf("new elector: namespace, name and identity are required: %w", ErrInvalidOptions)
	}
	opts.LeaseDuration = cmp.Or(opts.LeaseDuration, DefaultLeaseDuration)
	opts.RenewDeadline = cmp.Or(opts.RenewDeadline, DefaultRenewDeadline)
	opts.RetryPeriod = cmp.Or(opts.RetryPeriod, DefaultRetryPeriod)
	e := &Elector{client: client, opts: opts, term: termRunner{work: work}}
	// Let client-go validate the durations now rather than in Run.
	if _, err := e.elector(); err != nil {
		return nil, fmt.Errorf("new elector: %w: %w", ErrInvalidOptions, err)
	}
	return e, nil
}

func (e *Elector) elector() (*leaderelection.LeaderElector, error) {
	return leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: e.opts.Namespace, Name: e.opts.Name},
			Client:     e.client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: e.opts.Identity},
		},
		LeaseDuration:   e.opts.LeaseDuration,
		RenewDeadline:   e.opts.RenewDeadline,
		RetryPeriod:     e.opts.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            e.opts.Namespace + "/" + e.opts.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				klog.FromContext(ctx).V(2).Info("Became leader", "lease", klog.KRef(e.opts.Namespace, e.opts.Name), "identity", e.opts.Identity)
				e.term.start(ctx)
			},
			// Called synchronously when the leader election's Run ends: the work has
			// returned before the next campaign.
			OnStoppedLeading: e.term.stop,
		},
	})
}

// Run campaigns for the Lease until ctx is done, running the work during every term, then
// releases the Lease. It returns nil on cancellation, after the work returned, and
// [ErrAlreadyRunning] when called twice.
func (e *Elector) Run(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return fmt.Errorf("run elector: %w", ErrAlreadyRunning)
	}
	logger := klog.FromContext(ctx)
	for ctx.Err() == nil {
		le, err := e.elector()
		if err != nil {
			return fmt.Errorf("run elector: %w", err)
		}
		le.Run(klog.NewContext(ctx, logger))
		e.term.stop()
		if ctx.Err() == nil {
			logger.V(2).Info("Lost leadership, campaigning again", "lease", klog.KRef(e.opts.Namespace, e.opts.Name), "identity", e.opts.Identity)
		}
	}
	return nil
}

// IsLeader reports whether this replica holds the Lease (its work runs).
func (e *Elector) IsLeader() bool { return e.term.leading.Load() }

// Terms returns how many leadership terms this Elector has started.
func (e *Elector) Terms() uint64 { return e.term.terms.Load() }
