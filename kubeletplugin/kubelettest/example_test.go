package kubelettest_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
)

// A fake kubelet outside a test function (in a test, use Start(t)): a plugin registers and
// the fake reads its device list.
func ExampleNewServer() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k, err := kubelettest.NewServer(ctx)
	if err != nil {
		panic(err)
	}
	defer k.Close()

	// A plugin serving on the fake's folder.
	ln, err := net.Listen("unix", filepath.Join(k.Dir(), "vendor.sock"))
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, rawPlugin{})
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	conn, _ := grpc.NewClient("unix://"+k.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer func() { _ = conn.Close() }()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: "vendor.sock", ResourceName: "vendor.com/gpu",
	})
	fmt.Println("register:", err)

	s, _ := k.WaitFor(ctx, func(s kubelettest.State) bool {
		p, ok := s.Resource("vendor.com/gpu")
		return ok && p.Messages > 0
	})
	p, _ := s.Resource("vendor.com/gpu")
	fmt.Printf("devices %d, healthy %d, duplicates %d\n", len(p.Devices), p.Healthy(), s.Duplicates)
	// Output:
	// register: <nil>
	// devices 2, healthy 1, duplicates 0
}

// A test calls the plugin as the kubelet does when it admits a pod: it picks healthy replica
// IDs, calls Allocate with them and reads the container's answer.
func ExampleKubelet_Allocate() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k, err := kubelettest.NewServer(ctx) // in tests: kubelettest.Start(t)
	if err != nil {
		panic(err)
	}
	defer k.Close()

	plugin, err := kubeletplugin.New(kubeletplugin.Options{
		Vendor:    annotation.Vendor{Name: "acme", ResourceName: "acme.com/npu"},
		PluginDir: k.Dir(), SocketName: "acme.sock",
		Allocate: func(_ context.Context, _ []annotation.Device, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
			resp := &pluginapi.AllocateResponse{}
			for _, c := range req.GetContainerRequests() {
				resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
					Envs: map[string]string{"ACME_VISIBLE_DEVICES": strings.Join(c.GetDevicesIds(), ",")},
				})
			}
			return resp, nil
		},
	})
	if err != nil {
		panic(err)
	}
	plugin.SetDevices([]annotation.Device{{ID: "npu-0", Count: 2, Health: true}, {ID: "npu-1", Count: 2, Health: true}})
	done := make(chan error, 1)
	go func() { done <- plugin.Run(ctx) }()

	if _, err := k.WaitFor(ctx, func(s kubelettest.State) bool {
		p, ok := s.Resource("acme.com/npu")
		return ok && p.Healthy() == 4
	}); err != nil {
		panic(err)
	}
	ids, err := k.PickHealthy(ctx, "acme.com/npu", 3)
	if err != nil {
		panic(err)
	}
	resp, err := k.Allocate(ctx, "acme.com/npu", ids) // one container
	if err != nil {
		panic(err)
	}
	fmt.Println(resp.GetContainerResponses()[0].GetEnvs()["ACME_VISIBLE_DEVICES"])
	fmt.Println("handed out:", k.State().Allocated["acme.com/npu"])
	cancel()
	fmt.Println("Run:", <-done)
	// Output:
	// npu-0-0,npu-0-1,npu-1-0
	// handed out: [npu-0-0 npu-0-1 npu-1-0]
	// Run: <nil>
}
