package schedcache

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	coordinationinformers "k8s.io/client-go/informers/coordination/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// FollowerOptions configure a [LeaseFollower]. Namespace, Name and Identity are required.
type FollowerOptions struct {
	// Namespace and Name of the Lease that kube-scheduler holds (HAMi's chart:
	// <release namespace>/hami-scheduler).
	Namespace, Name string
	// Identity is this replica's identity as kube-scheduler writes it before "_<uuid>": the
	// host name of the scheduler pod.
	Identity string
	// Clock is the source of time. Nil means the real clock.
	Clock clock.WithTicker
}

// LeaseFollower runs leader-only work (a [Handshaker]) while kube-scheduler in the same pod
// holds its Lease, as HAMi's extender does, but with an exact identity match (see
// [HolderMatches]): this replica leads while the holder is Identity or Identity_<anything>, and
// while the Lease was observed to change within its leaseDurationSeconds. The work's Run starts
// when leadership begins; its context ends when leadership lapses, and the follower waits for
// it to return. Run it with [LeaseFollower.Run].
type LeaseFollower struct {
	client  kubernetes.Interface
	opts    FollowerOptions
	clock   clock.WithTicker
	term    termRunner
	running atomic.Bool
	kick    chan struct{}

	mu       sync.Mutex
	holder   string
	duration time.Duration
	observed time.Time
	expiry   time.Time // when the current leadership lapses without a renewal; zero when not leading
}

// NewLeaseFollower validates opts and returns a follower that runs work while this replica
// holds kube-scheduler's Lease. It does nothing until Run.
func NewLeaseFollower(client kubernetes.Interface, work Runnable, opts FollowerOptions) (*LeaseFollower, error) {
	if client == nil || work == nil {
		return nil, fmt.Errorf("new lease follower: nil client or work: %w", ErrInvalidOptions)
	}
	if opts.Namespace == "" || opts.Name == "" || opts.Identity == "" {
		return nil, fmt.Errorf("new lease follower: namespace, name and identity are required: %w", ErrInvalidOptions)
	}
	clk := opts.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &LeaseFollower{client: client, opts: opts, clock: clk, term: termRunner{work: work}, kick: make(chan struct{}, 1)}, nil
}

// Run watches the Lease until ctx is done, running the work while this replica leads. It
// returns nil on cancellation, after the work returned, and [ErrAlreadyRunning] when called
// twice.
func (f *LeaseFollower) Run(ctx context.Context) error {
	if !f.running.CompareAndSwap(false, true) {
		return fmt.Errorf("run lease follower: %w", ErrAlreadyRunning)
	}
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "lease", klog.KRef(f.opts.Namespace, f.opts.Name), "identity", f.opts.Identity)
	ctx = klog.NewContext(ctx, logger)
	informer := coordinationinformers.NewFilteredLeaseInformer(f.client, f.opts.Namespace, 0, cache.Indexers{},
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", f.opts.Name).String()
		})
	if _, err := cache.NewTypedSharedIndexInformer[*coordinationv1.Lease](informer).AddTypedEventHandler(cache.TypedResourceEventHandlerFuncs[*coordinationv1.Lease]{
		AddFunc:    f.observe,
		UpdateFunc: func(_, lease *coordinationv1.Lease) { f.observe(lease) },
		DeleteFunc: func(cache.DeletedObject[*coordinationv1.Lease]) { f.observe(nil) },
	}, cache.HandlerOptions{Logger: &logger}); err != nil {
		return fmt.Errorf("run lease follower: %w", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { informer.RunWithContext(ctx) })
	defer wg.Wait()

	timer := f.clock.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := f.evaluate(ctx)
		if next > 0 {
			timer.Reset(next)
		} else {
			timer.Stop()
		}
		select {
		case <-ctx.Done():
			f.mu.Lock()
			f.expiry = time.Time{}
			f.mu.Unlock()
			f.term.stop()
			return nil
		case <-f.kick:
		case <-timer.C():
		}
	}
}

// observe records a delivery of the Lease (nil: deleted).
func (f *LeaseFollower) observe(lease *coordinationv1.Lease) {
	f.mu.Lock()
	f.holder, f.duration = "", 0
	if lease != nil {
		if lease.Spec.HolderIdentity != nil {
			f.holder = *lease.Spec.HolderIdentity
		}
		if lease.Spec.LeaseDurationSeconds != nil {
			f.duration = time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second
		}
	}
	f.observed = f.clock.Now()
	f.mu.Unlock()
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// evaluate updates the leadership state from the last observation and returns how long until
// it lapses (0 when not leading).
func (f *LeaseFollower) evaluate(ctx context.Context) time.Duration {
	f.mu.Lock()
	now := f.clock.Now()
	expiry := f.observed.Add(f.duration)
	leading := HolderMatches(f.holder, f.opts.Identity) && f.duration > 0 && now.Before(expiry)
	holder := f.holder
	if leading {
		f.expiry = expiry
	} else {
		f.expiry = time.Time{}
	}
	f.mu.Unlock()
	if leading != f.term.leading.Load() {
		klog.FromContext(ctx).V(2).Info("Leadership changed", "leading", leading, "holder", holder)
	}
	if leading {
		f.term.start(ctx)
	} else {
		f.term.stop()
	}
	if !leading {
		return 0
	}
	return expiry.Sub(now)
}

// IsLeader reports whether kube-scheduler's Lease is held by this replica and was renewed within
// its duration.
func (f *LeaseFollower) IsLeader() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.expiry.IsZero() && f.clock.Now().Before(f.expiry)
}

// Terms returns how many leadership terms this follower has started.
func (f *LeaseFollower) Terms() uint64 { return f.term.terms.Load() }
