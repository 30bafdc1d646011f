package kubeletplugin

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// service implements the device-plugin service (and, in ModePluginWatcher, the plugin
// registration service) for one server instance.
type service struct {
	pluginapi.UnimplementedDevicePluginServer
	registerapi.UnimplementedRegistrationServer

	p            *Plugin
	s            *server
	logger       klog.Logger
	registerErrs chan<- error
}

var (
	_ pluginapi.DevicePluginServer   = (*service)(nil)
	_ registerapi.RegistrationServer = (*service)(nil)
)

func (v *service) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return v.p.pluginOptions(), nil
}

// ListAndWatch sends the full virtual device list at once and after every change, until the
// plugin stops this server (nil: the kubelet reads a clean end of stream) or the kubelet goes.
func (v *service) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	st := &v.p.stats
	st.streams.Add(1)
	st.activeStreams.Add(1)
	defer st.activeStreams.Add(^uint64(0)) // minus one
	v.logger.V(3).Info("ListAndWatch stream opened")
	for {
		devs, changed := v.p.snapshot()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			v.s.markLost()
			return err
		}
		st.sends.Add(1)
		v.logger.V(4).Info("Sent device list", "devices", len(devs))
		select {
		case <-changed:
		case <-v.s.stopping:
			return nil
		case <-stream.Context().Done():
			select {
			case <-v.s.stopping:
				return nil
			default:
			}
			v.s.markLost()
			return stream.Context().Err()
		}
	}
}

func (s *server) markLost() { s.lostOnce.Do(func() { close(s.streamLost) }) }

func (v *service) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	if v.p.opts.Allocate != nil {
		return v.p.opts.Allocate(klog.NewContext(ctx, v.logger), v.p.Devices(), req)
	}
	resp := &pluginapi.AllocateResponse{}
	for range req.GetContainerRequests() {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{})
	}
	return resp, nil
}

func (v *service) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	if v.p.opts.GetPreferredAllocation == nil {
		return nil, status.Error(codes.Unimplemented, "GetPreferredAllocation is not offered by this plugin")
	}
	return v.p.opts.GetPreferredAllocation(klog.NewContext(ctx, v.logger), v.p.Devices(), req)
}

func (v *service) PreStartContainer(ctx context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	if v.p.opts.PreStartContainer == nil {
		return &pluginapi.PreStartContainerResponse{}, nil
	}
	return v.p.opts.PreStartContainer(klog.NewContext(ctx, v.logger), v.p.Devices(), req)
}

// GetInfo tells the kubelet's plugin watcher what this socket is (ModePluginWatcher).
func (v *service) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.DevicePlugin,
		Name:              v.p.opts.Vendor.ResourceName,
		Endpoint:          v.p.opts.Endpoint,
		SupportedVersions: []string{pluginapi.Version},
	}, nil
}

// NotifyRegistrationStatus receives the kubelet's verdict (ModePluginWatcher); a rejection
// ends Run with a *RegistrationError.
func (v *service) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if st.GetPluginRegistered() {
		v.p.stats.registrations.Add(1)
		v.logger.V(1).Info("Registered device plugin with the kubelet's plugin watcher")
		return &registerapi.RegistrationStatusResponse{}, nil
	}
	v.p.stats.registrationFailures.Add(1)
	err := &RegistrationError{Endpoint: v.p.opts.Endpoint, ResourceName: v.p.opts.Vendor.ResourceName, Err: errors.New(st.GetError())}
	select {
	case v.registerErrs <- err:
	default:
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
