package nodeagent_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// TestFullLoop: kube-scheduler configured from examples/extender's manifests calls the
// extender process, which filters and binds 20 GPU pods onto two nodes, each running
// examples/deviceplugin against the kubelet's device manager; the test plays the kubelet's
// admission (ManagerImpl.Allocate per container, as soon as a pod is bound). Every pod ends
// with bind-phase success, the env of the GPUs the extender chose, and no lock on either node.
func TestFullLoop(t *testing.T) {
	t.Parallel()
	ctx := harness.Context(t)
	nodes := []*harness.GPUNode{newFixture(t), newFixture(t)}
	byName := map[string]*harness.GPUNode{}
	for _, f := range nodes {
		byName[f.Name] = f
		f.MakeReady(t) // the kubelet's node status, Ready, without the not-ready taint
	}
	// The extender registers this test's nodes only: the other tests' nodes of the package's
	// cluster would be candidates as well.
	if errExtenderBuild != nil {
		t.Fatal(errExtenderBuild)
	}
	url := cp.StartExtender(t, extenderBin, "--node-scheduler-policy", "spread", cp.LabelNodes(t, nodes...))
	cfg, schedulerName := ownScheduler(t, url)
	sched, err := cp.StartScheduler(ctx, envtest.SchedulerOptions{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-scheduler log:\n%s", sched.LogTail(40))
		}
		_ = sched.Stop()
	})

	const pods, mem, cores = 20, 4000, 20
	ns := nodes[0].Namespace
	for i := range pods {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("loop-%02d", i), Namespace: ns},
			Spec: corev1.PodSpec{SchedulerName: schedulerName, Containers: []corev1.Container{{
				Name: "cuda", Image: "registry.invalid/cuda:0",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					resourceName:          resource.MustParse("1"),
					"nvidia.com/gpumem":   resource.MustParse(strconv.Itoa(mem)),
					"nvidia.com/gpucores": resource.MustParse(strconv.Itoa(cores)),
				}},
			}}},
		}
		if _, err := cp.AdminClient().CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// The kubelet: admit each pod once it is bound, one Allocate per GPU container.
	admitted := map[string]bool{}
	perNode := map[string]int{}
	harness.Eventually(t, "20 pods bound and allocated", 3*time.Minute, func() bool {
		list, err := cp.AdminClient().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for i := range list.Items {
			pod := &list.Items[i]
			f := byName[pod.Spec.NodeName]
			if f == nil || admitted[pod.Name] || pod.Annotations[allocation.KeyBindPhase] != string(allocation.PhaseAllocating) {
				continue
			}
			admitted[pod.Name] = true
			perNode[f.Name]++
			pd, err := allocation.DecodePodDevices(pod.Annotations[annotation.KeyNVIDIAAllocated], allocation.VersionMaster)
			if err != nil || len(pd) != 1 || len(pd[0]) != 1 {
				t.Errorf("pod %s: %s = %q (%v), want one device", pod.Name, annotation.KeyNVIDIAAllocated, pod.Annotations[annotation.KeyNVIDIAAllocated], err)
				continue
			}
			if d := pd[0][0]; d.Usedmem != mem || d.Usedcores != cores {
				t.Errorf("pod %s: the extender chose %+v, want %d MiB and %d%% cores", pod.Name, d, mem, cores)
			}
			got, err := f.DM.Allocate(ctx, pod, "cuda")
			if err != nil {
				t.Errorf("pod %s: ManagerImpl.Allocate: %v", pod.Name, err)
				continue
			}
			wantContainer(t, pod, "cuda", pd[0], got, nil)
		}
		done := 0
		for _, p := range list.Items {
			if p.Annotations[allocation.KeyBindPhase] == string(allocation.PhaseSuccess) {
				done++
			}
		}
		return done == pods
	})

	for _, f := range nodes {
		harness.Eventually(t, "no lock on "+f.Name, 10*time.Second, func() bool { return f.Lock(t) == "" })
		if perNode[f.Name] == 0 {
			t.Errorf("node %s got no pod (spread policy): %v", f.Name, perNode)
		}
		if !f.Plugin.Running() {
			t.Errorf("deviceplugin of %s exited: %v", f.Name, f.Plugin.ExitError())
		}
	}
	// No GPU over-committed: 5 pods of 20 % cores at most per GPU.
	list, err := cp.AdminClient().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]int32{}
	for _, p := range list.Items {
		pd, _ := allocation.DecodePodDevices(p.Annotations[annotation.KeyNVIDIAAllocated], allocation.VersionMaster)
		for _, e := range pd {
			for _, d := range e {
				used[d.GPU()] += d.Usedcores
			}
		}
	}
	for gpu, c := range used {
		if c > 100 {
			t.Errorf("GPU %s holds %d%% cores", gpu, c)
		}
	}
	t.Logf("pods per node: %v; GPUs used: %d", perNode, len(used))
}
