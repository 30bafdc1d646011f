package diagnose_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hamireg/hamireg/diagnose"
)

// A GPU node without the gpu=on label that HAMi's chart puts in the device plugin
// DaemonSet's nodeSelector gets no plugin Pod: case 1, and the fix is one kubectl command.
func ExampleNode() {
	client := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-7"}},
		pluginDaemonSet(), // the chart's DaemonSet: nodeSelector gpu=on
	)
	r, err := diagnose.Node(context.Background(), client, "gpu-7", diagnose.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.Case)
	fmt.Println(r.Case.Describe())
	f, _ := r.Finding(diagnose.CodeNodeSelectorMismatch)
	fmt.Println(f.Fix[0])
	// Output:
	// N1-PluginNotScheduled
	// case 1: device plugin not scheduled on the node
	// kubectl label node gpu-7 gpu=on
}

// A support bundle about a node of a cluster where only the Node exists: the archive holds
// the Node, its Events and the index, and the index says what could not be collected.
func ExampleWriteBundle() {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-7"}})
	var buf bytes.Buffer
	idx, err := diagnose.WriteBundle(context.Background(), client, diagnose.BundleTarget{Node: "gpu-7"}, &buf,
		diagnose.BundleOptions{Files: []diagnose.BundleFile{{Name: "report.txt", Data: []byte("case 1\n")}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	gz, err := gzip.NewReader(&buf)
	if err != nil {
		fmt.Println(err)
		return
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if h.Typeflag == tar.TypeReg {
			fmt.Println(strings.TrimPrefix(h.Name, idx.Root+"/"))
		}
	}
	fmt.Println(len(idx.Missing) > 0, strings.HasPrefix(idx.Missing[0], "daemonsets kube-system/hami-device-plugin:"))
	// Output:
	// index.txt
	// index.json
	// diagnosis/report.txt
	// events/nodes/gpu-7.yaml
	// nodes/gpu-7.yaml
	// true true
}

// A node monitor's answer, recorded (a support bundle's monitor/<ns>/<pod>.json holds the
// same, parsed): the pod's container uses 3500 MiB of a 3000 MiB limit on its GPU.
func ExampleParseMonitorScrape() {
	const metrics = `# TYPE hami_vgpu_memory_used_bytes gauge
hami_vgpu_memory_used_bytes{container="cuda",device_uuid="GPU-a",namespace="team-a",pod="train",vdevice_index="0",zone="vGPU"} 3.670016e+09
# TYPE hami_vgpu_memory_limit_bytes gauge
hami_vgpu_memory_limit_bytes{container="cuda",device_uuid="GPU-a",namespace="team-a",pod="train",vdevice_index="0",zone="vGPU"} 3.145728e+09
hami_vgpu_memory_limit_bytes{container="main",device_uuid="GPU-a",namespace="team-b",pod="other",vdevice_index="0",zone="vGPU"} 1.048576e+09
`
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "train"},
		Spec: corev1.PodSpec{NodeName: "gpu-7", SchedulerName: diagnose.DefaultSchedulerName, Containers: []corev1.Container{{Name: "cuda",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	m, err := diagnose.ParseMonitorScrape(strings.NewReader(metrics), pod)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(m.Series), "series of the pod")
	r, err := diagnose.AnalyzePod(diagnose.PodEvidence{Pod: pod, Monitor: m}, diagnose.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	g := r.Usage.GPUs[0]
	fmt.Printf("%s on %s: %d of %d MiB\n", g.Container, g.UUID, g.UsedMiB(), g.LimitMiB())
	f, _ := r.Finding(diagnose.CodeUsageOverLimit)
	fmt.Println(f.Case, f.Code)
	// Output:
	// 2 series of the pod
	// cuda on GPU-a: 3500 of 3000 MiB
	// P8-RunningWithoutLimits GPUMemoryOverLimit
}
