package nvmlscan

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
)

// DeviceHealth describes one unhealthy GPU.
type DeviceHealth struct {
	// UUID is the GPU UUID.
	UUID string
	// XID is the last critical XID seen on the GPU, 0 when it was marked unhealthy for another
	// reason (a failed wait for events).
	XID uint64
	// Reason says why, in words.
	Reason string
	// Since is when the GPU became unhealthy.
	Since time.Time
	// LastEvent is when the last critical event arrived; the quiet period counts from here.
	LastEvent time.Time
	// Persistent means an XID in HealthOptions.PersistentXIDs was seen: the GPU does not
	// recover.
	Persistent bool
}

// Unhealthy returns the GPUs currently marked unhealthy, ordered by UUID.
func (s *Scanner) Unhealthy() []DeviceHealth {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]DeviceHealth, 0, len(s.health))
	for uuid, h := range s.health {
		out = append(out, DeviceHealth{UUID: uuid, XID: h.xid, Reason: h.reason, Since: h.since, LastEvent: h.last, Persistent: h.persistent})
	}
	slices.SortFunc(out, func(a, b DeviceHealth) int { return cmp.Compare(a.UUID, b.UUID) })
	return out
}

// Changed returns a channel that is closed at the next change of a GPU's health (unhealthy,
// or healthy again), and then replaced: take it before reading the state ([Scanner.Scan],
// [Scanner.Devices] or [Scanner.Unhealthy]), wait for it to close, and take the next one. Any
// number of goroutines may wait on the same channel.
func (s *Scanner) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func (s *Scanner) notifyChanged() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.changed)
	s.changed = make(chan struct{})
}

// Run watches NVML for critical XID events and keeps each GPU's health, which [Scanner.Scan]
// publishes. It blocks until ctx ends or the scanner is closed, then returns nil after every
// goroutine it started has returned; it returns [ErrClosed] after Close and [ErrAlreadyRunning] while
// another Run of the same scanner is running.
//
// Marking unhealthy: an XidCriticalError event on a GPU marks it unhealthy, unless its XID is
// in HealthOptions.IgnoredXIDs (by default the application XIDs NVIDIA's device plugin ignores:
// 13, 31, 43, 45, 68, 109). An event on a MIG device marks its parent GPU. When NVML fails to
// deliver events, or an event's GPU cannot be identified, every watched GPU is marked
// unhealthy, as NVIDIA's plugin does. A GPU whose events cannot be registered (too old, or an
// error) is logged and not watched; it stays healthy.
//
// Recovery rule: an unhealthy GPU is healthy again once HealthOptions.QuietPeriod (default
// 5 min) has passed since its last critical XID and it then answers queries: its handle, memory
// and name queries succeed. Run probes such GPUs every HealthOptions.ProbeInterval (default
// 30 s), and a scan that queries the GPU successfully after the quiet period counts as well.
// A GPU that keeps producing XIDs, or stops answering, stays unhealthy; a GPU that saw an XID
// in HealthOptions.PersistentXIDs never recovers. HAMi's agent, by contrast, marks a GPU
// unhealthy forever after one XID.
//
// Run returns within about HealthOptions.WaitTimeout (default 1 s) of ctx ending, the time one
// wait for NVML events may take.
func (s *Scanner) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return fmt.Errorf("run health watch: %w", ErrClosed)
	case s.running:
		s.mu.Unlock()
		return fmt.Errorf("run health watch: %w", ErrAlreadyRunning)
	}
	done := make(chan struct{})
	s.running, s.stopRun, s.runDone = true, cancel, done
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.running, s.stopRun, s.runDone = false, nil, nil
		s.mu.Unlock()
		close(done)
	}()

	logger := klog.FromContext(ctx)
	if s.cfg.healthDisabled {
		logger.V(2).Info("XID health watch disabled")
		<-ctx.Done()
		return nil
	}
	set, watched := s.registerEvents(logger)
	var wg sync.WaitGroup
	if set != nil {
		logger.V(2).Info("Watching GPUs for critical XID events", "count", len(watched))
		wg.Go(func() { s.waitEvents(ctx, logger, set, watched) })
	}
	ticker := s.cfg.clock.NewTicker(s.cfg.probeInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			if set != nil {
				if ret := set.Free(); ret != nvml.SUCCESS {
					logger.Error(ret, "Failed to free NVML event set")
				}
			}
			return nil
		case <-ticker.C():
			s.probe(logger)
		}
	}
}

// registerEvents creates an event set and registers every GPU that is not excluded for
// critical XID events. It returns a nil set when there is nothing to watch.
func (s *Scanner) registerEvents(logger klog.Logger) (nvml.EventSet, map[string]int) {
	set, ret := s.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		logger.Error(ret, "XID health checks disabled: cannot create NVML event set")
		return nil, nil
	}
	watched := make(map[string]int)
	n, ret := s.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		logger.Error(ret, "XID health checks disabled: cannot count devices")
	}
	for i := range n {
		dev, ret := s.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			logger.Error(ret, "GPU not watched for XIDs: cannot get handle", "index", i)
			continue
		}
		uuid, ret := dev.GetUUID()
		if ret != nvml.SUCCESS {
			logger.Error(ret, "GPU not watched for XIDs: cannot get UUID", "index", i)
			continue
		}
		index, ret := dev.GetIndex()
		if ret != nvml.SUCCESS {
			logger.Error(ret, "GPU not watched for XIDs: cannot get index", "index", i, "gpuUUID", uuid)
			continue
		}
		if s.cfg.excludeUUIDs[uuid] || (index >= 0 && s.cfg.excludeIndexes[uint(index)]) {
			continue
		}
		supported, ret := dev.GetSupportedEventTypes()
		if ret == nvml.SUCCESS && supported&nvml.EventTypeXidCriticalError == 0 {
			ret = nvml.ERROR_NOT_SUPPORTED
		}
		if ret == nvml.SUCCESS {
			ret = dev.RegisterEvents(nvml.EventTypeXidCriticalError, set)
		}
		switch ret {
		case nvml.SUCCESS:
			watched[uuid] = index
		case nvml.ERROR_NOT_SUPPORTED:
			logger.Info("GPU is too old to support health checking, not watched for XIDs", "index", index, "gpuUUID", uuid)
		default:
			logger.Error(ret, "GPU not watched for XIDs: cannot register events", "index", index, "gpuUUID", uuid)
		}
	}
	if len(watched) == 0 {
		if ret := set.Free(); ret != nvml.SUCCESS {
			logger.Error(ret, "Failed to free NVML event set")
		}
		return nil, nil
	}
	return set, watched
}

// waitEvents waits for events until ctx ends.
func (s *Scanner) waitEvents(ctx context.Context, logger klog.Logger, set nvml.EventSet, watched map[string]int) {
	timeout := uint32(s.cfg.waitTimeout / time.Millisecond)
	for ctx.Err() == nil {
		data, ret := set.Wait(timeout)
		switch ret {
		case nvml.SUCCESS:
			s.handleEvent(logger, data, watched)
		case nvml.ERROR_TIMEOUT:
		default:
			s.markAll(logger, watched, 0, fmt.Sprintf("wait for NVML events: %v", ret))
			// Do not spin on a persistent failure.
			t := s.cfg.clock.NewTimer(s.cfg.waitTimeout)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C():
			}
		}
	}
}

func (s *Scanner) handleEvent(logger klog.Logger, data nvml.EventData, watched map[string]int) {
	if data.EventType != nvml.EventTypeXidCriticalError {
		logger.V(4).Info("Ignoring non-XID NVML event", "eventType", data.EventType)
		return
	}
	xid := data.EventData
	if s.cfg.ignored[xid] {
		logger.V(3).Info("Ignoring XID of an application error", "xid", xid)
		return
	}
	if data.Device == nil {
		s.markAll(logger, watched, xid, fmt.Sprintf("XID %d on an unidentified GPU", xid))
		return
	}
	uuid, ret := data.Device.GetUUID()
	if ret != nvml.SUCCESS {
		s.markAll(logger, watched, xid, fmt.Sprintf("XID %d on a GPU whose UUID cannot be read: %v", xid, ret))
		return
	}
	index, ok := watched[uuid]
	if !ok {
		logger.V(4).Info("Ignoring XID on a GPU that is not watched", "xid", xid, "gpuUUID", uuid)
		return
	}
	s.mark(logger, uuid, index, xid, fmt.Sprintf("critical XID %d", xid))
}

func (s *Scanner) markAll(logger klog.Logger, watched map[string]int, xid uint64, reason string) {
	for uuid, index := range watched {
		s.mark(logger, uuid, index, xid, reason)
	}
}

// mark records a critical event on a GPU; the quiet period restarts.
func (s *Scanner) mark(logger klog.Logger, uuid string, index int, xid uint64, reason string) {
	now := s.cfg.clock.Now()
	s.mu.Lock()
	h, was := s.health[uuid]
	if !was {
		h = &gpuHealth{since: now}
		s.health[uuid] = h
	}
	h.xid, h.last, h.reason = xid, now, reason
	h.persistent = h.persistent || s.cfg.persistent[xid]
	s.mu.Unlock()
	if was {
		logger.V(4).Info("Unhealthy GPU had another critical event", "gpuUUID", uuid, "index", index, "xid", xid, "reason", reason)
		return
	}
	logger.Info("Marking GPU unhealthy", "gpuUUID", uuid, "index", index, "xid", xid, "reason", reason)
	s.notifyChanged()
}

// answered is called after the GPU answered a scan's queries; it applies the recovery rule
// and returns the GPU's health.
func (s *Scanner) answered(logger klog.Logger, uuid string) bool {
	return s.recoverGPU(logger, uuid, s.cfg.clock.Now())
}

// recoverGPU reports whether the GPU is healthy at now, marking an unhealthy one healthy when
// it is not persistent and has been quiet for the quiet period. Callers have just seen the GPU
// answer queries.
func (s *Scanner) recoverGPU(logger klog.Logger, uuid string, now time.Time) bool {
	s.mu.Lock()
	h, found := s.health[uuid]
	if found && (h.persistent || now.Sub(h.last) < s.cfg.quietPeriod) {
		s.mu.Unlock()
		return false
	}
	delete(s.health, uuid)
	s.mu.Unlock()
	if found {
		logger.Info("GPU healthy again: quiet period over and it answers queries", "gpuUUID", uuid,
			"xid", h.xid, "unhealthyFor", now.Sub(h.since).String())
		s.notifyChanged()
	}
	return true
}

// probe queries every unhealthy GPU whose quiet period is over and recovers those that answer.
func (s *Scanner) probe(logger klog.Logger) {
	now := s.cfg.clock.Now()
	s.mu.Lock()
	var due []string
	for uuid, h := range s.health {
		if !h.persistent && now.Sub(h.last) >= s.cfg.quietPeriod {
			due = append(due, uuid)
		}
	}
	s.mu.Unlock()
	slices.Sort(due)
	for _, uuid := range due {
		if err := s.answers(uuid); err != nil {
			logger.V(3).Info("Unhealthy GPU does not answer queries yet", "gpuUUID", uuid, "err", err)
			continue
		}
		s.recoverGPU(logger, uuid, now)
	}
}

// answers makes the queries a scan needs of the GPU.
func (s *Scanner) answers(uuid string) error {
	dev, ret := s.lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("get handle: %w", ret)
	}
	if _, ret := dev.GetMemoryInfo(); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
		return fmt.Errorf("get memory: %w", ret)
	}
	if _, ret := dev.GetName(); ret != nvml.SUCCESS {
		return fmt.Errorf("get name: %w", ret)
	}
	return nil
}
