package monitor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/hamicore/region"
	"github.com/hamireg/hamireg/monitor"
)

// The node's folders as HAMi's device plugin and HAMi-core leave them, then a monitor that
// ties the region to its pod and reads it.
func ExampleMonitor_Containers() {
	root, err := os.MkdirTemp("", "vgpu")
	if err != nil {
		panic(err)
	}
	defer func() { _ = os.RemoveAll(root) }()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "trainer-0", UID: "0b1c2d3e-0000-4000-8000-00000000000a"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}}}
	folder := filepath.Join(root, "containers", string(pod.UID)+"_main")
	if err := os.MkdirAll(folder, 0o777); err != nil {
		panic(err)
	}
	gpu := region.Device{MemoryLimit: 4 << 30}
	if err := gpu.SetUUID("GPU-aa000000-1111-2222-3333-444455556666"); err != nil {
		panic(err)
	}
	proc := region.Slot{PID: 12, HostPID: 40012, Status: 1}
	proc.Used[0] = region.Memory{Total: 1 << 30}
	proc.Util[0].SM = 35
	if err := region.WriteFile(filepath.Join(folder, "9f8e7d6c.cache"), &region.Region{Layout: region.LayoutV1,
		DeviceCount: 1, Devices: []region.Device{gpu}, ProcNum: 1, Slots: []region.Slot{proc}, Priority: 1}); err != nil {
		panic(err)
	}

	pods := monitor.PodsFunc(func() ([]*corev1.Pod, error) { return []*corev1.Pod{pod}, nil })
	m, err := monitor.New(pods, monitor.Options{Root: root, NodeName: "node-1", DisableFeedback: true})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx) }()
	for m.Ready() != nil {
		time.Sleep(10 * time.Millisecond)
	}

	for _, c := range m.Containers(ctx) {
		if c.Err != nil {
			continue // this region changed under the read; the others are fine
		}
		for i := range c.Region.Devices {
			mem, sm := c.Region.Usage(i)
			fmt.Println(c.Pod, c.Name, c.Region.Devices[i].UUID(), mem.Total>>20, "MiB", sm, "%")
		}
	}
	cancel()
	fmt.Println(<-done)
	// Output:
	// team-a/trainer-0 main GPU-aa000000-1111-2222-3333-444455556666 1024 MiB 35 %
	// <nil>
}
