package main

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	restclient "k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hamireg/hamireg/diagnose"
)

// metricsText is the node monitor's answer: container cuda of team-b/train uses 1 GiB of
// 3000 MiB on one GPU, and its process 4242 drifts (HAMi-core 1000 MiB, NVML 2000 MiB).
const metricsText = `# TYPE hami_vgpu_memory_used_bytes gauge
hami_vgpu_memory_used_bytes{container="cuda",device_uuid="GPU-a",namespace="team-b",pod="train",vdevice_index="0",zone="vGPU"} 1.073741824e+09
# TYPE hami_vgpu_memory_limit_bytes gauge
hami_vgpu_memory_limit_bytes{container="cuda",device_uuid="GPU-a",namespace="team-b",pod="train",vdevice_index="0",zone="vGPU"} 3.145728e+09
# TYPE hami_container_device_utilization_ratio gauge
hami_container_device_utilization_ratio{container="cuda",device_uuid="GPU-a",namespace="team-b",pod="train",vdevice_index="0",zone="vGPU"} 37
# TYPE hamireg_monitor_process_memory_bytes gauge
hamireg_monitor_process_memory_bytes{container="cuda",device_uuid="GPU-a",hostpid="4242",namespace="team-b",pod="train",source="hami-core",vdevice_index="0",zone="vGPU"} 1.048576e+09
hamireg_monitor_process_memory_bytes{container="cuda",device_uuid="GPU-a",hostpid="4242",namespace="team-b",pod="train",source="nvml",vdevice_index="0",zone="vGPU"} 2.097152e+09
`

// proxyBody is what the fake pod proxy answers.
type proxyBody string

func (p proxyBody) DoRaw(context.Context) ([]byte, error) { return []byte(p), nil }
func (p proxyBody) Stream(context.Context) (io.ReadCloser, error) {
	return io.NopCloser(strings.NewReader(string(p))), nil
}

// usageHarness serves a Running GPU pod on gpu-7, the device plugin Pod there, and the
// node monitor's answer through the pod proxy.
func usageHarness() *harness {
	pod := gpuPod("team-b", "train")
	pod.Spec.NodeName, pod.Spec.SchedulerName, pod.Status.Phase = "gpu-7", diagnose.DefaultSchedulerName, corev1.PodRunning
	pod.Annotations = map[string]string{"hami.io/vgpu-node": "gpu-7", "hami.io/bind-phase": "success",
		"hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,3000,0:;"}
	plugin := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: diagnose.DefaultNamespace, Name: "hami-device-plugin-x",
		Labels: map[string]string{"app.kubernetes.io/component": "hami-device-plugin"}},
		Spec:   corev1.PodSpec{NodeName: "gpu-7", Containers: []corev1.Container{{Name: "device-plugin"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	c := fake.NewClientset(pod, plugin)
	c.PrependProxyReactor("pods", func(k8stesting.Action) (bool, restclient.ResponseWrapper, error) {
		return true, proxyBody(metricsText), nil
	})
	h := newHarness()
	h.client = c
	return h
}

func TestPodUsageOutput(t *testing.T) {
	t.Parallel()
	kc := kubeconfig(t)
	h := usageHarness()
	out, errOut, code := h.run(t, "pod", "team-b/train", "--kubeconfig", kc)
	if code == exitError {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"GPU usage (node monitor kube-system/hami-device-plugin-x on node gpu-7)",
		"CONTAINER  GPU  UUID   USED      LIMIT     USED %  SM %  LAST KERNEL",
		"cuda       0    GPU-a  1024 MiB  3000 MiB  34 %    37 %  -",
		"CONTAINER  GPU  HOST PID  HAMI-CORE  NVML      DRIFT",
		"cuda       0    4242      1000 MiB   2000 MiB  -50.0 %",
		"GPUMemoryAccountingDrift: pod team-b/train container cuda, host PID 4242",
		"on node gpu-7 (not visible from the API server):",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
	out, errOut, _ = h.run(t, "pod", "team-b/train", "--kubeconfig", kc, "-o", "json")
	var doc struct {
		Kind  string `json:"kind"`
		Usage struct {
			PluginPod string `json:"pluginPod"`
			GPUs      []struct {
				Container  string  `json:"container"`
				UsedBytes  int64   `json:"usedBytes"`
				LimitBytes int64   `json:"limitBytes"`
				SMPercent  float64 `json:"smPercent"`
			} `json:"gpus"`
			Processes []struct {
				HostPID string  `json:"hostPID"`
				Drift   float64 `json:"drift"`
			} `json:"processes"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s%s", err, out, errOut)
	}
	u := doc.Usage
	if doc.Kind != kindPodReport || u.PluginPod != "kube-system/hami-device-plugin-x" || len(u.GPUs) != 1 || u.GPUs[0].UsedBytes != 1<<30 ||
		u.GPUs[0].LimitBytes != 3000<<20 || u.GPUs[0].SMPercent != 37 || len(u.Processes) != 1 || u.Processes[0].HostPID != "4242" || u.Processes[0].Drift != -0.5 {
		t.Errorf("JSON usage %+v", doc)
	}
	// --monitor-port -1 reads no monitor.
	out, _, _ = h.run(t, "pod", "team-b/train", "--kubeconfig", kc, "--monitor-port=-1")
	if strings.Contains(out, "GPU usage") {
		t.Errorf("usage printed with --monitor-port=-1:\n%s", out)
	}
}
