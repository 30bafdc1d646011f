package main

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/envtest/proc"
	"github.com/hamireg/hamireg/internal/manifests"
)

const (
	// mappingManifest is the SDK's DeviceClass with extendedResourceName nvidia.com/gpu.
	mappingManifest = "examples/deviceplugin/deploy/mapping/deviceclass.yaml"
	// mappingApp labels the two pods of the same spec.
	mappingApp = "gpu-anywhere"
)

// mappingNode is the second half of the DRA step: a node <node>-dra whose device plugin runs
// with --dra and no --dra-gpus (every GPU DRA's, so the kubelet counts none of
// nvidia.com/gpu), the DeviceClass of deploy/mapping (extendedResourceName nvidia.com/gpu),
// and two pods of one spec, nvidia.com/gpu: 1 with a required anti-affinity on the host name:
// the first runs on the device-plugin node through HAMi's annotations and Allocate, the
// second on the DRA node through the claim kube-scheduler writes from the class, prepared by
// the DRA manager with the whole GPU. Then the pods go and the class is applied again without
// the mapping: with it, kube-scheduler refuses a pod asking nvidia.com/gpumem on every node
// whose allocatable does not list that name (the later steps' pods), unless the device plugin
// runs with --report-node-capacity.
func (q *quickstart) mappingNode(ctx, draCtx context.Context) error {
	c := q.cp.AdminClient()
	node := q.opts.node + "-dra"
	profile := dra.SDKProfile()
	ds, err := find[*appsv1.DaemonSet](q, pluginName)
	if err != nil {
		return err
	}
	ctr, err := container(&ds.Spec.Template.Spec, pluginContainer)
	if err != nil {
		return err
	}
	t := time.Now()
	root := filepath.Join(q.work, "kubelet-dra-node")
	dm, err := kubeletpeer.StartDeviceManager(ctx, kubeletpeer.DeviceManagerOptions{Dir: filepath.Join(root, "device-plugins")})
	if err != nil {
		return fmt.Errorf("start the device manager of node %s: %w", node, err)
	}
	q.onStop(func() error { q.stopped++; return dm.Stop() })
	if err := q.createReadyNode(ctx, node, ds); err != nil {
		return err
	}
	m, err := kubeletpeer.StartDRAManager(draCtx, kubeletpeer.DRAManagerOptions{
		Client: c, NodeName: node, StateDir: filepath.Join(root, "dra"), RegistryDir: filepath.Join(root, "plugins_registry"),
	})
	if err != nil {
		return fmt.Errorf("start the DRA manager of node %s: %w", node, err)
	}
	q.onStop(m.Stop)
	if err := m.WaitForWipe(ctx); err != nil {
		return err
	}
	kl := &kubelet{client: c, node: node, dm: dm, running: map[string]bool{}, dra: m}
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); kl.run(kctx) }()
	q.onStop(func() error { cancel(); <-done; return nil })

	kubeconfig, err := q.cp.ServiceAccountKubeconfig(ctx, mkdir(q.work, "deviceplugin-dra-node"), namespace, pluginName, pluginName)
	if err != nil {
		return fmt.Errorf("credentials of ServiceAccount %s/%s: %w", namespace, pluginName, err)
	}
	cdiDir := mkdir(q.work, "cdi-dra-node")
	draArgs := []string{"--dra", "--dra-profile=" + profile.Name}
	args := append(pluginArgs(ctr.Args), draArgs...)
	args = append(args, "--cdi-dir="+cdiDir, "--dra-slice-sync-delay=1s", "--kubelet-root-dir="+root, "--simulate=dgxa100", "--simulate-uuid-seed="+node, "--hook-path="+mkdir(q.work, "hook-dra-node"),
		"--prepare-state-dir=false", "--kubeconfig="+kubeconfig, fmt.Sprintf("-v=%d", q.opts.verbosity))
	env := []string{"NODE_NAME=" + node}
	for _, e := range ctr.Env {
		if e.ValueFrom == nil && e.Name != "NODE_NAME" {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	plugin, err := q.spawn(proc.Options{Name: "deviceplugin-dra-node", Path: filepath.Join(q.bin, "deviceplugin"), Args: args, Env: env})
	if err != nil {
		return err
	}
	wctx, wcancel := context.WithTimeout(ctx, q.opts.timeout)
	defer wcancel()
	if err := m.WaitForDriver(wctx, profile.Driver); err != nil {
		return failed(err, "deviceplugin-dra-node", plugin)
	}
	var count *resource.Quantity
	err = q.poll(ctx, func() bool {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false
		}
		if v, ok := n.Status.Allocatable[annotation.ResourceNVIDIAGPU]; ok {
			count = &v
		}
		return count != nil && count.IsZero() && annotation.Check(annotation.NVIDIA(), n.Annotations).Devices != nil
	})
	if err != nil {
		return failed(fmt.Errorf("node %s: no register annotation, or status.allocatable[%s] is not 0 (%v): %w", node, annotation.ResourceNVIDIAGPU, count, err), "deviceplugin-dra-node", plugin)
	}
	q.out.item("DRA node", "%s: examples/deviceplugin %s (no --dra-gpus: every GPU DRA's); status.allocatable[%s] = 0, %v after its start",
		node, strings.Join(draArgs, " "), annotation.ResourceNVIDIAGPU, round(time.Since(t)))

	class, restore, err := q.applyMapping(ctx)
	if err != nil {
		return err
	}
	q.out.item("mapping", "DeviceClass %s with extendedResourceName %s (%s): kube-scheduler serves it through DRA on nodes whose allocatable has none (%s), through the device plugin on the others (%s)",
		class.Name, *class.Spec.ExtendedResourceName, mappingManifest, node, q.opts.node)

	var pods []*corev1.Pod
	for i, k := range []*kubelet{q.kubelet, kl} {
		p, err := q.createMappingPod(ctx, i, []string{q.opts.node, node})
		if err != nil {
			return err
		}
		pods = append(pods, p)
		if err := q.showMappingPod(ctx, k, p, cdiDir); err != nil {
			return err
		}
	}
	for _, p := range pods {
		if err := c.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
			return fmt.Errorf("delete pod %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	if err := restore(); err != nil {
		return err
	}
	q.out.item("", "pods deleted; DeviceClass %s applied again without the mapping: with it, a pod asking nvidia.com/gpumem is refused on every node whose allocatable does not list nvidia.com/gpumem (run the device plugin with --report-node-capacity to keep shares with the mapping)", class.Name)
	return nil
}

// applyMapping applies deploy/mapping's DeviceClass over the one of dra.yaml, and returns a
// function that applies it again without the mapping.
func (q *quickstart) applyMapping(ctx context.Context) (*resourcev1.DeviceClass, func() error, error) {
	objs, err := manifests.Read(filepath.Join(q.opts.repo, mappingManifest))
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", mappingManifest, err)
	}
	var want *resourcev1.DeviceClass
	for _, o := range objs {
		if c, ok := o.(*resourcev1.DeviceClass); ok {
			want = c
		}
	}
	if want == nil || want.Spec.ExtendedResourceName == nil {
		return nil, nil, fmt.Errorf("%s: no DeviceClass with extendedResourceName", mappingManifest)
	}
	classes := q.cp.AdminClient().ResourceV1().DeviceClasses()
	set := func(name *string) (*resourcev1.DeviceClass, error) {
		var out *resourcev1.DeviceClass
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			c, err := classes.Get(ctx, want.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			c.Spec.ExtendedResourceName = name
			out, err = classes.Update(ctx, c, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("update DeviceClass %s: %w", want.Name, err)
		}
		return out, nil
	}
	class, err := set(want.Spec.ExtendedResourceName)
	if err != nil {
		return nil, nil, err
	}
	return class, func() error { _, err := set(nil); return err }, nil
}

// createMappingPod creates pod i of the one spec: nvidia.com/gpu: 1 on one of nodes, never
// beside another pod of the spec.
func (q *quickstart) createMappingPod(ctx context.Context, i int, nodes []string) (*corev1.Pod, error) {
	labels := map[string]string{"app": mappingApp}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", mappingApp, i), Namespace: demoNamespace, Labels: labels},
		Spec: corev1.PodSpec{
			SchedulerName: schedulerName,
			Affinity: &corev1.Affinity{
				NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: nodes}},
				}}}},
				PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
					LabelSelector: &metav1.LabelSelector{MatchLabels: labels}, TopologyKey: corev1.LabelHostname,
				}}},
			},
			Containers: []corev1.Container{{Name: "cuda", Image: "nvcr.io/nvidia/cuda:12.6.3-base-ubuntu24.04", Command: []string{"nvidia-smi", "-L"},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{annotation.ResourceNVIDIAGPU: *resource.NewQuantity(1, resource.DecimalSI)}}}},
		},
	}
	if i == 0 {
		q.out.item("pods", "%s-0 and %s-1, one spec: limits %s: 1, a required anti-affinity on %s, on %s", mappingApp, mappingApp,
			annotation.ResourceNVIDIAGPU, corev1.LabelHostname, strings.Join(nodes, " or "))
	}
	created, err := q.cp.AdminClient().CoreV1().Pods(demoNamespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create pod %s/%s: %w", demoNamespace, pod.Name, err)
	}
	return created, nil
}

// showMappingPod waits until the kubelet k admitted p and shows how: HAMi's annotations and
// the Allocate's env, or the claim and its CDI edits.
func (q *quickstart) showMappingPod(ctx context.Context, k *kubelet, p *corev1.Pod, cdiDir string) error {
	t := time.Now()
	a, err := q.waitForAdmissionOn(ctx, k, p.UID)
	if err != nil {
		return fmt.Errorf("pod %s/%s was not bound and admitted on %s: %w%s", p.Namespace, p.Name, k.node, err, q.podEvents(ctx, p))
	}
	if a.err != nil {
		return a.err
	}
	bound := a.pod
	if st := bound.Status.ExtendedResourceClaimStatus; st != nil {
		claim, err := q.cp.AdminClient().ResourceV1().ResourceClaims(bound.Namespace).Get(ctx, st.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get the claim of pod %s/%s: %w", bound.Namespace, bound.Name, err)
		}
		if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
			return fmt.Errorf("ResourceClaim %s/%s has no allocation of one device: %+v", claim.Namespace, claim.Name, claim.Status.Allocation)
		}
		r := claim.Status.Allocation.Devices.Results[0]
		q.out.item(bound.Name, "on %s through DRA, admitted %v after the create: kube-scheduler wrote ResourceClaim %s (owner: the pod) for %s, allocated %s/%s, consumed %s; no HAMi annotation",
			bound.Spec.NodeName, round(time.Since(t)), claim.Name, annotation.ResourceNVIDIAGPU, r.Driver, r.Device, capacityString(r.ConsumedCapacity))
		spec, _, err := readCDISpec(cdiDir, a.cdi["cuda"])
		if err != nil {
			return err
		}
		var env []string
		for _, e := range spec.ContainerEdits.Env {
			if strings.HasPrefix(e, "CUDA_DEVICE_") || strings.HasPrefix(e, "NVIDIA_VISIBLE_DEVICES=") {
				env = append(env, e)
			}
		}
		q.out.item("", "the DRA manager's CDI edits for container cuda (the whole GPU): %s", strings.Join(env, " "))
		return nil
	}
	alloc, ok := a.allocs["cuda"]
	if !ok {
		return fmt.Errorf("pod %s/%s on %s: no Allocate for container cuda", bound.Namespace, bound.Name, bound.Spec.NodeName)
	}
	var env []string
	for _, k := range slices.Sorted(maps.Keys(alloc.Envs)) {
		if strings.HasPrefix(k, "CUDA_DEVICE_") || k == "NVIDIA_VISIBLE_DEVICES" {
			env = append(env, k+"="+alloc.Envs[k])
		}
	}
	q.out.item(bound.Name, "on %s through the device plugin, admitted %v after the create: %s=%s",
		bound.Spec.NodeName, round(time.Since(t)), annotation.KeyNVIDIAToAllocate, bound.Annotations[annotation.KeyNVIDIAToAllocate])
	q.out.item("", "the device manager's Allocate for container cuda: %s (%s %q)", strings.Join(env, " "), allocation.KeyBindPhase, bound.Annotations[allocation.KeyBindPhase])
	return nil
}
