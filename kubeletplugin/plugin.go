package kubeletplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/clock"

	"github.com/hamireg/hamireg/annotation"
)

// Plugin is a device plugin for one extended resource. Create it with [New], feed it devices
// with [Plugin.SetDevices] and call [Plugin.Run]. All methods are safe for concurrent use.
type Plugin struct {
	opts       Options
	socketPath string

	running atomic.Bool

	mu      sync.Mutex
	devices []annotation.Device
	changed chan struct{} // closed and replaced on every SetDevices

	stats struct {
		registrations, registrationFailures, serves, streams, activeStreams, sends atomic.Uint64
	}
}

// Stats are counters for tests and debugging, in the spirit of the DRA helper's GetStats.
type Stats struct {
	// Registrations counts registrations the kubelet accepted (Register calls in
	// ModeRegister, NotifyRegistrationStatus with PluginRegistered in ModePluginWatcher).
	Registrations uint64
	// RegistrationFailures counts failed or rejected registrations.
	RegistrationFailures uint64
	// Serves counts gRPC server starts (1 + the restarts).
	Serves uint64
	// Streams counts ListAndWatch streams opened by the kubelet; ActiveStreams those open now.
	Streams, ActiveStreams uint64
	// Sends counts ListAndWatch messages sent.
	Sends uint64
}

// New validates opts, fills in the defaults and returns a Plugin that publishes no devices
// until SetDevices is called.
func New(opts Options) (*Plugin, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("create device plugin: %w", err)
	}
	p := &Plugin{opts: opts, changed: make(chan struct{})}
	p.socketPath = filepath.Join(opts.socketDir(), opts.SocketName)
	if opts.Mode == ModePluginWatcher && opts.Endpoint == "" {
		p.opts.Endpoint = p.socketPath
	}
	return p, nil
}

// SocketPath is the path of the plugin's socket in this process.
func (p *Plugin) SocketPath() string { return p.socketPath }

// KubeletSocketPath is <PluginDir>/kubelet.sock, where Register is sent.
func (p *Plugin) KubeletSocketPath() string {
	return filepath.Join(p.opts.PluginDir, KubeletSocketName)
}

// SetDevices replaces the published GPUs (health included) and, if the virtual device list
// changed, re-sends it on every open ListAndWatch stream. It never blocks on the kubelet.
func (p *Plugin) SetDevices(devices []annotation.Device) {
	next := annotation.Canonical(devices)
	p.mu.Lock()
	defer p.mu.Unlock()
	if devicesEqual(p.devices, next) {
		return
	}
	p.devices = next
	close(p.changed)
	p.changed = make(chan struct{})
}

func devicesEqual(a, b []annotation.Device) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID != b[i].ID || a[i].Health != b[i].Health || a[i].Numa != b[i].Numa || a[i].Count != b[i].Count {
			return false
		}
	}
	return true
}

// snapshot returns the virtual devices to send and the channel closed on the next change.
func (p *Plugin) snapshot() ([]*pluginapi.Device, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return VirtualDevices(p.devices, p.opts.NUMATopology), p.changed
}

// Devices returns the GPUs last given to [Plugin.SetDevices], in canonical order. The slice is
// shared: do not modify it.
func (p *Plugin) Devices() []annotation.Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.devices
}

// Stats returns the counters.
func (p *Plugin) Stats() Stats {
	return Stats{
		Registrations:        p.stats.registrations.Load(),
		RegistrationFailures: p.stats.registrationFailures.Load(),
		Serves:               p.stats.serves.Load(),
		Streams:              p.stats.streams.Load(),
		ActiveStreams:        p.stats.activeStreams.Load(),
		Sends:                p.stats.sends.Load(),
	}
}

// CheckPluginDir reports whether kubelet.sock is in dir, with a [*KubeletSocketError]
// (wrapping [ErrKubeletSocketMissing]) that names the folder and how to find the right one.
func CheckPluginDir(dir string) error {
	fi, err := os.Stat(filepath.Join(dir, KubeletSocketName))
	if err != nil {
		return &KubeletSocketError{Dir: dir, Err: err}
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return &KubeletSocketError{Dir: dir, Err: fmt.Errorf("%s is not a socket", fi.Name())}
	}
	return nil
}

// Run serves the plugin and keeps it registered until ctx is done, then stops the server
// (ending the ListAndWatch stream, so the kubelet marks the devices unhealthy), removes the
// socket and returns nil. Every goroutine it started has ended when it returns.
//
// It returns early with an error when the plugin cannot start (see [ErrKubeletSocketMissing],
// [ErrSocketInUse]) or when the kubelet rejects the registration ([ErrRegistrationRejected]);
// transient failures (kubelet not answering, kubelet restarting) are retried with backoff.
func (p *Plugin) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer p.running.Store(false)

	logger := klog.LoggerWithValues(klog.FromContext(ctx), "resourceName", p.opts.Vendor.ResourceName, "socket", p.socketPath, "mode", p.opts.Mode.String())
	ctx = klog.NewContext(ctx, logger)

	dir := p.opts.socketDir()
	if p.opts.Mode == ModeRegister {
		if err := CheckPluginDir(p.opts.PluginDir); err != nil {
			return err
		}
	} else if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("create plugin registry folder: %w", err)
	}
	unlock, err := lockSocket(p.socketPath)
	if err != nil {
		return err
	}
	defer unlock()

	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("create fsnotify watcher: %w", err)
	}
	defer func() { _ = watcher.Close() }()
	if err := watcher.Add(dir); err != nil {
		if p.opts.Mode == ModeRegister {
			return &KubeletSocketError{Dir: dir, Err: err}
		}
		return fmt.Errorf("watch %s: %w", dir, err)
	}

	l := &loop{p: p, logger: logger, backoff: p.opts.InitialBackoff}
	defer l.stopServer(ctx)
	return l.run(ctx, watcher)
}

// loop is the state of one Run; only Run's goroutine touches it.
type loop struct {
	p      *Plugin
	logger klog.Logger
	srv    *server

	registered   bool
	kubeletInfo  os.FileInfo // kubelet.sock we registered with
	backoff      time.Duration
	retry        clock.Timer
	streamLost   chan struct{} // of the current server
	registerErrs chan error    // ModePluginWatcher: rejection reported by the kubelet
}

func (l *loop) run(ctx context.Context, watcher *fsnotify.Watcher) error {
	p := l.p
	ticker := p.opts.Clock.NewTicker(p.opts.ResyncPeriod)
	defer ticker.Stop()
	defer l.stopRetry()
	l.registerErrs = make(chan error, 1)

	reconcile := func(reason string) error {
		l.stopRetry()
		err := l.reconcile(ctx, reason)
		var rej *RegistrationError
		if errors.As(err, &rej) {
			return err
		}
		if errors.Is(err, errInterrupted) {
			// The folder changed while registering (typically the kubelet restarting):
			// try again at once, against what is there now. No stream can be open: the
			// Register was not sent or failed for want of our socket.
			l.logger.V(2).Info("Registration interrupted, retrying", "err", err)
			l.retry = p.opts.Clock.NewTimer(0)
			return nil
		}
		if err != nil {
			p.stats.registrationFailures.Add(1)
			l.logger.Error(err, "Device plugin registration failed, retrying", "backoff", l.backoff)
			l.retry = p.opts.Clock.NewTimer(l.backoff)
			l.backoff = min(2*l.backoff, p.opts.MaxBackoff)
		}
		return nil
	}
	if err := reconcile("start"); err != nil {
		return err
	}
	for {
		var retryC <-chan time.Time
		if l.retry != nil {
			retryC = l.retry.C()
		}
		select {
		case <-ctx.Done():
			l.logger.V(2).Info("Stopping device plugin", "cause", context.Cause(ctx))
			return nil
		case ev, ok := <-watcher.Events:
			if !ok {
				return nil
			}
			if reason := l.trigger(ev); reason != "" {
				if err := reconcile(reason); err != nil {
					return err
				}
			}
		case err, ok := <-watcher.Errors:
			if !ok {
				return nil
			}
			l.logger.Error(err, "Watching the plugin folder failed; relying on the periodic check")
		case <-l.streamLost:
			// The kubelet went away (or dropped us). Stop serving now, so that it forgets the
			// endpoint, but register again only after InitialBackoff: a kubelet that is
			// restarting first deletes every socket in the folder, and a socket created
			// before that would be dialled in vain. Its CREATE of kubelet.sock (emitted after
			// the cleanup) usually comes first and triggers at once.
			l.logger.V(2).Info("ListAndWatch stream closed by the kubelet")
			l.registered = false
			l.stopServer(ctx)
			l.stopRetry()
			l.retry = p.opts.Clock.NewTimer(p.opts.InitialBackoff)
		case <-retryC:
			l.retry = nil
			if err := reconcile("retry"); err != nil {
				return err
			}
		case <-ticker.C():
			if l.retry == nil {
				if err := reconcile("periodic check"); err != nil {
					return err
				}
			}
		case err := <-l.registerErrs:
			return err
		}
	}
}

// trigger says why ev calls for a reconcile, or "" when it does not.
func (l *loop) trigger(ev fsnotify.Event) string {
	switch {
	case ev.Name == l.p.KubeletSocketPath() && ev.Has(fsnotify.Create):
		l.backoff = l.p.opts.InitialBackoff // a new kubelet: try at once
		return "kubelet socket created"
	case ev.Name == l.p.socketPath && (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)):
		// Only the loss of the current server's socket counts: the plugin removes its own
		// old sockets when it restarts, and those events arrive later.
		if l.srv != nil && !l.srv.socketIntact() {
			return "plugin socket removed"
		}
		return ""
	default:
		return ""
	}
}

// errInterrupted marks a registration abandoned because the folder changed under it.
var errInterrupted = errors.New("registration interrupted")

func (l *loop) stopRetry() {
	if l.retry != nil {
		l.retry.Stop()
		l.retry = nil
	}
}

// reconcile brings the plugin to "serving and registered with the kubelet that owns
// kubelet.sock now". It restarts only when something changed, and it always stops the old
// server (ending its stream and waiting for the kubelet to drop the connection) before it
// registers again: one Register per server, never while a stream of the same endpoint is open.
func (l *loop) reconcile(ctx context.Context, reason string) error {
	p := l.p
	if p.opts.Mode == ModePluginWatcher {
		if l.srv != nil && l.srv.socketIntact() && !l.srv.lost() {
			return nil
		}
		l.logger.V(2).Info("Serving device plugin for the plugin watcher", "reason", reason)
		l.stopServer(ctx)
		return l.startServer(ctx)
	}

	kubeletSock := p.KubeletSocketPath()
	kfi, err := os.Stat(kubeletSock)
	if err != nil {
		// The kubelet is restarting (it deletes and re-creates kubelet.sock); the CREATE
		// event or the periodic check brings us back.
		if l.registered {
			l.logger.V(2).Info("Kubelet socket gone, waiting for the kubelet", "reason", reason)
		}
		l.registered = false
		return nil
	}
	if l.registered && l.srv != nil && os.SameFile(kfi, l.kubeletInfo) && l.srv.socketIntact() && !l.srv.lost() {
		return nil
	}
	if l.srv != nil {
		l.logger.V(2).Info("Restarting device plugin", "reason", reason)
	}
	l.registered = false
	l.stopServer(ctx)
	if err := l.startServer(ctx); err != nil {
		return err
	}
	// The socket must still be there once kubelet.sock is: a kubelet that starts deletes
	// every socket before it creates kubelet.sock, and would wait 10 s dialling a deleted one.
	kfi, err = os.Stat(kubeletSock)
	if err != nil || !l.srv.socketIntact() {
		l.stopServer(ctx)
		return fmt.Errorf("register with kubelet: the folder changed while serving: %w", errInterrupted)
	}
	// A Register in flight is never cancelled (only its own timeout ends it): a cancelled
	// call may still complete inside the kubelet and open a stream the plugin does not
	// know about, and the next Register would then be a duplicate.
	if err := p.register(ctx); err != nil {
		var rej *RegistrationError
		if errors.As(err, &rej) && !l.srv.socketIntact() {
			// The kubelet could not dial back because our socket vanished (a kubelet
			// restart's cleanup): not a verdict on the plugin.
			err = fmt.Errorf("register with kubelet: plugin socket removed during the call: %w: %w", errInterrupted, rej.Err)
		}
		// The kubelet may have connected before the failure surfaced here: the next attempt
		// starts from a fresh server, so it never meets a stream of this one.
		l.stopServer(ctx)
		return err
	}
	l.registered = true
	l.kubeletInfo = kfi
	l.backoff = p.opts.InitialBackoff
	p.stats.registrations.Add(1)
	l.logger.V(1).Info("Registered device plugin with the kubelet", "kubeletSocket", kubeletSock)
	return nil
}

func (l *loop) startServer(ctx context.Context) error {
	srv, err := l.p.serve(ctx, l.registerErrs)
	if err != nil {
		return err
	}
	l.srv = srv
	l.streamLost = srv.streamLost
	return nil
}

func (l *loop) stopServer(ctx context.Context) {
	if l.srv == nil {
		return
	}
	l.srv.stop(ctx, l.p.opts.Clock, l.p.opts.DrainTimeout)
	l.srv = nil
	l.streamLost = nil
}

// register sends Register to kubelet.sock. A rejection by the kubelet (gRPC code Unknown:
// the kubelet's handler returned an error) is a *RegistrationError; anything else is
// transient.
func (p *Plugin) register(ctx context.Context) error {
	kubeletSock := p.KubeletSocketPath()
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial kubelet at %s: %w", kubeletSock, err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, p.opts.RegisterTimeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     p.opts.SocketName,
		ResourceName: p.opts.Vendor.ResourceName,
		Options:      p.pluginOptions(),
	})
	if err == nil {
		return nil
	}
	if status.Code(err) == codes.Unknown {
		p.stats.registrationFailures.Add(1)
		return &RegistrationError{KubeletSocket: kubeletSock, Endpoint: p.opts.SocketName, ResourceName: p.opts.Vendor.ResourceName, Err: err}
	}
	return fmt.Errorf("register with kubelet at %s: %w", kubeletSock, err)
}

func (p *Plugin) pluginOptions() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{
		PreStartRequired:                p.opts.PreStartContainer != nil,
		GetPreferredAllocationAvailable: p.opts.GetPreferredAllocation != nil,
	}
}

// server is one gRPC server instance on the plugin socket.
type server struct {
	grpc       *grpc.Server
	info       os.FileInfo // the socket file it created
	path       string
	stopping   chan struct{} // closed to end ListAndWatch streams
	streamLost chan struct{} // closed when the kubelet closed a stream on its own
	lostOnce   sync.Once
	serveDone  chan struct{}

	mu       sync.Mutex
	conns    int
	connsMod chan struct{} // closed and replaced when conns changes
}

func (s *server) lost() bool {
	select {
	case <-s.streamLost:
		return true
	default:
		return false
	}
}

// socketIntact reports whether the socket file this server created is still in place.
func (s *server) socketIntact() bool {
	fi, err := os.Stat(s.path)
	return err == nil && os.SameFile(fi, s.info)
}

func (s *server) connDelta(d int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conns += d
	close(s.connsMod)
	s.connsMod = make(chan struct{})
}

// stop ends the streams, waits (up to drain) until the kubelet has closed its connections —
// it does so when it handles the end of the stream, right before it forgets the endpoint —
// then stops the gRPC server (which waits for the handlers) and removes the socket.
func (s *server) stop(ctx context.Context, clk clock.Clock, drain time.Duration) {
	close(s.stopping)
	timer := clk.NewTimer(drain)
	defer timer.Stop()
wait:
	for {
		s.mu.Lock()
		n, mod := s.conns, s.connsMod
		s.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-mod:
		case <-timer.C():
			klog.FromContext(ctx).V(2).Info("Kubelet kept its connection after the stream ended; closing it", "connections", n)
			break wait
		case <-ctx.Done():
			break wait
		}
	}
	s.grpc.Stop()
	<-s.serveDone
	if s.socketIntact() {
		_ = os.Remove(s.path)
	}
}

// serve removes a stale socket, listens and serves the device-plugin service (and, in
// ModePluginWatcher, the registration service).
func (p *Plugin) serve(ctx context.Context, registerErrs chan<- error) (*server, error) {
	if err := removeStaleSocket(p.socketPath); err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "unix", p.socketPath)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", p.socketPath, err)
	}
	info, err := os.Stat(p.socketPath)
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("stat %s: %w", p.socketPath, err)
	}
	s := &server{
		grpc:       grpc.NewServer(grpc.WaitForHandlers(true)),
		info:       info,
		path:       p.socketPath,
		stopping:   make(chan struct{}),
		streamLost: make(chan struct{}),
		serveDone:  make(chan struct{}),
		connsMod:   make(chan struct{}),
	}
	svc := &service{p: p, s: s, logger: klog.FromContext(ctx), registerErrs: registerErrs}
	pluginapi.RegisterDevicePluginServer(s.grpc, svc)
	if p.opts.Mode == ModePluginWatcher {
		registerapi.RegisterRegistrationServer(s.grpc, svc)
	}
	p.stats.serves.Add(1)
	go func() {
		defer close(s.serveDone)
		// Serve returns when Stop is called; an error before that leaves the socket dead,
		// which the periodic check notices.
		if err := s.grpc.Serve(&countingListener{Listener: ln, s: s}); err != nil {
			klog.FromContext(ctx).Error(err, "Device plugin gRPC server failed")
		}
	}()
	return s, nil
}

// removeStaleSocket removes a socket nobody serves; a socket that answers belongs to a live
// plugin, and ErrSocketInUse is returned instead.
func removeStaleSocket(path string) error {
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		_ = conn.Close()
		return fmt.Errorf("serve on %s: %w", path, ErrSocketInUse)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	return nil
}

// lockSocket takes an exclusive flock on <socket>.lock, so two Plugins (in this process or
// another) never serve and register the same endpoint. The kubelet's folder cleanup removes
// only sockets, so the lock file survives kubelet restarts; the lock dies with the process.
func lockSocket(socketPath string) (func(), error) {
	path := socketPath + ".lock"
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock %s: %w", path, ErrSocketInUse)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { _ = f.Close() }, nil
}

type countingListener struct {
	net.Listener
	s *server
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.s.connDelta(1)
	return &countedConn{Conn: c, s: l.s}, nil
}

type countedConn struct {
	net.Conn
	s    *server
	once sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.s.connDelta(-1) })
	return err
}
