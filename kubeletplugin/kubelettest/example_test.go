package kubelettest_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

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
