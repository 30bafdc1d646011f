package draplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// LockFile is the name of the lock file in Options.PluginDir. Every change of the prepared
// state (Prepare, Unprepare, the stale-claim cleanup, the checkpoint's recovery) holds an
// exclusive flock(2) on it, so that two plugin processes on one PluginDir (a rolling update,
// an agent restarted while the old one still ends) never interleave. It is not the helper's
// serialize.lock (kubeletplugin.RollingUpdate), which covers only the gRPC calls and would
// deadlock against itself when taken twice by one process.
const LockFile = "prepare.lock"

// lockPoll bounds the wait between two tries of a held lock.
const (
	lockPollMin = time.Millisecond
	lockPollMax = 20 * time.Millisecond
)

// lock takes the plugin's lock: the in-process mutex, then the flock on [LockFile], waiting
// until ctx ends. With both held it brings the claims up to date with the checkpoint, which
// another process may have rewritten, and recovers a corrupted one (reported through
// [Plugin.HandleError]). unlock releases both.
func (p *Plugin) lock(ctx context.Context) (unlock func(), err error) {
	p.opMu.Lock()
	f, err := p.flock(ctx)
	if err != nil {
		p.opMu.Unlock()
		return nil, err
	}
	unlock = func() {
		_ = f.Close() // closing the only descriptor releases the flock
		p.opMu.Unlock()
	}
	if err := p.reload(ctx); err != nil {
		unlock()
		return nil, err
	}
	return unlock, nil
}

// openLock opens (creates) [LockFile].
func (p *Plugin) openLock() (*os.File, string, error) {
	path := filepath.Join(p.opts.PluginDir, LockFile)
	if err := os.MkdirAll(p.opts.PluginDir, 0o750); err != nil {
		return nil, path, fmt.Errorf("lock %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, path, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, path, nil
}

// flockWithoutContext locks [LockFile], waiting without end: for New, which has no
// context (holders keep the lock for file operations and bounded API calls only).
func (p *Plugin) flockWithoutContext() (*os.File, error) {
	f, path, err := p.openLock()
	if err != nil {
		return nil, err
	}
	if err := flockRetry(f, syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

// flock locks [LockFile], waiting until ctx ends.
func (p *Plugin) flock(ctx context.Context) (*os.File, error) {
	f, path, err := p.openLock()
	if err != nil {
		return nil, err
	}
	wait, logged := lockPollMin, false
	for {
		err := flockRetry(f, syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !logged {
			klog.FromContext(ctx).V(3).Info("Waiting for another process to release the DRA plugin's lock", "lock", path)
			logged = true
		}
		t := clock.RealClock{}.NewTimer(wait) // not Options.Clock: a fake clock must not stall Prepare
		select {
		case <-ctx.Done():
			t.Stop()
			_ = f.Close()
			return nil, fmt.Errorf("lock %s (held by another process): %w", path, context.Cause(ctx))
		case <-t.C():
		}
		wait = min(2*wait, lockPollMax)
	}
}

// flockRetry is flock(2), retried when a signal interrupts it.
func flockRetry(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// reload reads the checkpoint when its bytes differ from what this plugin last read or
// wrote, and makes it the plugin's claims; a corrupted one is recovered. p.opMu and the
// flock are held.
func (p *Plugin) reload(ctx context.Context) error {
	claims, sum, err := readCheckpoint(p.ckptPath, p.opts.Profile.Driver)
	if err == nil {
		if sum != p.ckptSum {
			p.mu.Lock()
			p.claims = claims
			p.mu.Unlock()
			p.ckptSum = sum
		}
		return nil
	}
	if !errors.Is(err, ErrCheckpointCorrupt) {
		return err
	}
	report, err := p.recoverCheckpoint(err)
	if err != nil {
		return err
	}
	p.HandleError(ctx, report, "Recovered the DRA checkpoint")
	return nil
}
