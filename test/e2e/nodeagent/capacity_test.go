package nodeagent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// capacityRole is the ClusterRole of the agents started with --report-node-capacity: exactly
// nodeagent.ClusterRoleRulesFor(Options{NodeCapacity: true}).
const capacityRole = "e2e-nodeagent-node-capacity"

// TestNodeCapacity: examples/deviceplugin --report-node-capacity on the kubelet's device
// manager writes the healthy GPUs' nvidia.com/gpumem (the register annotation's MiB, after
// --device-memory-scaling) and nvidia.com/gpucores into the Node's status capacity and
// allocatable through the real API server, with the RBAC of ClusterRoleRulesFor; the
// kubelet's own status writes keep them; kube-scheduler, configured from
// examples/extender's manifests (the resources ignoredByScheduler), still schedules a pod that
// does not ask them, and the extender places a GPU pod asking them.
func TestNodeCapacity(t *testing.T) {
	t.Parallel()
	ctx := harness.Context(t)
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: capacityRole}, Rules: nodeagent.ClusterRoleRulesFor(nodeagent.Options{NodeCapacity: true})}
	if _, err := cp.AdminClient().RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if errAgentBuild != nil {
		t.Fatal(errAgentBuild)
	}
	g := cp.StartGPUNode(t, harness.GPUNodeOptions{Bin: agentBin, Args: []string{"--report-node-capacity", "--device-memory-scaling", "1.5"},
		Namespace: harness.UniqueName("cap"), Role: capacityRole})
	var mem, cores int64
	for _, d := range g.GPUs {
		if d.Health {
			mem += int64(d.Devmem)
			cores += int64(d.Devcore)
		}
	}
	if mem <= harness.SimulatedGPUs*40*1024 || cores != harness.SimulatedGPUs*100 {
		t.Fatalf("annotation: %d MiB and %d cores over %d GPUs, want memory scaled by 1.5 and 100 cores each", mem, cores, len(g.GPUs))
	}
	carries := func(n *corev1.Node) bool {
		for _, list := range []corev1.ResourceList{n.Status.Capacity, n.Status.Allocatable} {
			m, c := list["nvidia.com/gpumem"], list["nvidia.com/gpucores"]
			if m.CmpInt64(mem) != 0 || c.CmpInt64(cores) != 0 {
				return false
			}
		}
		return true
	}
	harness.Eventually(t, "the Node's status to carry gpumem and gpucores", time.Minute, func() bool { return carries(cp.GetNode(t, g.Name)) })

	g.MakeReady(t) // the kubelet's own status write (device count, pods, Ready) keeps them
	if n := cp.GetNode(t, g.Name); !carries(n) {
		t.Fatalf("after the kubelet's status write: capacity %v allocatable %v", n.Status.Capacity, n.Status.Allocatable)
	}

	if errExtenderBuild != nil {
		t.Fatal(errExtenderBuild)
	}
	url := cp.StartExtender(t, extenderBin, cp.LabelNodes(t, g))
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
	onNode := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{g.Name}}}}},
	}}}
	pods := map[string]corev1.ResourceList{
		// asks none of them: kube-scheduler alone (the extender is not interested)
		"plain": {corev1.ResourceCPU: resource.MustParse("100m")},
		// asks them: the extender fits it; kube-scheduler does not count them
		"gpu": {resourceName: resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse("4000"), "nvidia.com/gpucores": resource.MustParse("30")},
	}
	for name, limits := range pods {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: g.Namespace},
			Spec: corev1.PodSpec{SchedulerName: schedulerName, Affinity: onNode, Containers: []corev1.Container{{
				Name: "main", Image: "registry.invalid/app:0", Resources: corev1.ResourceRequirements{Limits: limits},
			}}},
		}
		if _, err := cp.AdminClient().CoreV1().Pods(g.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cp.AdminClient().CoreV1().Pods(g.Namespace).Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{})
		})
	}
	for name := range pods {
		if p := cp.WaitForBound(t, g.Namespace, name); p.Spec.NodeName != g.Name {
			t.Errorf("pod %s bound to %s, want %s", name, p.Spec.NodeName, g.Name)
		}
	}
	// One write for an unchanged set of GPUs, however many scans and status writes since.
	if n := strings.Count(g.Plugin.Log(t), "Updated node capacity"); n != 1 {
		t.Errorf("the agent patched the Node's capacity %d times, want 1", n)
	}
}
