package monitor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/hamicore/region"
)

// Container is one region the monitor reads, tied to its pod and container: a container's
// folder (<Root>/containers/<pod UID>_<container>/) or, for a DRA claim shared by several
// containers, the claim's region once per container that uses the claim.
type Container struct {
	// Key names the region's folder: "<pod UID>_<container>", or "claims/<claim UID>".
	Key string
	// Path is the region file.
	Path string
	// Pod and PodUID are the pod; Name the container; Init is true for an init container
	// (native sidecars included).
	Pod    types.NamespacedName
	PodUID types.UID
	Name   string
	Init   bool
	// Claim is the ResourceClaim of a claim folder (empty for a container folder).
	Claim types.NamespacedName
	// Region is the region as read for this scrape or round; nil when Err is set.
	Region *region.Region
	Err    error
}

// ErrNotReady is [Monitor.Ready]'s error until a scan has read the cache folders and listed
// the node's pods.
var ErrNotReady = errors.New("monitor not ready")

// ErrAlreadyRunning is [Monitor.Run] called while it runs.
var ErrAlreadyRunning = errors.New("monitor already running")

// Monitor watches the node's HAMi-core regions, serves HAMi's per-container metrics and runs
// HAMi's priority feedback. Create it with [New]; Run it; register its collector with
// [Monitor.Register].
type Monitor struct {
	opts Options
	pods Pods

	running atomic.Bool

	// scanMu serialises scans; loadErrs (the last load error logged per folder) and logged
	// (what was logged once) belong to the scan holding it.
	scanMu   sync.Mutex
	loadErrs map[string]string
	logged   map[string]struct{}

	// mu guards the adopted folders and the scans' outcome.
	mu      sync.Mutex
	folders map[string]*folder
	scanned bool
	scanErr error
	// failed are the load errors of the last scan's folders (scanFailed while it runs, under
	// scanMu), by key.
	failed, scanFailed map[string]error

	fb        feedbackState // the priority feedback's rounds and last state (feedback.go)
	scrapeCtx scrapeParent  // the parent of each scrape's context, set by Run (collector.go)
}

// New returns a monitor of the regions under opts.Root, tied to the pods pods lists. It
// starts nothing and touches no file: [Monitor.Run] does.
func New(pods Pods, opts Options) (*Monitor, error) {
	if pods == nil {
		return nil, fmt.Errorf("%w: pods is nil (give the node agent's pod informer)", ErrInvalidOptions)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Monitor{opts: opts, pods: pods, loadErrs: map[string]string{}, logged: map[string]struct{}{}}, nil
}

// Run scans the folders and runs the priority feedback every Options.Period until ctx ends,
// the first round at once. A round whose scan cannot read <Root>/containers logs the error
// and skips the feedback; a round without the node's pods neither adopts nor removes
// folders. Run returns nil when ctx ends, having started no goroutine that outlives it, and
// [ErrAlreadyRunning] when it runs already.
func (m *Monitor) Run(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer m.running.Store(false)
	m.bindScrapeContext(ctx)
	logger := klog.FromContext(ctx)
	logger.V(2).Info("Starting the node monitor", "root", m.opts.Root, "period", m.opts.Period, "resyncInterval", m.opts.ResyncInterval)
	ticker := m.opts.Clock.NewTicker(m.opts.Period)
	defer ticker.Stop()
	for {
		if ctx.Err() != nil {
			return nil
		}
		m.round(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C():
		}
	}
}

// round is one scan and, after a successful one, one feedback round (which writes nothing
// with DisableFeedback, and then runs only to serve FeedbackMetrics).
func (m *Monitor) round(ctx context.Context) {
	if err := m.scan(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Failed to update the container list, feedback skipped this round")
		return
	}
	if !m.opts.DisableFeedback || m.opts.FeedbackMetrics {
		m.feedback(ctx, m.Containers(ctx)) // with DisableFeedback it only records the state
	}
}

// Ready returns nil while the last scan read <Root>/containers and listed the node's pods,
// else an error wrapping [ErrNotReady] and the scan's error (or saying that no scan has
// completed yet). It is the monitor's readiness probe.
func (m *Monitor) Ready() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.scanned && m.scanErr == nil:
		return nil
	case m.scanErr != nil:
		return fmt.Errorf("%w: %w", ErrNotReady, m.scanErr)
	}
	return fmt.Errorf("%w: no scan of the cache folders has completed yet", ErrNotReady)
}
