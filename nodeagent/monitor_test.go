package nodeagent_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/clienttest"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
	"github.com/hamireg/hamireg/monitor"
	"github.com/hamireg/hamireg/monitor/monitortest"
	"github.com/hamireg/hamireg/nodeagent"
)

// With Options.Monitor the agent runs the node monitor on its own pod informer: a region
// written for a container of a pod on the node shows up on the agent's Registerer with
// HAMi's families, and the monitor is ready once its first scan ran.
func TestRunMonitor(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, monitor.ContainersDir), 0o777); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "team-a", UID: "uid-1"},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "cuda"}}}}
	cs := clienttest.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, pod)
	uuid := gpus(1)[0].ID
	if _, err := monitortest.WriteContainer(root, pod.UID, "cuda", "c0", monitortest.Region(4242,
		monitortest.GPU{UUID: uuid, Limit: 4 << 30, Used: 1 << 30, SMUtil: 20})); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	a, stop := runAgent(t, cs, newSource(gpus(2)), kubelettest.Start(t), nodeagent.Options{
		Registerer: reg,
		Monitor:    &monitor.Options{Root: root, Period: 20 * time.Millisecond},
	})
	if a.Monitor() == nil {
		t.Fatal("Monitor() is nil with Options.Monitor")
	}
	want := `# HELP hami_vgpu_memory_used_bytes vGPU device memory usage in bytes
# TYPE hami_vgpu_memory_used_bytes gauge
hami_vgpu_memory_used_bytes{container="cuda",device_uuid="` + uuid + strings.Repeat("\x00", max(0, 40-len(uuid))) + `",namespace="team-a",pod="train",vdevice_index="0",zone="vGPU"} 1.073741824e+09
`
	var err error
	waitFor(t, "the monitor's series of team-a/train", func() bool {
		err = testutil.GatherAndCompare(reg, strings.NewReader(want), "hami_vgpu_memory_used_bytes")
		return err == nil && a.Monitor().Ready() == nil
	})
	if err := stop(); err != nil {
		t.Errorf("Run = %v", err)
	}
}

// A monitor that cannot work refuses the agent at New, naming the field.
func TestNewRefusesMonitor(t *testing.T) {
	t.Parallel()
	_, err := nodeagent.New(newClientset(), node, newSource(gpus(1)), nodeagent.Options{
		Monitor: &monitor.Options{Period: -time.Second},
	})
	if !errors.Is(err, monitor.ErrInvalidOptions) || !strings.Contains(err.Error(), "Period") {
		t.Fatalf("New = %v, want monitor.ErrInvalidOptions naming Period", err)
	}
}
