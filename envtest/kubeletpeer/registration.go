package kubeletpeer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	dpserver "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
)

// EventKind says what a device plugin did, as seen by the kubelet.
type EventKind string

// The kubelet-side events of a device plugin's life.
const (
	// EventConnected means Register succeeded: the kubelet dialled the plugin's socket and
	// called GetDevicePluginOptions (whose answer is in Event.Options).
	EventConnected EventKind = "Connected"
	// EventListAndWatch means the plugin sent a device list (in Event.Devices).
	EventListAndWatch EventKind = "ListAndWatch"
	// EventDisconnected means the ListAndWatch stream ended (plugin stopped, socket gone)
	// or the server was stopped.
	EventDisconnected EventKind = "Disconnected"
)

// Event is one thing the registration server's handler saw.
type Event struct {
	Kind       EventKind
	Resource   string
	SocketPath string
	// Options is the plugin's GetDevicePluginOptions answer (EventConnected only).
	Options *pluginapi.DevicePluginOptions
	// Devices is the device list of one ListAndWatch message (EventListAndWatch only).
	Devices []*pluginapi.Device
}

// Healthy counts the devices of an EventListAndWatch whose Health is "Healthy", the
// kubelet's rule for allocatable.
func (e Event) Healthy() int {
	n := 0
	for _, d := range e.Devices {
		if d.Health == pluginapi.Healthy {
			n++
		}
	}
	return n
}

// RegistrationServer is the kubelet's own device-plugin registration server
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1) serving kubelet.sock in a
// folder, with a handler that records what plugins do instead of the device manager. It
// validates Register requests with the kubelet's code (API version, extended resource name),
// dials the plugin back at <dir>/<Endpoint> and streams ListAndWatch.
type RegistrationServer struct {
	dir     string
	logger  klog.Logger
	handler *recorder

	mu  sync.Mutex
	srv dpserver.Server
}

// StartRegistrationServer serves kubelet.sock in dir (created if missing; keep
// len(dir)+len("/kubelet.sock") under 108 bytes). Like the kubelet, it first deletes every
// unix socket in dir. The server logs through klog.FromContext(ctx).
func StartRegistrationServer(ctx context.Context, dir string) (*RegistrationServer, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", dir, err)
	}
	if err := checkSocketPath(filepath.Join(dir, "kubelet.sock")); err != nil {
		return nil, err
	}
	s := &RegistrationServer{dir: dir, logger: klog.FromContext(ctx), handler: newRecorder()}
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *RegistrationServer) start() error {
	srv, err := dpserver.NewServer(s.logger, s.SocketPath(), s.handler, s.handler)
	if err != nil {
		return fmt.Errorf("create registration server: %w", err)
	}
	if err := srv.Start(s.logger); err != nil {
		return fmt.Errorf("start registration server: %w", err)
	}
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
	return nil
}

// SocketPath is <dir>/kubelet.sock, where plugins send Register.
func (s *RegistrationServer) SocketPath() string { return filepath.Join(s.dir, "kubelet.sock") }

// Dir is the folder the server serves in; plugin sockets must live here too.
func (s *RegistrationServer) Dir() string { return s.dir }

// Events delivers what the handler saw, in order. It is buffered (4096); events beyond a
// full buffer are dropped and counted by Dropped.
func (s *RegistrationServer) Events() <-chan Event { return s.handler.events }

// Dropped is the number of events dropped because nobody read Events.
func (s *RegistrationServer) Dropped() int { return s.handler.dropped() }

// WaitFor reads Events until match returns true, and returns that event; events read on
// the way are discarded.
func (s *RegistrationServer) WaitFor(ctx context.Context, match func(Event) bool) (Event, error) {
	for {
		select {
		case e := <-s.handler.events:
			if match(e) {
				return e, nil
			}
		case <-ctx.Done():
			return Event{}, fmt.Errorf("wait for registration event: %w", context.Cause(ctx))
		}
	}
}

// Check is the kubelet's healthz check of the server: nil while gRPC serves.
func (s *RegistrationServer) Check() error {
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	if srv == nil {
		return errors.New("registration server stopped")
	}
	return srv.Check(nil)
}

// Restart simulates a kubelet restart: stop the server (disconnecting every plugin), then
// start a new one on the same folder, which deletes the plugins' sockets and re-creates
// kubelet.sock. Plugins must notice and register again.
func (s *RegistrationServer) Restart() error {
	if err := s.Stop(); err != nil {
		return err
	}
	return s.start()
}

// Stop stops the server and disconnects every plugin. It is safe to call more than once.
func (s *RegistrationServer) Stop() error {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	if err := srv.Stop(s.logger); err != nil {
		return fmt.Errorf("stop registration server: %w", err)
	}
	_ = os.Remove(s.SocketPath())
	return nil
}

// recorder implements the kubelet's RegistrationHandler and ClientHandler the way
// ManagerImpl does where a plugin can tell (socket cleanup, GetDevicePluginOptions on
// connect) and records the rest as events.
type recorder struct {
	events chan Event
	mu     sync.Mutex
	drops  int
}

var (
	_ dpserver.RegistrationHandler = (*recorder)(nil)
	_ dpserver.ClientHandler       = (*recorder)(nil)
)

func newRecorder() *recorder { return &recorder{events: make(chan Event, 4096)} }

func (r *recorder) emit(e Event) {
	select {
	case r.events <- e:
	default:
		r.mu.Lock()
		r.drops++
		r.mu.Unlock()
	}
}

func (r *recorder) dropped() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.drops
}

// CleanupPluginDirectory deletes every unix socket in dir, as ManagerImpl does at start.
func (r *recorder) CleanupPluginDirectory(_ klog.Logger, dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if e.Type()&os.ModeSocket == 0 {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// PluginConnected calls GetDevicePluginOptions, as ManagerImpl does.
func (r *recorder) PluginConnected(ctx context.Context, resource string, p dpserver.DevicePlugin) error {
	opts, err := p.API().GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil {
		return fmt.Errorf("failed to get device plugin options: %w", err)
	}
	r.emit(Event{Kind: EventConnected, Resource: resource, SocketPath: p.SocketPath(), Options: opts})
	return nil
}

func (r *recorder) PluginDisconnected(_ klog.Logger, resource, socketPath string) {
	r.emit(Event{Kind: EventDisconnected, Resource: resource, SocketPath: socketPath})
}

func (r *recorder) PluginListAndWatchReceiver(_ klog.Logger, resource string, resp *pluginapi.ListAndWatchResponse) {
	r.emit(Event{Kind: EventListAndWatch, Resource: resource, Devices: resp.GetDevices()})
}

// checkSocketPath rejects unix socket paths the kernel cannot bind (sun_path is 108 bytes
// including the terminating NUL).
func checkSocketPath(path string) error {
	if len(path) >= 108 {
		return fmt.Errorf("unix socket path %q is %d bytes; the limit is 107", path, len(path))
	}
	return nil
}
