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

// Elector is a [Leader] that runs client-go leader election on a Lease of its own. Run it with
// [Elector.Run] next to the cache; it campaigns again after losing the Lease, and releases the
// Lease when its context is cancelled so that a standby takes over at once.
type Elector struct {
	client  kubernetes.Interface
	opts    ElectorOptions
	ts      *termState
	running atomic.Bool
}

var _ Leader = (*Elector)(nil)

// NewElector validates opts and returns an Elector that does nothing until Run.
func NewElector(client kubernetes.Interface, opts ElectorOptions) (*Elector, error) {
	if client == nil {
		return nil, fmt.Errorf("new elector: nil client: %w", ErrInvalidOptions)
	}
	if opts.Namespace == "" || opts.Name == "" || opts.Identity == "" {
		return nil, fmt.Errorf("new elector: namespace, name and identity are required: %w", ErrInvalidOptions)
	}
	opts.LeaseDuration = cmp.Or(opts.LeaseDuration, DefaultLeaseDuration)
	opts.RenewDeadline = cmp.Or(opts.RenewDeadline, DefaultRenewDeadline)
	opts.RetryPeriod = cmp.Or(opts.RetryPeriod, DefaultRetryPeriod)
	e := &Elector{client: client, opts: opts, ts: newTermState()}
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
				if e.ts.start(ctx) {
					klog.FromContext(ctx).V(2).Info("Became leader", "lease", klog.KRef(e.opts.Namespace, e.opts.Name), "identity", e.opts.Identity)
				}
			},
			OnStoppedLeading: func() { e.ts.set(false) },
		},
	})
}

// Run campaigns for the Lease until ctx is done, then releases it. It returns nil on
// cancellation and [ErrAlreadyRunning] when called twice.
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
		le.Run(ctx)
		if ctx.Err() == nil {
			logger.V(2).Info("Lost leadership, campaigning again", "lease", klog.KRef(e.opts.Namespace, e.opts.Name), "identity", e.opts.Identity)
		}
	}
	e.ts.set(false)
	return nil
}

// IsLeader reports whether this replica holds the Lease.
func (e *Elector) IsLeader() bool { return e.ts.isLeading() }

// Term returns the current leadership term.
func (e *Elector) Term() Term { return e.ts.term() }
