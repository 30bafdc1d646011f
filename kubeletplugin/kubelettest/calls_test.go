package kubelettest_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
)

// sdkPlugin runs a kubeletplugin.Plugin for "acme.com/npu" with devices against k until the
// test ends.
func sdkPlugin(t *testing.T, k *kubelettest.Kubelet, opts kubeletplugin.Options, devices ...annotation.Device) {
	t.Helper()
	opts.Vendor = annotation.Vendor{Name: "acme", ResourceName: "acme.com/npu"}
	opts.PluginDir = k.Dir()
	opts.SocketName = "acme.sock"
	p, err := kubeletplugin.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	p.SetDevices(devices)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("plugin Run = %v", err)
		}
	})
	wait(t, k, func(s kubelettest.State) bool {
		p, ok := s.Resource("acme.com/npu")
		return ok && p.Messages > 0
	})
}

func npus() []annotation.Device {
	return []annotation.Device{
		{ID: "npu-a", Count: 2, Health: true},
		{ID: "npu-b", Count: 2, Health: false},
		{ID: "npu-c", Count: 1, Health: true},
	}
}

// Allocate, GetPreferredAllocation and PreStartContainer reach the plugin over the
// connection the fake dialed, with the kubelet's requests.
func TestCalls(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	var (
		mu       sync.Mutex
		prestart [][]string
	)
	sdkPlugin(t, k, kubeletplugin.Options{
		Allocate: func(_ context.Context, _ []annotation.Device, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
			resp := &pluginapi.AllocateResponse{}
			for _, c := range req.GetContainerRequests() {
				resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
					Envs: map[string]string{"ACME_VISIBLE": strings.Join(c.GetDevicesIds(), ",")},
				})
			}
			return resp, nil
		},
		GetPreferredAllocation: func(_ context.Context, _ []annotation.Device, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
			resp := &pluginapi.PreferredAllocationResponse{}
			for _, c := range req.GetContainerRequests() { // the last ones: not what the kubelet picks by itself
				avail := c.GetAvailableDeviceIDs()
				resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: avail[len(avail)-int(c.GetAllocationSize()):]})
			}
			return resp, nil
		},
		PreStartContainer: func(_ context.Context, _ []annotation.Device, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
			mu.Lock()
			defer mu.Unlock()
			prestart = append(prestart, req.GetDevicesIds())
			return &pluginapi.PreStartContainerResponse{}, nil
		},
	}, npus()...)
	ctx := t.Context()

	ids, err := k.PickHealthy(ctx, "acme.com/npu", 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"npu-a-1", "npu-c-0"}; !cmp.Equal(ids, want) {
		t.Errorf("PickHealthy = %v, want the plugin's preference %v", ids, want)
	}
	resp, err := k.Allocate(ctx, "acme.com/npu", ids, []string{"npu-a-0"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range resp.GetContainerResponses() {
		got = append(got, c.GetEnvs()["ACME_VISIBLE"])
	}
	if want := []string{"npu-a-1,npu-c-0", "npu-a-0"}; !cmp.Equal(got, want) {
		t.Errorf("Allocate envs = %v, want %v", got, want)
	}
	if a := k.State().Allocated["acme.com/npu"]; !cmp.Equal(a, []string{"npu-a-1", "npu-c-0", "npu-a-0"}) {
		t.Errorf("Allocated = %v", a)
	}
	// Everything healthy is handed out now.
	if _, err := k.PickHealthy(ctx, "acme.com/npu", 1); !errors.Is(err, kubelettest.ErrNotEnoughDevices) {
		t.Errorf("PickHealthy after every device was handed out = %v, want ErrNotEnoughDevices", err)
	}

	pref, err := k.GetPreferredAllocation(ctx, "acme.com/npu", []string{"npu-a-0", "npu-a-1", "npu-c-0"}, []string{"npu-a-0"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ids := pref.GetContainerResponses()[0].GetDeviceIDs(); !cmp.Equal(ids, []string{"npu-c-0"}) {
		t.Errorf("GetPreferredAllocation = %v", ids)
	}
	if _, err := k.PreStartContainer(ctx, "acme.com/npu", []string{"npu-a-0"}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !cmp.Equal(prestart, [][]string{{"npu-a-0"}}) {
		t.Errorf("PreStartContainer saw %v", prestart)
	}
}

// Without GetPreferredAllocation the fake picks the first healthy replicas in sorted order;
// a plugin error reaches the test as the gRPC status; an unknown resource is ErrNoPlugin.
func TestCallsWithoutPreference(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	sdkPlugin(t, k, kubeletplugin.Options{
		Allocate: func(context.Context, []annotation.Device, *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
			return nil, errors.New("no pod for these devices")
		},
	}, npus()...)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ids, err := k.PickHealthy(ctx, "acme.com/npu", 3)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"npu-a-0", "npu-a-1", "npu-c-0"}; !cmp.Equal(ids, want) {
		t.Errorf("PickHealthy = %v, want %v", ids, want)
	}
	_, err = k.Allocate(ctx, "acme.com/npu", ids)
	if status.Code(errors.Unwrap(err)) != codes.Unknown || !strings.Contains(err.Error(), "no pod for these devices") {
		t.Errorf("Allocate = %v, want the plugin's error", err)
	}
	if a := k.State().Allocated["acme.com/npu"]; len(a) != 0 {
		t.Errorf("a failed Allocate recorded %v", a)
	}
	if _, err := k.Allocate(ctx, "other.com/gpu", []string{"x"}); !errors.Is(err, kubelettest.ErrNoPlugin) {
		t.Errorf("Allocate of an unknown resource = %v, want ErrNoPlugin", err)
	}
	if _, err := k.PickHealthy(ctx, "acme.com/npu", 4); !errors.Is(err, kubelettest.ErrNotEnoughDevices) {
		t.Errorf("PickHealthy(4) = %v, want ErrNotEnoughDevices", err)
	}
}
