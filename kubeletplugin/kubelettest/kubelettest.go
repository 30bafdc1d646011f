package kubelettest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// dialTimeout is how long Register waits for the plugin to answer on its socket, like the
// kubelet's blocking 10 s dial.
const dialTimeout = 10 * time.Second

// Kubelet is a fake kubelet registration server. Create it with [Start].
type Kubelet struct {
	base context.Context // everything the fake starts ends with it
	dir  string

	mu      sync.Mutex
	srv     *grpc.Server
	served  chan struct{}   // closed when Serve returned
	ctx     context.Context // of the current incarnation; cancelled by Restart and Stop
	cancel  context.CancelFunc
	reject  error
	state   State
	conns   map[string]*grpc.ClientConn // open plugin connections by socket path
	changed chan struct{}
	wg      sync.WaitGroup // stream readers
}

// State is what the fake kubelet has seen.
type State struct {
	// Requests are the Register requests received, accepted or not, in order.
	Requests []*pluginapi.RegisterRequest
	// Registrations counts accepted Register requests.
	Registrations int
	// Duplicates counts Register requests for an endpoint whose ListAndWatch stream was still
	// open: the real kubelet rejects them and orphans the open stream (see the package doc).
	Duplicates int
	// Restarts counts calls of Restart.
	Restarts int
	// Plugins are the plugins that registered, by socket path.
	Plugins map[string]Plugin
	// Allocated are the replica IDs that successful [Kubelet.Allocate] calls handed out, by
	// resource name, in order: [Kubelet.PickHealthy] leaves them out, as the kubelet leaves
	// out the devices of running containers. A plugin's re-registration keeps them.
	Allocated map[string][]string
}

// Plugin is one registered endpoint as the fake kubelet sees it.
type Plugin struct {
	ResourceName string
	SocketPath   string
	// Options is the plugin's GetDevicePluginOptions answer.
	Options *pluginapi.DevicePluginOptions
	// Connected is true while the ListAndWatch stream is open.
	Connected bool
	// Devices is the last device list received; Messages counts the lists.
	Devices  []*pluginapi.Device
	Messages int
}

// Healthy counts the devices whose Health is "Healthy" (the kubelet's allocatable).
func (p Plugin) Healthy() int {
	n := 0
	for _, d := range p.Devices {
		if d.GetHealth() == pluginapi.Healthy {
			n++
		}
	}
	return n
}

// Resource returns the connected plugin for resourceName, if any.
func (s State) Resource(resourceName string) (Plugin, bool) {
	for _, p := range s.Plugins {
		if p.ResourceName == resourceName && p.Connected {
			return p, true
		}
	}
	return Plugin{}, false
}

// Start serves kubelet.sock in a new short temporary folder and registers a cleanup that
// stops the server and removes the folder when the test ends.
func Start(tb testing.TB) *Kubelet {
	tb.Helper()
	k, err := NewServer(tb.Context())
	if err != nil {
		tb.Fatalf("kubelettest: %v", err)
	}
	tb.Cleanup(k.Close)
	return k
}

// NewServer is Start for code without a testing.TB (examples, benchmarks' helpers): the
// caller must call Close. The server stops when ctx ends, too.
func NewServer(ctx context.Context) (*Kubelet, error) {
	dir, err := os.MkdirTemp("", "kp")
	if err != nil {
		return nil, fmt.Errorf("create folder: %w", err)
	}
	k := &Kubelet{base: ctx, dir: dir, conns: map[string]*grpc.ClientConn{}, changed: make(chan struct{})}
	k.state.Plugins = map[string]Plugin{}
	k.state.Allocated = map[string][]string{}
	if err := k.serve(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return k, nil
}

// Close stops the server, closes every plugin connection, waits for the fake's goroutines
// and removes the folder. It is idempotent.
func (k *Kubelet) Close() {
	k.Stop()
	_ = os.RemoveAll(k.dir)
}

// Dir is the fake kubelet's device-plugin folder: plugins put their sockets here.
func (k *Kubelet) Dir() string { return k.dir }

// SocketPath is Dir()/kubelet.sock.
func (k *Kubelet) SocketPath() string {
	return filepath.Join(k.dir, filepath.Base(pluginapi.KubeletSocket))
}

// Reject makes the following Register calls fail with err (nil: accept again).
func (k *Kubelet) Reject(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.reject = err
}

// State returns a copy of what the fake kubelet has seen.
func (k *Kubelet) State() State {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.copyState()
}

func (k *Kubelet) copyState() State {
	s := k.state
	s.Requests = make([]*pluginapi.RegisterRequest, len(k.state.Requests))
	for i, r := range k.state.Requests {
		s.Requests[i] = proto.CloneOf(r)
	}
	s.Plugins = make(map[string]Plugin, len(k.state.Plugins))
	for path, p := range k.state.Plugins {
		p.Devices = slices.Clone(p.Devices)
		for i, d := range p.Devices {
			p.Devices[i] = proto.CloneOf(d)
		}
		s.Plugins[path] = p
	}
	s.Allocated = make(map[string][]string, len(k.state.Allocated))
	for r, ids := range k.state.Allocated {
		s.Allocated[r] = slices.Clone(ids)
	}
	return s
}

// WaitFor returns the first state for which cond is true, or ctx's error with the last state.
func (k *Kubelet) WaitFor(ctx context.Context, cond func(State) bool) (State, error) {
	for {
		k.mu.Lock()
		s, changed := k.copyState(), k.changed
		k.mu.Unlock()
		if cond(s) {
			return s, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return s, fmt.Errorf("wait for kubelet state: %w", context.Cause(ctx))
		}
	}
}

// notify wakes WaitFor; k.mu must be held.
func (k *Kubelet) notify() {
	close(k.changed)
	k.changed = make(chan struct{})
}

// Restart is a kubelet restart as plugins see it: the server stops (closing every
// ListAndWatch stream), every unix socket in Dir() is deleted (the plugins' and kubelet.sock)
// and kubelet.sock is served again.
func (k *Kubelet) Restart() error {
	k.shutdown()
	entries, err := os.ReadDir(k.dir)
	if err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	for _, e := range entries {
		if e.Type() == fs.ModeSocket {
			_ = os.Remove(filepath.Join(k.dir, e.Name()))
		}
	}
	k.mu.Lock()
	k.state.Restarts++
	k.notify()
	k.mu.Unlock()
	if err := k.serve(); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	return nil
}

// Stop stops the server and closes every plugin connection (a kubelet that went away); it
// is idempotent. Restart serves again.
func (k *Kubelet) Stop() {
	k.shutdown()
}

func (k *Kubelet) serve() error {
	path := k.SocketPath()
	_ = os.Remove(path)
	var lc net.ListenConfig
	ln, err := lc.Listen(k.base, "unix", path)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", path, err)
	}
	srv := grpc.NewServer(grpc.WaitForHandlers(true))
	pluginapi.RegisterRegistrationServer(srv, &registration{k: k})
	ctx, cancel := context.WithCancel(k.base)
	done := make(chan struct{})
	k.mu.Lock()
	k.srv, k.ctx, k.cancel, k.served = srv, ctx, cancel, done
	k.mu.Unlock()
	go func() {
		defer close(done)
		_ = srv.Serve(ln) // returns when shutdown stops the server
	}()
	return nil
}

func (k *Kubelet) shutdown() {
	k.mu.Lock()
	srv, cancel, done := k.srv, k.cancel, k.served
	k.srv = nil
	conns := k.conns
	k.conns = map[string]*grpc.ClientConn{}
	k.mu.Unlock()
	if srv == nil {
		return
	}
	cancel()
	srv.Stop()
	<-done
	for _, c := range conns {
		_ = c.Close()
	}
	k.wg.Wait()
}

type registration struct {
	pluginapi.UnimplementedRegistrationServer
	k *Kubelet
}

// Register validates like the kubelet, dials the plugin back at Dir()/Endpoint, asks for its
// options and starts reading its ListAndWatch stream.
func (r *registration) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k := r.k
	path := filepath.Join(k.dir, req.GetEndpoint())
	k.mu.Lock()
	k.state.Requests = append(k.state.Requests, proto.CloneOf(req))
	k.notify()
	reject, kctx := k.reject, k.ctx
	dup := k.state.Plugins[path].Connected
	if dup {
		k.state.Duplicates++
	}
	k.mu.Unlock()

	switch {
	case reject != nil:
		return nil, reject
	case req.GetVersion() != pluginapi.Version:
		return nil, fmt.Errorf("requested API version %q is not supported by kubelet. Supported version is %q", req.GetVersion(), pluginapi.SupportedVersions)
	case !validResourceName(req.GetResourceName()):
		return nil, fmt.Errorf("the ResourceName %q is invalid", req.GetResourceName())
	case dup:
		return nil, fmt.Errorf("device plugin already connected: %s", path)
	}

	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("failed to dial device plugin: %w", err)
	}
	client := pluginapi.NewDevicePluginClient(conn)
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	opts, err := client.GetDevicePluginOptions(dctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("failed to get device plugin options: %w", err)
	}
	stream, err := client.ListAndWatch(kctx, &pluginapi.Empty{}) //nolint:contextcheck // the stream outlives this RPC: it ends with the fake kubelet's incarnation
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("failed to open ListAndWatch: %w", err)
	}

	k.mu.Lock()
	if k.srv == nil || kctx.Err() != nil { // restarted or stopped meanwhile
		k.mu.Unlock()
		_ = conn.Close()
		return nil, errors.New("kubelet is shutting down")
	}
	k.conns[path] = conn
	k.state.Registrations++
	k.state.Plugins[path] = Plugin{ResourceName: req.GetResourceName(), SocketPath: path, Options: opts, Connected: true}
	k.notify()
	k.wg.Add(1)
	k.mu.Unlock()
	go k.read(path, conn, stream)
	return &pluginapi.Empty{}, nil
}

func (k *Kubelet) read(path string, conn *grpc.ClientConn, stream grpc.ServerStreamingClient[pluginapi.ListAndWatchResponse]) {
	defer k.wg.Done()
	for {
		resp, err := stream.Recv()
		k.mu.Lock()
		p := k.state.Plugins[path]
		if err != nil {
			p.Connected = false
			k.state.Plugins[path] = p
			if k.conns[path] == conn {
				delete(k.conns, path)
			}
			k.notify()
			k.mu.Unlock()
			_ = conn.Close()
			return
		}
		p.Devices = resp.GetDevices()
		p.Messages++
		k.state.Plugins[path] = p
		k.notify()
		k.mu.Unlock()
	}
}

// validResourceName is the shape of the kubelet's extended-resource check: a "/" and not in
// the kubernetes.io namespace, not starting with "requests.".
func validResourceName(name string) bool {
	domain, _, ok := strings.Cut(name, "/")
	if !ok || strings.HasPrefix(name, "requests.") {
		return false
	}
	return domain != "kubernetes.io" && !strings.HasSuffix(domain, ".kubernetes.io")
}
