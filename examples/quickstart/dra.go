package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
)

// The DRA step's claim: one GPU with 10 GiB and 30 % cores, as step 2's pod asks per GPU.
const (
	draPod      = "dra-demo"
	draClaim    = "dra-demo-gpu"
	draRequest  = "gpu"
	draMemory   = "10Gi"
	draCores    = 30
	draCDIClass = draplugin.CDIVendor + "/" + draplugin.CDIClass
)

// draStep is the DRA step on the first node: the kubelet's DRA manager starts beside its
// device manager, the device plugin restarts with --dra owning one GPU that no pod holds (the
// others stay with the device plugin), and a pod with a ResourceClaim of 10Gi and 30 cores is
// placed by kube-scheduler's DynamicResources plugin (the extender is not asked: the pod
// requests none of its resources), prepared by the plugin, and its CDI edits shown beside the
// env step 2's device-plugin pod got.
func (q *quickstart) draStep(ctx context.Context, step int) error {
	c := q.cp.AdminClient()
	profile := dra.SDKProfile()
	node, err := c.CoreV1().Nodes().Get(ctx, q.opts.node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get node %s: %w", q.opts.node, err)
	}
	gpu, err := q.idleGPU(ctx, annotation.Check(annotation.NVIDIA(), node.Annotations).Devices)
	if err != nil {
		return err
	}
	q.out.step(step, time.Since(q.start), "DRA on node %s: GPU %d to claims, the other %d stay with the device plugin", q.opts.node, gpu.Index, simulatedGPUs-1)

	t := time.Now()
	root := filepath.Dir(q.dm.Dir())
	// The kubelet's plugin manager logs through klog's global logger, which main points at
	// q.klogOut: to a file of the work folder, like the programs' logs, not into the steps.
	logFile, err := os.Create(filepath.Join(q.work, "kubelet-dra.log"))
	if err != nil {
		return err
	}
	q.onStop(func() error { q.klogOut.set(nil); return logFile.Close() })
	q.klogOut.set(logFile)
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(q.opts.verbosity), textlogger.Output(logFile)))
	m, err := kubeletpeer.StartDRAManager(klog.NewContext(ctx, logger), kubeletpeer.DRAManagerOptions{
		Client: c, NodeName: q.opts.node, StateDir: filepath.Join(root, "dra"), RegistryDir: filepath.Join(root, "plugins_registry"),
	})
	if err != nil {
		return fmt.Errorf("start the kubelet's DRA manager: %w", err)
	}
	q.onStop(m.Stop)
	if err := m.WaitForWipe(ctx); err != nil {
		return err
	}
	q.kubelet.mu.Lock()
	q.kubelet.dra = m
	q.kubelet.mu.Unlock()
	q.out.item("kubelet", "DRA manager (k8s.io/kubernetes pkg/kubelet/cm/dra) watching %s, started in %v", m.RegistryDir(), round(time.Since(t)))

	t = time.Now()
	cdiDir := mkdir(q.work, "cdi")
	if err := q.startPlugin(ctx, "--dra", "--dra-profile="+profile.Name, "--dra-gpus="+strconv.FormatUint(uint64(gpu.Index), 10),
		"--cdi-dir="+cdiDir, "--dra-slice-sync-delay=1s"); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, q.opts.timeout)
	defer cancel()
	if err := m.WaitForDriver(wctx, profile.Driver); err != nil {
		return failed(err, "deviceplugin", q.plugin)
	}
	slice, err := q.waitForSlice(ctx, profile.Driver)
	if err != nil {
		return failed(err, "deviceplugin", q.plugin)
	}
	q.out.item("slice", "ResourceSlice %s of driver %s, %v after the restart: %s", slice.Name, profile.Driver, round(time.Since(t)), sliceSummary(slice, profile))
	var cordon string
	var count int64
	want := int64(simulatedGPUs-1) * int64(gpu.Count)
	err = q.poll(ctx, func() bool {
		n, err := c.CoreV1().Nodes().Get(ctx, q.opts.node, metav1.GetOptions{})
		if err != nil {
			return false
		}
		allocatable := n.Status.Allocatable[annotation.ResourceNVIDIAGPU]
		cordon, count = n.Annotations[allocation.KeyDeviceCordon], allocatable.Value()
		return cordon == gpu.ID && count == want
	})
	if err != nil {
		return failed(fmt.Errorf("node %s: %s is %q, want %s, and status.allocatable[%s] is %d, want %d: %w",
			q.opts.node, allocation.KeyDeviceCordon, cordon, gpu.ID, annotation.ResourceNVIDIAGPU, count, want, err), "deviceplugin", q.plugin)
	}
	q.out.item("extender", "%s: %s (HAMi's extender gives it no pod); status.allocatable[%s] = %d", allocation.KeyDeviceCordon, cordon, annotation.ResourceNVIDIAGPU, (simulatedGPUs-1)*int(gpu.Count))

	t = time.Now()
	pod, claim, err := q.createClaimPod(ctx, profile)
	if err != nil {
		return err
	}
	a, err := q.waitForAdmission(ctx, pod.UID)
	if err != nil {
		return fmt.Errorf("pod %s/%s was not bound and prepared: %w%s", demoNamespace, draPod, err, q.podEvents(ctx, pod))
	}
	if a.err != nil {
		return failed(a.err, "deviceplugin", q.plugin)
	}
	claim, err = c.ResourceV1().ResourceClaims(demoNamespace).Get(ctx, claim.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get ResourceClaim %s/%s: %w", demoNamespace, draClaim, err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		return fmt.Errorf("ResourceClaim %s/%s has no allocation of one device: %+v", demoNamespace, draClaim, claim.Status.Allocation)
	}
	r := claim.Status.Allocation.Devices.Results[0]
	shareID := ""
	if r.ShareID != nil {
		shareID = string(*r.ShareID)
	}
	q.out.item("scheduled", "kube-scheduler's DynamicResources plugin allocated %s/%s of pool %s (shareID %s), consumed %s; pod bound to %s, prepared %v after the create",
		r.Driver, r.Device, r.Pool, shareID, capacityString(r.ConsumedCapacity), a.pod.Spec.NodeName, round(time.Since(t)))
	ids := a.cdi["cuda"]
	q.out.item("CDI", "what the kubelet hands the container runtime for container cuda: %s", strings.Join(ids, ", "))
	spec, path, err := readCDISpec(cdiDir, ids)
	if err != nil {
		return failed(err, "deviceplugin", q.plugin)
	}
	q.out.item("", "its edits, from %s:", filepath.Base(path))
	for _, e := range spec.ContainerEdits.Env {
		q.out.item("", "%s", e)
	}
	for _, mnt := range spec.ContainerEdits.Mounts {
		q.out.item("", "mount %s ← host %s", mnt.ContainerPath, mnt.HostPath)
	}
	if q.demoEnv != nil {
		var env []string
		for _, k := range slices.Sorted(maps.Keys(q.demoEnv)) {
			if strings.HasPrefix(k, "CUDA_DEVICE_") || k == "NVIDIA_VISIBLE_DEVICES" {
				env = append(env, k+"="+q.demoEnv[k])
			}
		}
		q.out.item("beside", "step 2's pod %s/%s on the same node, through the device plugin's Allocate: %s", demoNamespace, demoPod, strings.Join(env, " "))
	}
	return q.mappingNode(ctx, klog.NewContext(ctx, logger))
}

// idleGPU is the GPU of highest index among devices that no pod bound to the node holds
// (hami.io/vgpu-devices-allocated names it).
func (q *quickstart) idleGPU(ctx context.Context, devices []annotation.Device) (annotation.Device, error) {
	pods, err := q.cp.AdminClient().CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", q.opts.node).String()})
	if err != nil {
		return annotation.Device{}, fmt.Errorf("list the pods of node %s: %w", q.opts.node, err)
	}
	held := map[string]bool{}
	for _, p := range pods.Items {
		pd, err := allocation.DecodePodDevices(p.Annotations[annotation.KeyNVIDIAAllocated], allocation.VersionMaster)
		if err != nil {
			continue // not a GPU pod
		}
		for _, ctr := range pd {
			for _, d := range ctr {
				held[d.UUID] = true
			}
		}
	}
	for _, d := range slices.Backward(devices) {
		if !held[d.ID] {
			return d, nil
		}
	}
	return annotation.Device{}, fmt.Errorf("node %s: every GPU holds a pod; none is left for DRA", q.opts.node)
}

// waitForSlice waits until the node's ResourceSlice of driver lists every GPU.
func (q *quickstart) waitForSlice(ctx context.Context, driver string) (*resourcev1.ResourceSlice, error) {
	var found *resourcev1.ResourceSlice
	err := q.poll(ctx, func() bool {
		list, err := q.cp.AdminClient().ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for i, s := range list.Items {
			if s.Spec.Driver == driver && s.Spec.NodeName != nil && *s.Spec.NodeName == q.opts.node && len(s.Spec.Devices) == simulatedGPUs {
				found = &list.Items[i]
				return true
			}
		}
		return false
	})
	if err != nil {
		return nil, fmt.Errorf("no ResourceSlice of driver %s with %d devices for node %s: %w", driver, simulatedGPUs, q.opts.node, err)
	}
	return found, nil
}

// sliceSummary describes the slice's devices: the untainted ones with their capacities, and
// how many carry the owned-by-hami taint.
func sliceSummary(s *resourcev1.ResourceSlice, p dra.Profile) string {
	var free []string
	owned := 0
	for _, d := range s.Spec.Devices {
		if slices.ContainsFunc(d.Taints, func(t resourcev1.DeviceTaint) bool { return t.Key == p.OwnedByHAMiTaint() }) {
			owned++
			continue
		}
		caps := map[resourcev1.QualifiedName]resource.Quantity{}
		for k, v := range d.Capacity {
			caps[k] = v.Value
		}
		free = append(free, fmt.Sprintf("%s (%s)", d.Name, capacityString(caps)))
	}
	return fmt.Sprintf("%d devices; %s for claims; %d tainted %s:NoSchedule", len(s.Spec.Devices), strings.Join(free, ", "), owned, p.OwnedByHAMiTaint())
}

// capacityString writes capacities as name=value, sorted by name.
func capacityString(caps map[resourcev1.QualifiedName]resource.Quantity) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(caps)) {
		v := caps[k]
		parts = append(parts, string(k)+"="+v.String())
	}
	return strings.Join(parts, " ")
}

// createClaimPod creates a pod on the node that uses the ResourceClaim {count 1, memory
// 10Gi, cores 30} of the profile's DeviceClass, then the claim, owned by the pod
// (dra.SetPodOwner), so that it goes with the pod.
func (q *quickstart) createClaimPod(ctx context.Context, p dra.Profile) (*corev1.Pod, *resourcev1.ResourceClaim, error) {
	c := q.cp.AdminClient()
	claimName := draClaim
	pod, err := c.CoreV1().Pods(demoNamespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: draPod, Namespace: demoNamespace},
		Spec: corev1.PodSpec{
			SchedulerName:  schedulerName, // the quickstart's kube-scheduler serves this profile only
			NodeSelector:   map[string]string{corev1.LabelHostname: q.opts.node},
			ResourceClaims: []corev1.PodResourceClaim{{Name: draRequest, ResourceClaimName: &claimName}},
			Containers: []corev1.Container{{Name: "cuda", Image: "nvcr.io/nvidia/cuda:12.6.3-base-ubuntu24.04", Command: []string{"nvidia-smi"},
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: draRequest}}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("create pod %s/%s: %w", demoNamespace, draPod, err)
	}
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: draClaim, Namespace: demoNamespace},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: draRequest,
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: p.Driver, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1,
				Capacity: &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{
					dra.CapacityMemory: resource.MustParse(draMemory),
					dra.CapacityCores:  *resource.NewQuantity(draCores, resource.DecimalSI),
				}}},
		}}}},
	}
	if err := dra.SetPodOwner(claim, pod); err != nil {
		return nil, nil, err
	}
	claim, err = c.ResourceV1().ResourceClaims(demoNamespace).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("create ResourceClaim %s/%s: %w", demoNamespace, draClaim, err)
	}
	q.out.item("claim", "ResourceClaim %s/%s: 1 device of class %s with %s=%s, %s=%d; pod %s/%s uses it", demoNamespace, draClaim, p.Driver,
		dra.CapacityMemory, draMemory, dra.CapacityCores, draCores, demoNamespace, draPod)
	return pod, claim, nil
}

// readCDISpec reads the CDI spec in dir that defines the devices ids (<vendor>/<class>=<name>),
// all of one transient spec, as the container runtime resolves them.
func readCDISpec(dir string, ids []string) (*cdispec.Spec, string, error) {
	if len(ids) == 0 {
		return nil, "", fmt.Errorf("the kubelet got no CDI device for the claim")
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, "", err
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, "", err
		}
		var s cdispec.Spec
		if err := json.Unmarshal(data, &s); err != nil {
			return nil, "", fmt.Errorf("CDI spec %s: %w", f, err)
		}
		if s.Kind != draCDIClass {
			continue
		}
		all := true
		for _, id := range ids {
			name, ok := strings.CutPrefix(id, s.Kind+"=")
			all = all && ok && slices.ContainsFunc(s.Devices, func(d cdispec.Device) bool { return d.Name == name })
		}
		if all {
			return &s, f, nil
		}
	}
	return nil, "", fmt.Errorf("no CDI spec in %s defines %s", dir, strings.Join(ids, ", "))
}

// lateWriter is where klog's global logger writes: nowhere until set, then the writer set.
// main installs the global logger once, before any goroutine, so that the DRA step can point
// it at its log file without racing with the goroutines that log.
type lateWriter struct {
	mu sync.Mutex
	w  io.Writer
}

// set makes the writer write to w (nil: discard).
func (l *lateWriter) set(w io.Writer) {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.w = w
	l.mu.Unlock()
}

// Write writes p to the writer set, if any.
func (l *lateWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w == nil {
		return len(p), nil
	}
	return l.w.Write(p)
}
