package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/envtest/proc"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nodelock"
)

const (
	// migPod asks for one GPU and migMemMiB: the first MIG profile by memory that holds it is
	// 2g.10gb (9856 MiB) on an A100-SXM4-40GB.
	migPod    = "mig-demo"
	migMemMiB = 9000
)

// migNode is the --mig step: a second node whose kubelet is a device manager of its own and
// whose device plugin is examples/deviceplugin --simulate dgxa100 --mig (the DaemonSet's
// arguments and the flag), its register annotation (GPU 0's element, with the migProfiles
// HAMi master publishes), and a pod of one GPU with migMemMiB on it: the profile and placement
// the extender reserved, the MIG device the device plugin created and patched in, and what the
// kubelet's Allocate got.
func (q *quickstart) migNode(ctx context.Context, step int) error {
	node := q.opts.node + "-mig"
	q.out.step(step, time.Since(q.start), "node %s: 8 simulated A100s in MIG mode, and a MIG pod", node)
	ds, err := find[*appsv1.DaemonSet](q, pluginName)
	if err != nil {
		return err
	}
	ctr, err := container(&ds.Spec.Template.Spec, pluginContainer)
	if err != nil {
		return err
	}
	root := filepath.Join(q.work, "kubelet-mig")
	dm, err := kubeletpeer.StartDeviceManager(ctx, kubeletpeer.DeviceManagerOptions{Dir: filepath.Join(root, "device-plugins")})
	if err != nil {
		return fmt.Errorf("start the device manager of node %s: %w", node, err)
	}
	q.onStop(func() error { q.stopped++; return dm.Stop() })

	if err := q.createReadyNode(ctx, node, ds); err != nil {
		return err
	}
	c := q.cp.AdminClient()
	kl := &kubelet{client: c, node: node, dm: dm, running: map[string]bool{}}
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); kl.run(kctx) }()
	q.onStop(func() error { cancel(); <-done; return nil })

	kubeconfig, err := q.cp.ServiceAccountKubeconfig(ctx, mkdir(q.work, "deviceplugin-mig"), namespace, pluginName, pluginName)
	if err != nil {
		return fmt.Errorf("credentials of ServiceAccount %s/%s: %w", namespace, pluginName, err)
	}
	args := pluginArgs(ctr.Args)
	args = append(args, "--mig", "--kubelet-root-dir="+root, "--simulate=dgxa100", "--prepare-state-dir=false", "--kubeconfig="+kubeconfig, fmt.Sprintf("-v=%d", q.opts.verbosity))
	env := []string{"NODE_NAME=" + node}
	for _, e := range ctr.Env {
		if e.ValueFrom == nil && e.Name != "NODE_NAME" {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	plugin, err := q.spawn(proc.Options{Name: "deviceplugin-mig", Path: filepath.Join(q.bin, "deviceplugin"), Args: args, Env: env})
	if err != nil {
		return err
	}
	q.out.item("plugin", "examples/deviceplugin %s", strings.Join(args[:len(args)-2], " "))

	var register string
	err = q.poll(ctx, func() bool {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false
		}
		devs, err := annotation.Decode(n.Annotations[annotation.KeyNVIDIARegister])
		if err != nil || len(devs) == 0 || devs[0].Mode != "mig" {
			return false
		}
		register = n.Annotations[annotation.KeyNVIDIARegister]
		// The device count too: a pod filtered while allocatable is still 0 finds the node
		// unregistered (HAMi's handshake rule), and kube-scheduler may not retry it for minutes.
		count := n.Status.Allocatable[annotation.ResourceNVIDIAGPU]
		return count.Value() > 0
	})
	if err != nil {
		return failed(fmt.Errorf("node %s has no register annotation in MIG mode or no %s in allocatable: %w", node, annotation.ResourceNVIDIAGPU, err), "deviceplugin-mig", plugin)
	}
	var elems []json.RawMessage
	if err := json.Unmarshal([]byte(register), &elems); err != nil {
		return fmt.Errorf("node %s: %s: %w", node, annotation.KeyNVIDIARegister, err)
	}
	q.out.item("register", "%s: %d GPUs in mode mig, the first:", annotation.KeyNVIDIARegister, len(elems))
	q.out.item("", "%s", elems[0])

	pods := c.CoreV1().Pods(demoNamespace)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: migPod, Namespace: demoNamespace},
		Spec: corev1.PodSpec{
			SchedulerName: schedulerName,
			NodeSelector:  map[string]string{"kubernetes.io/hostname": node},
			Containers: []corev1.Container{{Name: "cuda", Image: "nvcr.io/nvidia/cuda:12.6.3-base-ubuntu24.04", Command: []string{"nvidia-smi", "-L"},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					annotation.ResourceNVIDIAGPU: *resource.NewQuantity(1, resource.DecimalSI),
					"nvidia.com/gpumem":          *resource.NewQuantity(migMemMiB, resource.DecimalSI),
				}}}},
		},
	}
	t := time.Now()
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s/%s: %w", demoNamespace, migPod, err)
	}
	var a admission
	if err := q.poll(ctx, func() bool {
		kl.mu.Lock()
		defer kl.mu.Unlock()
		var ok bool
		a, ok = kl.admitted[created.UID]
		return ok
	}); err != nil {
		return failed(fmt.Errorf("pod %s/%s was not bound and admitted: %w%s", demoNamespace, migPod, err, q.podEvents(ctx, created)), "extender", q.extender)
	}
	if a.err != nil {
		return failed(a.err, "deviceplugin-mig", plugin)
	}
	var final *corev1.Pod
	if err := q.poll(ctx, func() bool {
		p, err := pods.Get(ctx, migPod, metav1.GetOptions{})
		if err != nil {
			return false
		}
		final = p
		return p.Annotations[allocation.KeyBindPhase] == string(allocation.PhaseSuccess)
	}); err != nil {
		return failed(fmt.Errorf("pod %s/%s has %s %q, want success: %w", demoNamespace, migPod, allocation.KeyBindPhase, final.Annotations[allocation.KeyBindPhase], err), "deviceplugin-mig", plugin)
	}
	if err := q.poll(ctx, func() bool {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && n.Annotations[nodelock.Key] == ""
	}); err != nil {
		return fmt.Errorf("the node lock is still on %s: %w", node, err)
	}
	allocs, err := mig.DecodeAllocations(final.Annotations[mig.KeyAllocations])
	if err != nil {
		return fmt.Errorf("pod %s/%s: %s: %w", demoNamespace, migPod, mig.KeyAllocations, err)
	}
	if len(allocs) != 1 || allocs[0].Runtime == nil {
		return fmt.Errorf("pod %s/%s: %s = %q, want one realised reservation", demoNamespace, migPod, mig.KeyAllocations, final.Annotations[mig.KeyAllocations])
	}
	r := allocs[0]
	q.out.item("reserved", "pod %s/%s (1 GPU, %d MiB): profile %s at placement %d+%d of %s; %s %s %v after the create", demoNamespace, migPod, migMemMiB,
		r.Profile, r.Placement.Start, r.Placement.Size, r.GPUUUID, allocation.KeyBindPhase, allocation.PhaseSuccess, round(time.Since(t)))
	q.out.item("annotations", "%s: %s", annotation.KeyNVIDIAAllocated, final.Annotations[annotation.KeyNVIDIAAllocated])
	q.out.item("", "%s: %s", mig.KeyAllocations, final.Annotations[mig.KeyAllocations])
	q.out.item("env", "the kubelet's Allocate: NVIDIA_VISIBLE_DEVICES=%s (the MIG device the plugin created: GPU instance %d, compute instance %d; no HAMi-core limits)",
		a.allocs["cuda"].Envs["NVIDIA_VISIBLE_DEVICES"], r.Runtime.GPUInstanceID, r.Runtime.ComputeInstanceID)
	return nil
}
