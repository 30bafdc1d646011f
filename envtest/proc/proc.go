package proc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrClosed is returned by [Spawner.Start] after [Spawner.Close].
var ErrClosed = errors.New("spawner closed")

// Spawner forks child processes from one OS thread that lives as long as the spawner.
type Spawner struct {
	reqs      chan startRequest
	done      chan struct{}
	closeOnce sync.Once
}

type startRequest struct {
	cmd   *exec.Cmd
	reply chan error
}

// NewSpawner starts the spawner's thread.
func NewSpawner() *Spawner {
	s := &Spawner{reqs: make(chan startRequest), done: make(chan struct{})}
	started := make(chan struct{})
	go func() {
		// Never unlocked: when this goroutine returns, the runtime ends the thread, and
		// the kernel delivers Pdeathsig to the children it forked.
		runtime.LockOSThread()
		close(started)
		for {
			select {
			case r := <-s.reqs:
				r.reply <- r.cmd.Start()
			case <-s.done:
				return
			}
		}
	}()
	<-started
	return s
}

// Close ends the spawner's thread; children it started that are still running get SIGKILL.
func (s *Spawner) Close() {
	s.closeOnce.Do(func() { close(s.done) })
}

// Options describes one child process.
type Options struct {
	// Name labels the process in errors, e.g. "kube-apiserver".
	Name string
	// Path and Args are the executable and its arguments (without argv[0]).
	Path string
	Args []string
	// Env is the child's environment; nil means the test binary's.
	Env []string
	// LogPath receives the child's stdout and stderr (appended). Required.
	LogPath string
	// Stdin, when set, is the child's standard input.
	Stdin *os.File
	// Stdout, when set, replaces LogPath as the child's standard output.
	Stdout *os.File
	// SysProcAttr is merged with Pdeathsig and Setpgid; use it for Cloneflags.
	SysProcAttr *syscall.SysProcAttr
}

// Process is a started child.
type Process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
}

// Start starts a child process as described by opts.
func (s *Spawner) Start(opts Options) (*Process, error) {
	logFile, err := os.OpenFile(opts.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open log of %s: %w", opts.Name, err)
	}
	defer func() { _ = logFile.Close() }() // the child holds its own descriptor

	cmd := exec.Command(opts.Path, opts.Args...)
	cmd.Env = opts.Env
	cmd.Stdout = logFile
	if opts.Stdout != nil {
		cmd.Stdout = opts.Stdout
	}
	cmd.Stderr = logFile
	if opts.Stdin != nil {
		cmd.Stdin = opts.Stdin
	}
	attr := &syscall.SysProcAttr{}
	if opts.SysProcAttr != nil {
		a := *opts.SysProcAttr
		attr = &a
	}
	attr.Pdeathsig = syscall.SIGKILL
	attr.Setpgid = true
	cmd.SysProcAttr = attr

	reply := make(chan error, 1)
	select {
	case s.reqs <- startRequest{cmd: cmd, reply: reply}:
	case <-s.done:
		return nil, fmt.Errorf("start %s: %w", opts.Name, ErrClosed)
	}
	if err := <-reply; err != nil {
		return nil, fmt.Errorf("start %s: %w", opts.Name, err)
	}
	p := &Process{name: opts.Name, logPath: opts.LogPath, cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// Pid is the child's process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited is closed when the child has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitError describes how the child ended once [Process.Exited] is closed (an
// *exec.ExitError, or "exit status 0"), and is nil while it runs.
func (p *Process) ExitError() error {
	select {
	case <-p.exited:
		if p.waitErr == nil {
			return errExitedZero
		}
		return p.waitErr
	default:
		return nil
	}
}

var errExitedZero = errors.New("exit status 0")

// LogPath is the file that holds the child's output.
func (p *Process) LogPath() string { return p.logPath }

// Stop sends SIGTERM to the child's process group, waits up to grace for it to exit, then
// sends SIGKILL and waits for the exit. It returns when the child is gone. A child that had
// already exited is not an error.
func (p *Process) Stop(grace time.Duration) error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
		return nil
	case <-t.C:
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.exited
	return fmt.Errorf("stop %s: did not exit within %v of SIGTERM, killed", p.name, grace)
}

// WaitUntil polls ready every interval until it returns true, ctx ends or the child exits,
// whichever comes first. The error says which, with the tail of the child's log.
func (p *Process) WaitUntil(ctx context.Context, interval time.Duration, ready func(context.Context) bool) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if ready(ctx) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w\n%s", p.name, context.Cause(ctx), p.LogTail(30))
		case <-p.exited:
			return fmt.Errorf("%s exited before it was ready (%w)\n%s", p.name, p.ExitError(), p.LogTail(30))
		case <-t.C:
		}
	}
}

// LogTail returns the last n lines of the child's log, indented, for error messages.
func (p *Process) LogTail(n int) string {
	return fmt.Sprintf("--- last lines of %s:\n%s", p.logPath, Tail(p.logPath, n))
}

// Tail returns the last n lines of the file at path (or why it cannot).
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}
