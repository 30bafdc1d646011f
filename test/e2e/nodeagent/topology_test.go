package nodeagent_test

import (
	"slices"
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

// TestTopologyAwarePlacement: examples/deviceplugin on a simulated 8-GPU DGX-1V (hybrid cube
// mesh of NVLinks) publishes its topology scores with the register annotation
// (--topology-score, HAMi's ENABLE_TOPOLOGY_SCORE=true); kube-scheduler, through
// examples/extender, places a topology-aware pod that fills GPU 7 (every GPU is equally
// connected: the first of the walk) and then a 2-GPU topology-aware pod, which gets GPUs 3
// and 2, the pair with two NVLinks and one PCIe switch, where spread would take 6 and 5.
func TestTopologyAwarePlacement(t *testing.T) {
	t.Parallel()
	ctx := harness.Context(t)
	f := newFixture(t, "--topology-score", "--simulate-topology", "hybrid-cube-mesh")
	var scores []annotation.PairScore
	harness.Eventually(t, "the score annotation", 20*time.Second, func() bool {
		var err error
		scores, err = annotation.DecodePairScores(cp.GetNode(t, f.Name).Annotations[annotation.KeyNVIDIAScore])
		return err == nil && len(scores) == gpus
	})
	if got := scores[6].Scores[f.ByIndex[7]]; scores[6].UUID != f.ByIndex[6] || got != 250 {
		t.Fatalf("score of GPU 6 to 7 = %d (entry %s), want 250: %+v", got, scores[6].UUID, scores)
	}
	f.MakeReady(t)
	if errExtenderBuild != nil {
		t.Fatal(errExtenderBuild)
	}
	url := cp.StartExtender(t, extenderBin, cp.LabelNodes(t, f)) // this test's node only: the package's other tests have theirs
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

	place := func(name string, limits corev1.ResourceList) allocation.ContainerDevices {
		t.Helper()
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.Namespace,
				Annotations: map[string]string{allocation.KeyGPUSchedulerPolicy: string(allocation.PolicyTopologyAware)}},
			Spec: corev1.PodSpec{SchedulerName: schedulerName, Containers: []corev1.Container{{
				Name: "cuda", Image: "registry.invalid/cuda:0", Resources: corev1.ResourceRequirements{Limits: limits}}}},
		}
		if _, err := cp.AdminClient().CoreV1().Pods(f.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		harness.Eventually(t, name+" bound", 30*time.Second, func() bool { //nolint:contextcheck // f.pod uses the test's context
			p, ok := f.Pod(t, name)
			if ok {
				pod = p
			}
			return ok && p.Spec.NodeName == f.Name && p.Annotations[allocation.KeyBindPhase] == string(allocation.PhaseAllocating)
		})
		if _, err := f.DM.Allocate(ctx, pod, "cuda"); err != nil { // the kubelet admits it: the node lock is released
			t.Fatalf("%s: Allocate: %v", name, err)
		}
		f.WantProtocolEnd(t, name, allocation.PhaseSuccess) //nolint:contextcheck // the helper uses the test's context
		pd, err := allocation.DecodePodDevices(pod.Annotations[annotation.KeyNVIDIAAllocated], allocation.VersionMaster)
		if err != nil || len(pd) != 1 {
			t.Fatalf("%s: %q: %v", name, pod.Annotations[annotation.KeyNVIDIAAllocated], err)
		}
		return pd[0]
	}
	index := func(devs allocation.ContainerDevices) []uint {
		var out []uint
		for _, d := range devs {
			for i, id := range f.ByIndex {
				if id == d.UUID {
					out = append(out, i)
				}
			}
		}
		return out
	}

	first := place("fill-gpu-7", corev1.ResourceList{resourceName: resource.MustParse("1"), "nvidia.com/gpumem-percentage": resource.MustParse("100")})
	if got := index(first); !slices.Equal(got, []uint{7}) {
		t.Fatalf("the first pod got GPUs %v, want [7]", got)
	}
	pair := place("nvlinked-pair", corev1.ResourceList{resourceName: resource.MustParse("2"), "nvidia.com/gpumem": resource.MustParse("1000")})
	if got := index(pair); !slices.Equal(got, []uint{3, 2}) {
		t.Fatalf("the 2-GPU pod got GPUs %v, want [3 2] (two NVLinks and one PCIe switch)", got)
	}

	// Without topology the same node state gives 6 and 5: the scores made the difference.
	devs := allocation.WithUsage(f.GPUs, allocation.PodDevices{first}.Usage())
	req := allocation.PodRequest{Containers: []allocation.Request{{Count: 2, Type: annotation.VendorNVIDIA, Memory: 1000}}}
	spread, _, ok := allocation.Fit(devs, req, nil, nil, allocation.Config{})
	if got := index(spread[0]); !ok || !slices.Equal(got, []uint{6, 5}) {
		t.Errorf("spread would choose %v (%v), want [6 5]", got, ok)
	}
}
