package nodeagent

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// Sentinel errors of the probes: test with errors.Is.
var (
	// ErrUnhealthy is the class of every error of [Agent.Healthy].
	ErrUnhealthy = errors.New("node agent unhealthy")
	// ErrNotReady is the class of every error of [Agent.Ready].
	ErrNotReady = errors.New("node agent not ready")
	// ErrNotRunning means [Agent.Run] is not running: not called yet, or returned. Both
	// probes' errors wrap it then, beside their class.
	ErrNotRunning = errors.New("node agent not running")
)

// UnhealthyScanPeriods is how many Options.Period a scan of the source may hang, or scans
// may keep failing, before [Agent.Healthy] reports the agent unhealthy: 3, 90 s with HAMi's
// 30 s period.
const UnhealthyScanPeriods = 3

// Paths of [ProbeHandler]: the kubelet's liveness and readiness probes, as the
// extender's.
const (
	PathHealthz = "/healthz"
	PathReadyz  = "/readyz"
)

// probeState is what the probes read of the current (or last) Run. The zero value is an
// agent that never ran.
type probeState struct {
	mu sync.Mutex
	// running is set from Run's start to its return.
	running bool
	// sendsAtStart is the device plugin's Sends counter when Run started: the kubelet has the
	// devices of this Run once it grew.
	sendsAtStart uint64
	// scans counts this Run's successful scans.
	scans uint64
	// scanning is when the scan in flight started, zero when none is.
	scanning time.Time
	// lastErr is the error of the last scan, nil when it succeeded or none ran;
	// failingSince is when the current run of failed scans began.
	lastErr      error
	failingSince time.Time
	// ready is set once Ready held during this Run; it stays until Run returns.
	ready bool
	// stopping is the error of the part that stops Run, set before Run returns it; stopped is
	// what the last Run returned, kept until the next Run.
	stopping, stopped error
}

func (p *probeState) start(sends uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.running, p.sendsAtStart, p.scans, p.scanning = true, sends, 0, time.Time{}
	p.lastErr, p.failingSince, p.ready, p.stopping, p.stopped = nil, time.Time{}, false, nil, nil
}

func (p *probeState) stop(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.running, p.ready, p.stopped, p.scanning = false, false, err, time.Time{}
}

func (p *probeState) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopping = err
}

func (p *probeState) scanStarted(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.scanning = now
}

func (p *probeState) scanDone(now time.Time, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.scanning = time.Time{}
	if err == nil {
		p.scans++
		p.lastErr, p.failingSince = nil, time.Time{}
		return
	}
	if p.lastErr == nil {
		p.failingSince = now
	}
	p.lastErr = err
}

// Healthy reports whether the agent works, for a liveness probe: nil while [Agent.Run] runs
// and its parts go on, an error wrapping [ErrUnhealthy] that says what is wrong otherwise:
//
//   - Run not running, before it is called or after it returned ([ErrNotRunning], with the
//     error Run returned);
//   - a part failed and Run is stopping (no kubelet socket at start, the registration rejected, a
//     [Runner] source failing: the cause is wrapped);
//   - a scan of the source has not returned for more than [UnhealthyScanPeriods] periods (a
//     driver call that hangs: restarting the process is the fix);
//   - every scan has failed for more than UnhealthyScanPeriods periods (the last scan's error
//     is wrapped): the published devices are that old.
//
// A kubelet that does not answer, or an API server that refuses the annotation, make the
// agent not ready ([Agent.Ready]) but not unhealthy: restarting the process does not help
// there. Healthy is cheap (no request) and safe for concurrent use.
func (a *Agent) Healthy() error {
	p := &a.probe
	p.mu.Lock()
	defer p.mu.Unlock()
	unhealthy := func(format string, args ...any) error {
		return fmt.Errorf("%w: node %s: "+format, append([]any{ErrUnhealthy, a.node}, args...)...)
	}
	if !p.running {
		if p.stopped != nil {
			return unhealthy("%w: Run returned: %w", ErrNotRunning, p.stopped)
		}
		return unhealthy("%w", ErrNotRunning)
	}
	if p.stopping != nil {
		return unhealthy("stopping: %w", p.stopping)
	}
	limit := UnhealthyScanPeriods * a.period
	now := a.clock.Now()
	if !p.scanning.IsZero() {
		if d := now.Sub(p.scanning); d > limit {
			return unhealthy("a scan of the device source has not returned for %v (more than %d periods of %v)", d.Round(time.Second), UnhealthyScanPeriods, a.period)
		}
	}
	if p.lastErr != nil {
		if d := now.Sub(p.failingSince); d > limit {
			return unhealthy("device scans failing for %v (more than %d periods of %v): %w", d.Round(time.Second), UnhealthyScanPeriods, a.period, p.lastErr)
		}
	}
	return nil
}

// Ready reports whether the node is published, for a readiness probe: nil once, during the
// current [Agent.Run], a scan succeeded, the register annotation carried it, the node's pod
// informer synced (with Options.MIG or Options.DRA) and the kubelet received the device list
// (the device plugin registered and its ListAndWatch sent the devices). Once ready the agent
// stays ready until Run returns: a device change, a kubelet restart or a failed write later
// are the business of the channels' own retries and of [Agent.Healthy], not a reason to take
// the node's metrics out of a Service. Otherwise the error wraps [ErrNotReady] and names the
// first step not done, with its cause (the last scan's or the annotation write's error) when
// there is one; before Run and after it returned it also wraps [ErrNotRunning]. Ready is cheap
// (no request) and safe for concurrent use. With Options.Monitor the node monitor must be
// ready too (its last scan read the region folders and listed the pods: monitor.Monitor.Ready).
func (a *Agent) Ready() error {
	if err := a.published(); err != nil || a.monitor == nil {
		return err
	}
	if err := a.monitor.Ready(); err != nil {
		return fmt.Errorf("%w: node %s: %w", ErrNotReady, a.node, err)
	}
	return nil
}

// published is Ready without the node monitor.
func (a *Agent) published() error {
	p := &a.probe
	p.mu.Lock()
	defer p.mu.Unlock()
	notReady := func(format string, args ...any) error {
		return fmt.Errorf("%w: node %s: "+format, append([]any{ErrNotReady, a.node}, args...)...)
	}
	switch {
	case !p.running:
		return notReady("%w", ErrNotRunning)
	case p.ready:
		return nil
	case p.stopping != nil:
		return notReady("stopping: %w", p.stopping)
	case p.scans == 0 && p.lastErr != nil:
		return notReady("no successful scan of the device source yet: %w", p.lastErr)
	case p.scans == 0:
		return notReady("waiting for the first scan of the device source")
	case a.pods != nil && !a.pods.synced.Load():
		return notReady("waiting for the informer of the node's pods to list them")
	}
	ps := a.plugin.Stats()
	if ps.Sends > p.sendsAtStart {
		// The plugin registers only once the annotation carries a scan and the pods synced.
		p.ready = true
		return nil
	}
	if !a.writer.InSync() {
		if err := a.writer.Stats().LastError; err != nil {
			return notReady("register annotation %s not written yet: %w", a.vendor.RegisterKey, err)
		}
		return notReady("register annotation %s not written yet", a.vendor.RegisterKey)
	}
	return notReady("the kubelet has not received the devices of resource %s yet (device plugin registrations %d, failed %d; ListAndWatch streams open %d)",
		a.vendor.ResourceName, ps.Registrations, ps.RegistrationFailures, ps.ActiveStreams)
}

// ProbeHandler returns a program's probes: GET [PathHealthz] answers healthy, GET
// [PathReadyz] answers ready, each 200 and "ok", or 503 and the error's text; other paths are
// 404. A node program passes [Agent.Healthy] and [Agent.Ready], or functions that add checks
// of its other parts (errors.Join(agent.Ready(), other.Ready())); a nil check always answers
// 200 (the process serves). Mount it at both paths of the program's mux (or at its root).
func ProbeHandler(healthy, ready func() error) http.Handler {
	probe := func(check func() error) http.HandlerFunc {
		if check == nil {
			check = func() error { return nil }
		}
		return func(w http.ResponseWriter, _ *http.Request) {
			if err := check(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = w.Write([]byte("ok\n"))
		}
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+PathHealthz, probe(healthy))
	mux.Handle("GET "+PathReadyz, probe(ready))
	return mux
}
