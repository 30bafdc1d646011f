package draplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"reflect"
	"slices"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/internal/statedir"
)

// DefaultStaleClaimPeriod is how often Run checks the prepared claims against the API
// server (Options.StaleClaimPeriod), besides once when it starts.
const DefaultStaleClaimPeriod = time.Minute

// claimGetTimeout bounds the GET that confirms a verdict while the plugin's lock is held.
const claimGetTimeout = 10 * time.Second

// Reasons a prepared claim is stale, as [Plugin.Cleanup] logs them.
const (
	staleDeleted     = "the claim is deleted"
	staleReplaced    = "a new claim of the same name has another UID"
	staleDeallocated = "the claim is no longer allocated"
	staleElsewhere   = "the claim's allocation no longer names this node's devices of this driver"
	orphanUnreserved = "the claim is allocated here but reserved for no pod"
)

// staleReason says why the prepared claim uid is stale given c, the claim of its namespace
// and name as the API server has it (nil: not found), or "" when the API server still
// allocates it to driver's devices in the pool of node (then it must stay prepared).
func staleReason(c *resourcev1.ResourceClaim, uid types.UID, driver, node string) string {
	switch {
	case c == nil:
		return staleDeleted
	case c.UID != uid:
		return staleReplaced
	case c.Status.Allocation == nil:
		return staleDeallocated
	case !slices.ContainsFunc(c.Status.Allocation.Devices.Results, func(r resourcev1.DeviceRequestAllocationResult) bool {
		return r.Driver == driver && r.Pool == node
	}):
		return staleElsewhere
	}
	return ""
}

// getClaim GETs the claim ns/name; a claim that is not found is nil without an error.
func (p *Plugin) getClaim(ctx context.Context, ns, name string) (*resourcev1.ResourceClaim, error) {
	if ns == "" || name == "" {
		return nil, errors.New("the record has no namespace or name")
	}
	c, err := p.opts.Client.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

// cleanupCandidate is a prepared claim or an orphan spec the first, unlocked pass found stale
// or adoptable.
type cleanupCandidate struct {
	uid    types.UID
	claim  preparedClaim
	orphan bool // a CDI spec of this driver with no checkpoint entry
}

// Cleanup checks once every claim the plugin has prepared, and every CDI spec of this
// driver without a checkpoint entry (a process killed between writing the spec and the
// checkpoint), against the API server; Run calls it when it starts and every
// Options.StaleClaimPeriod.
//
// A prepared claim is unprepared locally (its CDI spec, its state folder and its checkpoint
// entry removed, Stats.StaleUnprepared counted, a log line with the reason) when its
// namespace and name are gone, belong to a claim of another UID, are no longer allocated, or
// are allocated to no device of this driver in this node's pool: the kubelet missed the
// Unprepare (it lost its state, or the claim went while the node was down), and the GPU
// would otherwise stay held for both worlds. An orphan spec is adopted into the checkpoint
// (Stats.OrphansAdopted) when its claim is allocated here and reserved, so the kubelet's
// retry finds it prepared; otherwise it is removed (Stats.OrphansRemoved).
//
// A claim the API server still allocates to this node is never unprepared, and one whose
// GET fails is kept for the next round (the errors are returned, joined). Each verdict is
// confirmed by a second GET under the plugin's lock before anything is removed, so a
// Prepare in between (in this or another process) is never undone.
func (p *Plugin) Cleanup(ctx context.Context) error {
	unlock, err := p.lock(ctx)
	if err != nil {
		return fmt.Errorf("clean up stale claims: %w", err)
	}
	p.mu.Lock()
	prepared := maps.Clone(p.claims)
	p.mu.Unlock()
	records, _, err := specRecords(p.opts.CDIDir, p.opts.Profile.Driver)
	unlock()
	if err != nil {
		return fmt.Errorf("clean up stale claims: %w", err)
	}

	var errs []error
	var cands []cleanupCandidate
	for _, uid := range slices.Sorted(maps.Keys(prepared)) {
		c := prepared[uid]
		claim, err := p.getClaim(ctx, c.Namespace, c.Name)
		if err != nil {
			errs = append(errs, fmt.Errorf("check prepared claim %s/%s (UID %s): %w", c.Namespace, c.Name, uid, err))
			continue
		}
		if staleReason(claim, uid, p.opts.Profile.Driver, p.opts.NodeName) != "" {
			cands = append(cands, cleanupCandidate{uid: uid, claim: c})
		}
	}
	for _, uid := range slices.Sorted(maps.Keys(records)) {
		if _, ok := prepared[uid]; ok {
			continue
		}
		cands = append(cands, cleanupCandidate{uid: uid, claim: records[uid], orphan: true})
	}
	if len(cands) > 0 {
		if err := p.settle(ctx, cands); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// settle confirms and acts on the candidates under the plugin's lock.
func (p *Plugin) settle(ctx context.Context, cands []cleanupCandidate) error {
	logger := klog.FromContext(ctx)
	unlock, err := p.lock(ctx)
	if err != nil {
		return fmt.Errorf("clean up stale claims: %w", err)
	}
	defer unlock()
	p.mu.Lock()
	next := maps.Clone(p.claims)
	p.mu.Unlock()
	changed := false
	var errs []error
	for _, cand := range cands {
		cur, ok := next[cand.uid]
		switch {
		case cand.orphan && ok:
			continue // prepared meanwhile
		case cand.orphan:
			if _, err := os.Stat(cand.claim.CDISpec); err != nil {
				continue // removed meanwhile
			}
		case !ok || !reflect.DeepEqual(cur, cand.claim):
			continue // unprepared or prepared again meanwhile
		}
		gctx, cancel := context.WithTimeout(ctx, claimGetTimeout)
		claim, err := p.getClaim(gctx, cand.claim.Namespace, cand.claim.Name)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("check claim %s/%s (UID %s): %w", cand.claim.Namespace, cand.claim.Name, cand.uid, err))
			continue
		}
		reason := staleReason(claim, cand.uid, p.opts.Profile.Driver, p.opts.NodeName)
		ref := klog.KRef(cand.claim.Namespace, cand.claim.Name)
		switch {
		case cand.orphan && reason == "" && len(claim.Status.ReservedFor) > 0:
			if cand.claim.StateDir != "" {
				if _, err := os.Stat(cand.claim.StateDir); errors.Is(err, fs.ErrNotExist) {
					if err := statedir.Recreate(cand.claim.StateDir); err != nil {
						errs = append(errs, fmt.Errorf("adopt claim %s/%s: HAMi-core state folder: %w", cand.claim.Namespace, cand.claim.Name, err))
						continue
					}
				}
			}
			next[cand.uid] = cand.claim
			changed = true
			p.orphansAdopted.Add(1)
			logger.Info("Adopted the CDI spec of a claim whose Prepare was cut short", "claim", ref, "claimUID", cand.uid, "cdiSpec", cand.claim.CDISpec)
		case reason == "" && !cand.orphan:
			// Allocated here again since the first look: keep it.
		default:
			if cand.orphan && reason == "" {
				reason = orphanUnreserved
			}
			if err := p.unprepareMIG(ctx, cand.claim); err != nil { // its MIG devices, as Unprepare does
				errs = append(errs, fmt.Errorf("clean up claim %s/%s (UID %s): %w", cand.claim.Namespace, cand.claim.Name, cand.uid, err))
				continue
			}
			if err := removeLocal(cand.claim); err != nil {
				errs = append(errs, fmt.Errorf("clean up claim %s/%s (UID %s): %w", cand.claim.Namespace, cand.claim.Name, cand.uid, err))
				continue
			}
			if cand.orphan {
				p.orphansRemoved.Add(1)
				logger.Info("Removed the orphan CDI spec of a claim whose Prepare was cut short", "claim", ref, "claimUID", cand.uid, "cdiSpec", cand.claim.CDISpec, "reason", reason)
				continue
			}
			delete(next, cand.uid)
			changed = true
			p.staleUnprepared.Add(1)
			logger.Info("Unprepared a stale claim", "claim", ref, "claimUID", cand.uid, "reason", reason, "devices", len(cand.claim.Devices))
		}
	}
	if changed {
		if err := p.writeCheckpoint(next); err != nil {
			return errors.Join(append(errs, fmt.Errorf("clean up stale claims: %w", err))...)
		}
		p.mu.Lock()
		p.claims = next
		p.mu.Unlock()
	}
	return errors.Join(errs...)
}

// removeLocal removes what Prepare wrote on the node for c: the CDI spec and the state
// folder. Missing files are fine.
func removeLocal(c preparedClaim) error {
	if err := os.Remove(c.CDISpec); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w %s: %w", ErrCDI, c.CDISpec, err)
	}
	if c.StateDir != "" {
		if err := os.RemoveAll(c.StateDir); err != nil {
			return fmt.Errorf("HAMi-core state folder: %w", err)
		}
	}
	return nil
}

// startCleanup reports a checkpoint recovered by New, then runs Cleanup now and every
// cleanup period until ctx ends (not at all with a negative Options.StaleClaimPeriod). stop
// ends it and waits for it.
func (p *Plugin) startCleanup(ctx context.Context) (stop func()) {
	p.mu.Lock()
	recovered := p.recovery
	p.recovery = nil
	p.mu.Unlock()
	if recovered != nil {
		p.HandleError(ctx, recovered, "Recovered the DRA checkpoint")
	}
	if p.cleanupPeriod < 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		logger := klog.FromContext(ctx)
		t := p.clock.NewTicker(p.cleanupPeriod)
		defer t.Stop()
		for {
			if err := p.Cleanup(ctx); err != nil && ctx.Err() == nil {
				// Kept for the next round: an API server that does not answer must not
				// unprepare anything.
				logger.Error(err, "Checking the prepared claims against the API server failed, the claims concerned stay prepared until the next round", "period", p.cleanupPeriod)
			}
			p.cleanups.Add(1)
			select {
			case <-ctx.Done():
				return
			case <-t.C():
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
