package kubeletplugin_test

import (
	"context"
	"fmt"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
)

// A plugin registers two GPUs split 4 ways with a (fake) kubelet; one GPU turns unhealthy
// and the kubelet sees allocatable drop; a kubelet restart is followed by re-registration.
func ExamplePlugin() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kubelet, err := kubelettest.NewServer(ctx) // in tests: kubelettest.Start(t)
	if err != nil {
		panic(err)
	}
	defer kubelet.Close()

	p, err := kubeletplugin.New(kubeletplugin.Options{PluginDir: kubelet.Dir()})
	if err != nil {
		panic(err)
	}
	gpus := []annotation.Device{
		{ID: "GPU-0fc1", Index: 0, Count: 4, Health: true}, // Count: the split count
		{ID: "GPU-7a2e", Index: 1, Count: 4, Numa: 1, Health: true},
	}
	p.SetDevices(gpus)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	show := func(want func(kubelettest.Plugin) bool) {
		s, err := kubelet.WaitFor(ctx, func(s kubelettest.State) bool {
			pl, ok := s.Resource("nvidia.com/gpu")
			return ok && want(pl)
		})
		if err != nil {
			panic(err)
		}
		pl, _ := s.Resource("nvidia.com/gpu")
		fmt.Printf("registrations %d: capacity %d, allocatable %d, first %s\n", s.Registrations, len(pl.Devices), pl.Healthy(), pl.Devices[0].GetID())
	}
	show(func(pl kubelettest.Plugin) bool { return pl.Healthy() == 8 })

	gpus[1].Health = false
	p.SetDevices(gpus)
	show(func(pl kubelettest.Plugin) bool { return pl.Healthy() == 4 })

	if err := kubelet.Restart(); err != nil {
		panic(err)
	}
	show(func(pl kubelettest.Plugin) bool { return pl.Healthy() == 4 })

	cancel()
	fmt.Println("Run:", <-done)
	// Output:
	// registrations 1: capacity 8, allocatable 8, first GPU-0fc1-0
	// registrations 1: capacity 8, allocatable 4, first GPU-0fc1-0
	// registrations 2: capacity 8, allocatable 4, first GPU-0fc1-0
	// Run: <nil>
}

// The kubelet hands Allocate the ids the plugin published; ParseVirtualDeviceID tells which
// GPU each one is a replica of.
func ExampleParseVirtualDeviceID() {
	id := kubeletplugin.VirtualDeviceID("GPU-0fc1a2b3-4c5d", 7)
	uuid, replica, err := kubeletplugin.ParseVirtualDeviceID(id)
	fmt.Println(id, uuid, replica, err)
	_, _, err = kubeletplugin.ParseVirtualDeviceID("MIG-4f5e")
	fmt.Println(err)
	// Output:
	// GPU-0fc1a2b3-4c5d-7 GPU-0fc1a2b3-4c5d 7 <nil>
	// parse device id "MIG-4f5e": replica "4f5e" is not a non-negative decimal: invalid virtual device id
}

// The package documentation's usage snippet, compiled: serve devices to a kubelet started with
// --root-dir=/var/lib/k0s/kubelet.
func ExampleNew() {
	run := func(ctx context.Context, devices []annotation.Device) error {
		// snippet: doc
		p, err := kubeletplugin.New(kubeletplugin.Options{PluginDir: kubeletplugin.PluginDirFromRootDir("/var/lib/k0s/kubelet")})
		if err != nil {
			return err
		}
		p.SetDevices(devices) // []annotation.Device, e.g. from nvmlscan; call again on health changes
		return p.Run(ctx)
		// end snippet
	}
	_ = run
}

// What ListAndWatch sends for two GPUs on NUMA nodes 0 and 1 (split 2) and a MIG device: the
// NUMA node rides on the GPUs' replicas only with NUMATopology (HAMi v2.10.0's
// enableNumaTopology), on the MIG device always.
func ExampleVirtualDevices() {
	devices := []annotation.Device{
		{ID: "GPU-0fc1", Index: 0, Count: 2, Numa: 0, Health: true},
		{ID: "GPU-7a2e", Index: 1, Count: 2, Numa: 1, Health: true},
		{ID: "MIG-4f5e", Index: 2, Count: 2, Numa: 1, Health: true},
	}
	for _, numa := range []bool{false, true} {
		fmt.Printf("NUMATopology %v:", numa)
		for _, d := range kubeletplugin.VirtualDevices(devices, numa) {
			fmt.Printf(" %s", d.ID)
			if d.Topology != nil {
				fmt.Printf("@%d", d.Topology.Nodes[0].ID)
			}
		}
		fmt.Println()
	}
	// Output:
	// NUMATopology false: GPU-0fc1-0 GPU-0fc1-1 GPU-7a2e-0 GPU-7a2e-1 MIG-4f5e@1
	// NUMATopology true: GPU-0fc1-0@0 GPU-0fc1-1@0 GPU-7a2e-0@1 GPU-7a2e-1@1 MIG-4f5e@1
}
