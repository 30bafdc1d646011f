package monitor

import (
	"context"
	"errors"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/hamicore/region"
)

// gpuKey is a device's uuids[i] field as HAMi-core wrote it: HAMi's feedback keys its
// per-GPU counts by the whole 96-byte field, NULs included, and so does this package.
type gpuKey = [region.UUIDSize]byte

// priorityCounts counts, per GPU, the containers of each priority that were active in a
// round: counts[gpu][p]. HAMi v2.10.0 keeps a slice per GPU grown to priority+1; this is
// the same table kept sparse, so that a region holding priority 2^31-1 costs one entry, not
// an 8 GiB slice. The rules below read it exactly as HAMi reads the slice (an entry beyond
// the slice is 0).
type priorityCounts map[gpuKey]map[int32]int

// add counts one active container of priority p on gpu. A negative priority is not
// counted (HAMi v2.10.0 skips it; v2.9.0 panics on it).
func (c priorityCounts) add(gpu gpuKey, p int32) {
	if p < 0 {
		return
	}
	levels := c[gpu]
	if levels == nil {
		levels = make(map[int32]int, 2)
		c[gpu] = levels
	}
	levels[p]++
}

// checkBlocking is HAMi v2.10.0's CheckBlocking: a container of priority p on gpus is
// blocked when, on any of its GPUs, a container of a higher priority (a lower number j,
// 0 <= j < p) was active. Every GPU is scanned (HAMi v2.9.0 stopped at the first of the
// container's GPUs it found in counts, #2158) and p may be any value (v2.9.0 panicked on
// p >= 2 or p < 0): the SDK keeps these rules whichever HAMi version it is configured for.
func checkBlocking(counts priorityCounts, p int32, gpus []gpuKey) bool {
	for i := range gpus {
		levels, ok := counts[gpus[i]]
		if !ok {
			continue
		}
		for j, n := range levels {
			if j < p && n > 0 {
				return true
			}
		}
	}
	return false
}

// checkPriority is HAMi v2.10.0's CheckPriority: the core limit of a container of
// priority p on gpus stays on (utilization_switch 1) when it would be blocked
// ([checkBlocking]) or when, on any of its GPUs, more than one container of its own
// priority (itself included) was active. A negative p has no level of its own.
func checkPriority(counts priorityCounts, p int32, gpus []gpuKey) bool {
	if checkBlocking(counts, p, gpus) {
		return true
	}
	if p < 0 {
		return false
	}
	for i := range gpus {
		if counts[gpus[i]][p] > 1 {
			return true
		}
	}
	return false
}

// feedbackRow is one container's priority-feedback state after a round.
type feedbackRow struct {
	// id names the container of the row: its Key, pod UID and container name.
	id   string
	key  string
	pod  types.NamespacedName
	name string
	// regionPriority is the region's priority word; specPriority the pod spec's (valid when
	// specKnown); priority the one the round decided with (Options.PrioritySource).
	regionPriority, specPriority, priority int32
	specKnown                              bool
	// recentKernel and utilizationSwitch are the words after the round's writes.
	recentKernel, utilizationSwitch int32
}

// feedbackState is what the priority feedback keeps between rounds: the last round's
// rows (for the FeedbackMetrics families) and the priority mismatches already logged.
type feedbackState struct {
	// round serialises rounds: a round's reads, decisions and writes are never interleaved
	// with another's.
	round sync.Mutex

	// mu guards the fields below, read by the collector while a round runs.
	mu   sync.Mutex
	rows []feedbackRow
	// mismatch is the (region, spec) pair last reported per container (row id), so that a
	// mismatch is logged and counted once per container per change.
	mismatch map[string][2]int32
	// mismatches counts the mismatches reported (one per container per change).
	mismatches uint64
	// writeErrors counts the writes that failed (the container was left out of the round).
	writeErrors uint64
}

// fbEntry is one container taking part in a round; row holds the words as decided.
type fbEntry struct {
	c    *Container
	gpus []gpuKey
	// busy[k] is true when Options.ActivityFromSMUtil counts the container active on
	// gpus[k] by its processes' SM utilisation.
	busy []bool
	row  feedbackRow
	// shared are the rows of the other containers whose Container has the same region
	// file (a DRA claim's region, listed once per container that uses the claim).
	shared []feedbackRow
	// specSet is true when row.priority is a pod spec's (PriorityPodSpec).
	specSet bool
	skip    bool
}

// feedback runs one round of HAMi v2.10.0's priority feedback (Observe) over cs, the fresh
// reads of every adopted region; containers without a region (Err set) take no part, and a
// region listed for several containers (a DRA claim's) takes part once.
//
// Pass 1 counts down each container's recent_kernel (HAMi-core sets it to 2 at a kernel
// launch): a container whose counter is still above 0 after the decrement is active, and
// counts once per valid GPU at its priority (with Options.ActivityFromSMUtil, also on each
// GPU where its live processes' SM utilisation is above 0). Pass 2 decides per container
// from those counts: blocked ([checkBlocking]) → recent_kernel = -1 (HAMi-core then sleeps before each
// launch), else a blocked container is released with recent_kernel = 0; core limit on
// ([checkPriority]) → utilization_switch = 1, else 0.
//
// The whole round decides on the one read of every region in cs; then each word the round
// changed is written once (HAMi stores recent_kernel in pass 1 and again in pass 2; the
// file ends the same, with fewer writes and a shorter window for HAMi-core's own stores to
// be overwritten). Only recent_kernel and utilization_switch are ever written. A write that
// fails (the region was replaced since it was read: [ErrRegionChanged]) is logged and
// counted, that container's other word is not written and it is left out of the round's
// state; the round goes on. With Options.DisableFeedback the round decides and records the
// state for the FeedbackMetrics families but writes nothing.
func (m *Monitor) feedback(ctx context.Context, cs []Container) {
	logger := klog.FromContext(ctx)
	m.fb.round.Lock()
	defer m.fb.round.Unlock()

	spec := m.specPriorities(ctx)
	entries := make([]fbEntry, 0, len(cs))
	byPath := make(map[string]int, len(cs))
	for i := range cs {
		c := &cs[i]
		if c.Region == nil || c.Err != nil {
			continue
		}
		row := feedbackRow{id: c.Key + "|" + string(c.PodUID) + "|" + c.Name, key: c.Key, pod: c.Pod, name: c.Name,
			regionPriority: c.Region.Priority, recentKernel: c.Region.RecentKernel,
			utilizationSwitch: c.Region.UtilizationSwitch}
		row.specPriority, row.specKnown = spec.of(c)
		if k, ok := byPath[c.Path]; ok {
			// A region shared by several containers (a DRA claim) takes part once; by the
			// pod spec it has the lowest priority of theirs.
			e := &entries[k]
			e.shared = append(e.shared, row)
			if m.opts.PrioritySource == PriorityPodSpec && row.specKnown && (!e.specSet || row.specPriority > e.row.priority) {
				e.row.priority, e.specSet = row.specPriority, true
			}
			continue
		}
		e := fbEntry{c: c, row: row}
		e.row.priority = e.row.regionPriority
		if m.opts.PrioritySource == PriorityPodSpec && e.row.specKnown {
			e.row.priority, e.specSet = e.row.specPriority, true
		}
		for d := range c.Region.Devices {
			if dev := &c.Region.Devices[d]; dev.ValidUUID() {
				e.gpus = append(e.gpus, dev.RawUUID)
				busy := false
				if m.opts.ActivityFromSMUtil {
					_, sm := c.Region.Usage(d)
					busy = sm > 0
				}
				e.busy = append(e.busy, busy)
			}
		}
		byPath[c.Path] = len(entries)
		entries = append(entries, e)
	}

	// Pass 1: count down, and count the active containers per GPU and priority.
	counts := make(priorityCounts)
	for i := range entries {
		e := &entries[i]
		launched := false
		if e.row.recentKernel > 0 {
			e.row.recentKernel--
			launched = e.row.recentKernel > 0
		}
		for k, gpu := range e.gpus {
			if launched || e.busy[k] {
				counts.add(gpu, e.row.priority)
			}
		}
	}

	// Pass 2: block or release, core limit on or off.
	for i := range entries {
		e := &entries[i]
		switch blocked := checkBlocking(counts, e.row.priority, e.gpus); {
		case blocked && e.row.recentKernel >= 0:
			e.row.recentKernel = -1
		case !blocked && e.row.recentKernel < 0:
			e.row.recentKernel = 0
		}
		e.row.utilizationSwitch = 0
		if checkPriority(counts, e.row.priority, e.gpus) {
			e.row.utilizationSwitch = 1
		}
	}

	// The writes: each word that the round changed, once (HAMi stores recent_kernel in both
	// passes; the file ends the same).
	if !m.opts.DisableFeedback {
		for i := range entries {
			e := &entries[i]
			r := e.c.Region
			if e.row.recentKernel != r.RecentKernel && !m.store(ctx, e, region.FieldRecentKernel, e.row.recentKernel) {
				continue
			}
			if e.row.utilizationSwitch != r.UtilizationSwitch {
				m.store(ctx, e, region.FieldUtilizationSwitch, e.row.utilizationSwitch)
			}
		}
	}

	rows := make([]feedbackRow, 0, len(cs))
	for i := range entries {
		e := &entries[i]
		if e.skip {
			continue
		}
		rows = append(rows, e.row)
		for _, r := range e.shared {
			r.priority, r.recentKernel, r.utilizationSwitch = e.row.priority, e.row.recentKernel, e.row.utilizationSwitch
			rows = append(rows, r)
		}
	}
	m.fb.record(ctx, rows)
	logger.V(5).Info("Priority feedback round", "containers", len(rows), "gpus", len(counts))
}

// store writes v into f of e's region. A failed write marks e skipped (its row is left
// out of the round's state), is logged and counted, and store returns false.
func (m *Monitor) store(ctx context.Context, e *fbEntry, f region.Field, v int32) bool {
	err := m.write(e.c, f, v)
	if err == nil {
		return true
	}
	e.skip = true
	m.fb.mu.Lock()
	m.fb.writeErrors++
	m.fb.mu.Unlock()
	logger := klog.FromContext(ctx)
	if errors.Is(err, ErrRegionChanged) {
		logger.V(2).Info("Region changed under the priority feedback, container left out of this round",
			"folder", e.c.Key, "pod", klog.KRef(e.c.Pod.Namespace, e.c.Pod.Name), "err", err)
		return false
	}
	logger.Error(err, "Priority feedback write failed, container left out of this round",
		"folder", e.c.Key, "pod", klog.KRef(e.c.Pod.Namespace, e.c.Pod.Name))
	return false
}

// record stores the round's rows and reports the priority mismatches that are new: a
// container whose region's priority differs from its pod spec's is logged and counted
// once, and again only when either value changes.
func (s *feedbackState) record(ctx context.Context, rows []feedbackRow) {
	logger := klog.FromContext(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := make(map[string][2]int32, len(rows))
	for i := range rows {
		r := &rows[i]
		if !r.specKnown || r.regionPriority == r.specPriority {
			continue
		}
		pair := [2]int32{r.regionPriority, r.specPriority}
		seen[r.id] = pair
		if last, ok := s.mismatch[r.id]; ok && last == pair {
			continue
		}
		s.mismatches++
		logger.Info("Region priority differs from the pod spec", "pod", klog.KRef(r.pod.Namespace, r.pod.Name), "container", r.name, "folder", r.key,
			"regionPriority", r.regionPriority, "specPriority", r.specPriority)
	}
	s.mismatch = seen
	s.rows = rows
}
