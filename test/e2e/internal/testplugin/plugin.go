package testplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Plugin is a running minimal device plugin.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	socket string

	mu      sync.Mutex
	devices []*pluginapi.Device
	changed chan struct{} // closed and replaced on every SetDevices
	srv     *grpc.Server
}

var _ pluginapi.DevicePluginServer = (*Plugin)(nil)

// Devices returns healthy+unhealthy devices with IDs dev-0, dev-1, …; the first healthy
// ones are Healthy.
func Devices(healthy, unhealthy int) []*pluginapi.Device {
	devs := make([]*pluginapi.Device, 0, healthy+unhealthy)
	for i := range healthy + unhealthy {
		h := pluginapi.Healthy
		if i >= healthy {
			h = pluginapi.Unhealthy
		}
		devs = append(devs, &pluginapi.Device{ID: "dev-" + strconv.Itoa(i), Health: h})
	}
	return devs
}

// Start serves the plugin on dir/name, removing a stale socket first.
func Start(dir, name string, devices []*pluginapi.Device) (*Plugin, error) {
	p := &Plugin{socket: filepath.Join(dir, name), devices: devices, changed: make(chan struct{})}
	if err := p.serve(); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Plugin) serve() error {
	if err := os.Remove(p.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	l, err := net.Listen("unix", p.socket)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", p.socket, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	p.mu.Lock()
	p.srv = srv
	p.mu.Unlock()
	go func() { _ = srv.Serve(l) }()
	return nil
}

// SocketPath is the plugin's socket; Endpoint in Register is its base name.
func (p *Plugin) SocketPath() string { return p.socket }

// Register sends a RegisterRequest for resource to the kubelet at kubeletSocket. It
// returns when the kubelet has answered, which (for a real kubelet) is after it dialled
// back and called GetDevicePluginOptions.
func (p *Plugin) Register(ctx context.Context, kubeletSocket, resource string) error {
	return p.RegisterVersion(ctx, kubeletSocket, resource, pluginapi.Version)
}

// RegisterVersion is Register with a given API version, to provoke version errors.
func (p *Plugin) RegisterVersion(ctx context.Context, kubeletSocket, resource, version string) error {
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial kubelet: %w", err)
	}
	defer func() { _ = conn.Close() }()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: resource,
	})
	return err
}

// SetDevices replaces the device list; every open ListAndWatch stream sends it.
func (p *Plugin) SetDevices(devices []*pluginapi.Device) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.devices = devices
	close(p.changed)
	p.changed = make(chan struct{})
}

// Stop stops the gRPC server (ending ListAndWatch streams) and removes the socket.
func (p *Plugin) Stop() {
	p.mu.Lock()
	srv := p.srv
	p.srv = nil
	p.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
	_ = os.Remove(p.socket)
}

// Restart stops the server and serves again on the same socket path.
func (p *Plugin) Restart() error {
	p.Stop()
	return p.serve()
}

// GetDevicePluginOptions reports no optional calls.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the device list now and after every SetDevices.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		p.mu.Lock()
		devs, changed := p.devices, p.changed
		p.mu.Unlock()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// Allocate answers every container request with an empty response.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{})
	}
	return resp, nil
}
