package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
	"github.com/hamireg/hamireg/monitor"
	"github.com/hamireg/hamireg/monitor/monitortest"
)

// With --prepare-state-dir (the default) the program runs the node monitor on
// <hook-path>/vgpu: a region HAMi-core would write for a container of a pod on the node is
// served on /metrics as HAMi's vGPUmonitor serves it, beside the simulated GPUs' host
// families, and /readyz waits for the monitor's first scan too.
func TestRunServesTheMonitor(t *testing.T) {
	t.Parallel()
	k := kubelettest.Start(t)
	root, err := os.MkdirTemp("", "dp") //nolint:usetesting // socket paths must stay < 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	if err := os.Symlink(k.Dir(), filepath.Join(root, "device-plugins")); err != nil {
		t.Fatal(err)
	}
	hook := t.TempDir()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "team-a", UID: "0b1c2d3e-0000-4000-8000-00000000000a"},
		Spec: corev1.PodSpec{NodeName: "gpu-1", Containers: []corev1.Container{{Name: "cuda"}}}}
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}}, pod)
	if _, err := monitortest.WriteContainer(filepath.Join(hook, "vgpu"), pod.UID, "cuda", "c0", monitortest.Region(4242,
		monitortest.GPU{UUID: "GPU-aa000000-1111-2222-3333-444455556666", Limit: 4 << 30, Used: 1 << 30, SMUtil: 20})); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--simulate", "dgxh100", "--metrics-bind-address", "127.0.0.1:0", "--kubelet-root-dir", root,
			"--hook-path", hook, "--monitor-period", "50ms", "--legacy-metrics", "-v", "2"}, &stderr,
			host{getenv: env(map[string]string{"NODE_NAME": "gpu-1"}), client: cs})
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("run = %d\n%s", code, stderr.String())
		}
	}()
	url := servingAddress(t, &stderr)
	want := []string{
		`hami_vgpu_memory_used_bytes{container="cuda",device_uuid="GPU-aa000000-1111-2222-3333-444455556666",namespace="team-a",pod="train",vdevice_index="0",zone="vGPU"} 1.073741824e+09`,
		`hami_vgpu_memory_limit_bytes{container="cuda",device_uuid="GPU-aa000000-1111-2222-3333-444455556666",namespace="team-a",pod="train",vdevice_index="0",zone="vGPU"} 4.294967296e+09`,
		`hami_container_device_utilization_ratio{container="cuda",device_uuid="GPU-aa000000-1111-2222-3333-444455556666",namespace="team-a",pod="train",vdevice_index="0",zone="vGPU"} 20`,
		`vGPU_device_memory_usage_in_bytes{ctrname="cuda",deviceuuid="GPU-aa000000-1111-2222-3333-444455556666",podname="train",podnamespace="team-a",vdeviceid="0",zone="vGPU"} 1.073741824e+09`,
		"# TYPE hami_host_gpu_memory_used_bytes gauge",
		`hami_host_gpu_utilization_ratio{device_index="0",device_type="NVIDIA-`,
		"# TYPE hamireg_nodeagent_scans_total counter",
	}
	var body string
	deadline := time.Now().Add(30 * time.Second)
	for {
		var code int
		code, body = get(t, url+"/metrics")
		missing := ""
		for _, w := range want {
			if !strings.Contains(body, w) {
				missing = w
				break
			}
		}
		if code == 200 && missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics = %d, lacks %q:\n%s", code, missing, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for {
		if code, _ := get(t, url+"/readyz"); code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("/readyz never 200 with the monitor")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(stderr.String(), "in monitorpath") {
		t.Errorf("no HAMi adoption line in the log:\n%s", stderr.String())
	}
	if _, err := os.Stat(filepath.Join(hook, "vgpu", monitor.ContainersDir)); err != nil {
		t.Errorf("containers folder: %v", err)
	}
}
