package dramap_test

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// wait bounds every wait of this package: scheduling through the extender, claim allocation.
const wait = 60 * time.Second

// ensureMappingClass creates the SDK profile's DeviceClass with extendedResourceName
// nvidia.com/gpu (deploy/mapping/deviceclass.yaml) unless it exists; it stays for the
// binary's later tests.
func ensureMappingClass(t *testing.T) *resourcev1.DeviceClass {
	t.Helper()
	want, err := dra.DeviceClassWith(dra.SDKProfile(), dra.DeviceClassOptions{ExtendedResourceName: harness.GPUResource})
	if err != nil {
		t.Fatal(err)
	}
	classes := cp.AdminClient().ResourceV1().DeviceClasses()
	c, err := classes.Create(t.Context(), want, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		c, err = classes.Get(t.Context(), want.Name, metav1.GetOptions{})
	}
	if err != nil {
		t.Fatalf("create DeviceClass %s: %v", want.Name, err)
	}
	return c
}

// gpuPodSpec is the pod spec of both worlds: one container asking limits, on the test's
// nodes, scheduled by the hami-scheduler profile.
func gpuPodSpec(group string, limits corev1.ResourceList) corev1.PodSpec {
	return corev1.PodSpec{
		SchedulerName:                 extender.DefaultSchedulerName,
		NodeSelector:                  map[string]string{groupLabel: group},
		TerminationGracePeriodSeconds: new(int64(0)),
		Containers: []corev1.Container{{Name: "cuda", Image: "registry.invalid/cuda:0",
			Resources: corev1.ResourceRequirements{Limits: limits}}},
	}
}

// TestDeploymentOnBothWorlds: a Deployment of 2 replicas asking nvidia.com/gpu: 1 with a
// required anti-affinity on the host name runs one replica on the device-plugin node (HAMi's
// annotations, Allocate through the device manager) and one on the DRA node (a claim that
// kube-scheduler writes from the DeviceClass's extendedResourceName, prepared through the DRA
// manager with the whole GPU).
func TestDeploymentOnBothWorlds(t *testing.T) {
	class := ensureMappingClass(t)
	group := harness.UniqueName("both")
	dp := startNode(t, nodeOptions{group: group})
	drn := startNode(t, nodeOptions{group: group, dra: true})
	if got := dp.agent.MappingMode(); got != nodeagent.MappingNone {
		t.Errorf("device-plugin node's mapping mode %q, want %q", got, nodeagent.MappingNone)
	}
	if got := drn.agent.MappingMode(); got != nodeagent.MappingDRA {
		t.Errorf("DRA node's mapping mode %q, want %q", got, nodeagent.MappingDRA)
	}
	for _, n := range []*node{dp, drn} {
		node := cp.GetNode(t, n.name)
		want := n.dra != nil
		if got := dra.ServedThroughDRA(harness.GPUResource, node.Status.Allocatable, []*resourcev1.DeviceClass{class}); got != want {
			t.Errorf("node %s (allocatable %s=%v) served through DRA: %t, want %t", n.name, harness.GPUResource,
				node.Status.Allocatable[harness.GPUResource], got, want)
		}
	}
	startScheduler(t)
	runControllers(t)
	ns := namespace(t)

	labels := map[string]string{"app": "cuda"}
	spec := gpuPodSpec(group, corev1.ResourceList{harness.GPUResource: resource.MustParse("1")})
	spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
		LabelSelector: &metav1.LabelSelector{MatchLabels: labels}, TopologyKey: corev1.LabelHostname,
	}}}}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cuda"},
		Spec: appsv1.DeploymentSpec{
			Replicas: new(int32(2)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec},
		},
	}
	deployments := cp.AdminClient().AppsV1().Deployments(ns)
	if _, err := deployments.Create(t.Context(), dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := cp.AdminClient().CoreV1().Pods(ns)
	var bound []corev1.Pod
	t.Cleanup(func() {
		// The controllers stop first (their cleanup ran already): nothing recreates the pods.
		_ = deployments.Delete(context.WithoutCancel(t.Context()), dep.Name, metav1.DeleteOptions{})
		list, err := pods.List(context.WithoutCancel(t.Context()), metav1.ListOptions{})
		if err == nil {
			for i := range list.Items {
				release(t, &list.Items[i])
			}
		}
	})
	harness.Eventually(t, "both replicas of the Deployment bound", wait, func() bool {
		list, err := pods.List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		bound = bound[:0]
		for _, p := range list.Items {
			if p.Spec.NodeName != "" {
				bound = append(bound, p)
			}
		}
		return len(bound) == 2
	})
	byNode := map[string]*corev1.Pod{}
	for i := range bound {
		byNode[bound[i].Spec.NodeName] = &bound[i]
	}
	dpPod, draPod := byNode[dp.name], byNode[drn.name]
	if dpPod == nil || draPod == nil {
		t.Fatalf("replicas bound to %v, want one on %s and one on %s", slices.Sorted(maps.Keys(byNode)), dp.name, drn.name)
	}
	if !equalSpecs(dpPod, draPod) {
		t.Errorf("the replicas' container resources differ: %v and %v", dpPod.Spec.Containers[0].Resources, draPod.Spec.Containers[0].Resources)
	}

	t.Run("device-plugin node: HAMi's annotations and Allocate", func(t *testing.T) {
		uuids := map[string]bool{}
		for _, d := range dp.registered(t) {
			uuids[d.ID] = true
		}
		devs, err := allocation.DecodePodDevices(dpPod.Annotations[annotation.NVIDIA().ToAllocateKey], allocation.VersionMaster)
		if err != nil || len(devs) != 1 || len(devs[0]) != 1 || !uuids[devs[0][0].UUID] {
			t.Fatalf("pod %s: %s = %q (%v), want one GPU of %s", dpPod.Name, annotation.NVIDIA().ToAllocateKey,
				dpPod.Annotations[annotation.NVIDIA().ToAllocateKey], err, dp.name)
		}
		if dpPod.Annotations[allocation.KeyNode] != dp.name || dpPod.Status.ExtendedResourceClaimStatus != nil {
			t.Errorf("pod %s: %s=%q, extendedResourceClaimStatus %v; want %s and none", dpPod.Name, allocation.KeyNode,
				dpPod.Annotations[allocation.KeyNode], dpPod.Status.ExtendedResourceClaimStatus, dp.name)
		}
		a, err := dp.dm.Allocate(harness.Context(t), dpPod, "cuda")
		if err != nil {
			t.Fatalf("admit pod %s: %v", dpPod.Name, err)
		}
		if got := a.Envs["NVIDIA_VISIBLE_DEVICES"]; got != devs[0][0].UUID {
			t.Errorf("Allocate gave NVIDIA_VISIBLE_DEVICES=%q, want %s", got, devs[0][0].UUID)
		}
	})

	t.Run("DRA node: the scheduler's claim, prepared whole", func(t *testing.T) {
		for _, k := range []string{annotation.NVIDIA().ToAllocateKey, allocation.KeyNode, allocation.KeyBindPhase} {
			if v, ok := draPod.Annotations[k]; ok {
				t.Errorf("pod %s on the DRA node carries HAMi's %s=%q", draPod.Name, k, v)
			}
		}
		if v := cp.GetNode(t, drn.name).Annotations["hami.io/mutex.lock"]; v != "" {
			t.Errorf("DRA node locked: %q", v)
		}
		st := draPod.Status.ExtendedResourceClaimStatus
		if st == nil || len(st.RequestMappings) != 1 || st.RequestMappings[0].ResourceName != harness.GPUResource || st.RequestMappings[0].ContainerName != "cuda" {
			t.Fatalf("pod %s: extendedResourceClaimStatus %+v, want one mapping of %s for container cuda", draPod.Name, st, harness.GPUResource)
		}
		claim := cp.WaitForAllocation(t, ns, st.ResourceClaimName)
		if claim.Annotations[resourcev1.ExtendedResourceClaimAnnotation] != "true" ||
			!slices.ContainsFunc(claim.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == draPod.UID && o.Kind == "Pod" }) {
			t.Errorf("claim %s: annotations %v, owners %+v; want kube-scheduler's extended-resource claim owned by pod %s", claim.Name,
				claim.Annotations, claim.OwnerReferences, draPod.Name)
		}
		results := claim.Status.Allocation.Devices.Results
		if len(results) != 1 || results[0].Driver != dra.SDKDriver || results[0].Pool != drn.name {
			t.Fatalf("allocation results %+v, want one device of %s on %s", results, dra.SDKDriver, drn.name)
		}
		index, ok := dra.SDKProfile().IndexOf(results[0].Device)
		var gpu annotation.Device
		for _, d := range drn.registered(t) {
			if ok && d.Index == index {
				gpu = d
			}
		}
		if gpu.ID == "" {
			t.Fatalf("allocated device %s is not a GPU of %s", results[0].Device, drn.name)
		}
		ctx, cancel := context.WithTimeout(harness.Context(t), wait)
		defer cancel()
		if err := drn.dra.Prepare(ctx, draPod); err != nil {
			t.Fatalf("prepare pod %s: %v", draPod.Name, err)
		}
		ids, err := drn.dra.GetResources(draPod, "cuda")
		if err != nil || len(ids) != 1 || !strings.HasPrefix(ids[0], "k8s.hamireg.io/claim="+string(claim.UID)+"-") {
			t.Fatalf("CDI IDs %q (%v), want one k8s.hamireg.io/claim=%s-<device>", ids, err, claim.UID)
		}
		env := harness.ResolveCDI(t, drn.cdiDir, ids[0]).EnvMap()
		for k, want := range map[string]string{
			"NVIDIA_VISIBLE_DEVICES":     gpu.ID,
			"CUDA_DEVICE_MEMORY_LIMIT_0": strconv.Itoa(int(gpu.Devmem)) + "m", // the whole GPU's memory
		} {
			if env[k] != want {
				t.Errorf("CDI env %s = %q, want %q (env %v)", k, env[k], want, env)
			}
		}
		if err := drn.dra.Unprepare(ctx, draPod); err != nil {
			t.Errorf("unprepare pod %s: %v", draPod.Name, err)
		}
	})
}

// equalSpecs reports whether two replicas ask the same resources.
func equalSpecs(a, b *corev1.Pod) bool {
	ra, rb := a.Spec.Containers[0].Resources, b.Spec.Containers[0].Resources
	return len(ra.Limits) == len(rb.Limits) && ra.Limits[harness.GPUResource].Equal(rb.Limits[harness.GPUResource])
}

// TestShareNotOnDRANode: a pod asking a share (nvidia.com/gpumem) is never placed on a DRA
// node. Without the share's name in the node's allocatable, kube-scheduler's DynamicResources
// plugin refuses the node itself; once the node lists it (the agent's --report-node-capacity
// writes 0 there), the extender refuses it with its reason and the fix. A whole-GPU pod with
// nvidia.com/gpucores 100 (what HAMi's webhook adds without a mapping) is refused alike until
// the node lists gpucores, and then runs through DRA.
func TestShareNotOnDRANode(t *testing.T) {
	ensureMappingClass(t)
	group := harness.UniqueName("share")
	drn := startNode(t, nodeOptions{group: group, dra: true})
	startScheduler(t)
	ns := namespace(t)
	pods := cp.AdminClient().CoreV1().Pods(ns)
	create := func(name string, limits corev1.ResourceList) {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: gpuPodSpec(group, limits)}
		if _, err := pods.Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if p, err := pods.Get(context.WithoutCancel(t.Context()), name, metav1.GetOptions{}); err == nil {
				release(t, p)
			}
		})
	}
	create("share", corev1.ResourceList{harness.GPUResource: resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse("3000")})
	create("cores100", corev1.ResourceList{harness.GPUResource: resource.MustParse("1"), "nvidia.com/gpucores": resource.MustParse("100")})
	for _, name := range []string{"share", "cores100"} {
		msg := cp.WaitForUnschedulable(t, ns, name)
		if !strings.Contains(msg, "cannot fit resource") {
			t.Errorf("pod %s: unschedulable with %q, want the DynamicResources plugin's \"cannot fit resource\"", name, msg)
		}
		t.Logf("pod %s before the node lists the shares: %s", name, msg)
	}

	// What the agent's NodeCapacity writes on a node whose GPUs are all DRA's.
	patch := []byte(`{"status":{"capacity":{"nvidia.com/gpumem":"0","nvidia.com/gpucores":"0"},"allocatable":{"nvidia.com/gpumem":"0","nvidia.com/gpucores":"0"}}}`)
	if _, err := cp.AdminClient().CoreV1().Nodes().Patch(t.Context(), drn.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	share := cp.WaitForPod(t, ns, "share", "refused by the extender", func(p *corev1.Pod) bool {
		return strings.Contains(unschedulableMessage(p), extender.ReasonDRANode)
	})
	msg := unschedulableMessage(share)
	for _, want := range []string{"nvidia.com/gpumem", "write a ResourceClaim"} {
		if !strings.Contains(msg, want) {
			t.Errorf("pod share: unschedulable with %q, want it to name %q", msg, want)
		}
	}
	if share.Spec.NodeName != "" || share.Annotations[allocation.KeyNode] != "" {
		t.Errorf("pod share placed: node %q, %s %q", share.Spec.NodeName, allocation.KeyNode, share.Annotations[allocation.KeyNode])
	}
	t.Logf("pod share once the node lists the shares: %s", msg)
	cores := cp.WaitForBound(t, ns, "cores100")
	if cores.Spec.NodeName != drn.name || cores.Status.ExtendedResourceClaimStatus == nil {
		t.Errorf("pod cores100 on %q with extendedResourceClaimStatus %v, want %s through DRA", cores.Spec.NodeName, cores.Status.ExtendedResourceClaimStatus, drn.name)
	}
}

func unschedulableMessage(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return c.Message
		}
	}
	return ""
}

// TestShareOnDevicePluginNode: with the mapping on, kube-scheduler's DynamicResources plugin
// also judges a share on a device-plugin node: a pod asking nvidia.com/gpumem is refused
// there while the node's allocatable does not list gpumem, and placed HAMi's way once it does
// (what the agent's --report-node-capacity writes, here the agent itself).
func TestShareOnDevicePluginNode(t *testing.T) {
	ensureMappingClass(t)
	group := harness.UniqueName("dpshare")
	plain := startNode(t, nodeOptions{group: group + "-plain"})
	withCapacity := startNode(t, nodeOptions{group: group, nodeCapacity: true})
	startScheduler(t)
	ns := namespace(t)
	pods := cp.AdminClient().CoreV1().Pods(ns)
	limits := corev1.ResourceList{harness.GPUResource: resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse("3000")}
	for _, n := range []struct {
		pod, group string
	}{{"plain", group + "-plain"}, {"capacity", group}} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: n.pod}, Spec: gpuPodSpec(n.group, limits)}
		if _, err := pods.Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = pods.Delete(context.WithoutCancel(t.Context()), p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
		})
	}
	msg := cp.WaitForUnschedulable(t, ns, "plain")
	if !strings.Contains(msg, "cannot fit resource") {
		t.Errorf("pod plain on %s (no gpumem in its allocatable): unschedulable with %q, want the DynamicResources plugin's \"cannot fit resource\"", plain.name, msg)
	}
	t.Logf("share on a device-plugin node without --report-node-capacity: %s", msg)
	bound := cp.WaitForBound(t, ns, "capacity")
	if bound.Spec.NodeName != withCapacity.name || bound.Annotations[allocation.KeyNode] != withCapacity.name || bound.Status.ExtendedResourceClaimStatus != nil {
		t.Errorf("pod capacity on %q, %s %q, extendedResourceClaimStatus %v; want %s HAMi's way", bound.Spec.NodeName, allocation.KeyNode,
			bound.Annotations[allocation.KeyNode], bound.Status.ExtendedResourceClaimStatus, withCapacity.name)
	}
}
