package drahealth_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/nodeagent/nodedra"
	"github.com/hamireg/hamireg/nvmlscan"
	"github.com/hamireg/hamireg/nvmlscan/nvmlscantest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

const (
	// quietPeriod is the scanner's recovery rule: a GPU without an XID for this long (on the
	// node's fake clock) that answers NVML is healthy again at the next probe.
	quietPeriod   = time.Minute
	probeInterval = time.Second
	// dpGPU0 is the first of the device plugin's GPUs (6 and 7); 0–5 are DRA's.
	dpGPU0 = 6
	// container is the test pods' only container.
	container = "cuda"
)

// draGPUs are the DRA world's GPUs (nodedra.Options.GPUs).
var draGPUs = []string{"0", "1", "2", "3", "4", "5"}

// healthNode is a Node with the kubelet's DRA manager (in-process) and device manager (child
// process), both followed by their pod status sync, and the node agent with its DRA world on
// a simulated DGX A100 whose health watch runs on a fake clock.
type healthNode struct {
	name    string // the Node, its namespace and its kubernetes.io/hostname label
	profile dra.Profile
	dra     *kubeletpeer.DRAManager
	dm      *kubeletpeer.DeviceManager
	sim     *nvmlscantest.Node
	clock   *testingclock.FakeClock // the scanner's health clock: Step recovers GPUs
	world   *nodedra.World
}

// startHealthNode creates the Node (ready, untainted) and its namespace, starts the kubelet
// peers, their pod status syncs and the agent, and waits until the DRA driver has registered
// and the device manager counts the device plugin's GPUs.
func startHealthNode(tb testing.TB) *healthNode {
	tb.Helper()
	if errScheduler != nil {
		tb.Fatal(errScheduler)
	}
	n := &healthNode{name: harness.UniqueName("health"), profile: dra.SDKProfile(), clock: testingclock.NewFakeClock(time.Now())}
	root := harness.ShortTempDir(tb)
	cp.CreateNode(tb, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{
		corev1.LabelHostname: n.name, harness.TestLabel: n.name,
	}}})
	ctx := harness.Context(tb)
	if err := cp.EnsureNamespace(ctx, n.name); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = cp.AdminClient().CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), n.name, metav1.DeleteOptions{})
	})
	cp.CreateDeviceClass(tb, n.profile)
	n.dra = cp.StartDRAManagerForTest(tb, kubeletpeer.DRAManagerOptions{NodeName: n.name, RegistryDir: filepath.Join(root, "reg")})
	n.dm = harness.StartDeviceManagerForTest(tb, kubeletpeer.DeviceManagerOptions{Dir: filepath.Join(root, "dp")})

	// The kubelet's sync loop for device health, for both managers.
	syncCtx, stopSync := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for name, run := range map[string]func(context.Context) error{
		"DRA manager":    func(ctx context.Context) error { return n.dra.SyncPodStatus(ctx, cp.AdminClient().CoreV1()) },
		"device manager": func(ctx context.Context) error { return n.dm.SyncPodStatus(ctx, cp.AdminClient().CoreV1()) },
	} {
		wg.Go(func() {
			if err := run(syncCtx); err != nil {
				tb.Errorf("pod status sync of the %s: %v", name, err)
			}
		})
	}
	tb.Cleanup(func() { stopSync(); wg.Wait() })

	n.sim = nvmlscantest.NewNode(tb, dgxa100.New())
	scanner, err := nvmlscan.New(n.sim.Server, nvmlscan.Options{
		Sysfs: n.sim.Sysfs, Clock: n.clock,
		Health: nvmlscan.HealthOptions{QuietPeriod: quietPeriod, ProbeInterval: probeInterval},
	})
	if err != nil {
		tb.Fatal(err)
	}
	popts := draplugin.Options{
		Profile:        n.profile,
		RegistrarDir:   n.dra.RegistryDir(),
		PluginDir:      filepath.Join(root, "plugin"),
		CDIDir:         filepath.Join(root, "cdi"),
		SliceSyncDelay: -1,
	}
	n.world, err = nodedra.New(cp.AdminClient(), n.name, nodedra.Options{Plugin: popts, GPUs: draGPUs})
	if err != nil {
		_ = scanner.Close()
		tb.Fatal(err)
	}
	agent, err := nodeagent.New(cp.AdminClient(), n.name, scanner, nodeagent.Options{
		Kubelet: kubeletplugin.Options{PluginDir: n.dm.Dir()},
		DRA:     n.world,
	})
	if err != nil {
		_ = scanner.Close()
		tb.Fatal(err)
	}
	agentCtx, stopAgent := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.Run(agentCtx) }()
	tb.Cleanup(func() {
		stopAgent()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			tb.Errorf("node agent of %s: %v", n.name, err)
		}
		_ = scanner.Close()
	})
	harness.WaitForDriver(tb, n.dra, n.profile.Driver)
	n.makeReady(tb)
	return n
}

// makeReady gives the Node what a kubelet would: room for pods, the Ready condition, the
// device manager's nvidia.com/gpu count, no not-ready taint.
func (n *healthNode) makeReady(tb testing.TB) {
	tb.Helper()
	ctx := harness.Context(tb)
	dp := int64(harness.SimulatedGPUs-len(draGPUs)) * harness.DefaultSplit
	harness.WaitForResources(tb, n.dm, harness.GPUResource, dp, dp)
	if err := n.dm.UpdateNodeStatus(ctx, cp.AdminClient().CoreV1(), n.name); err != nil {
		tb.Fatal(err)
	}
	nodes := cp.AdminClient().CoreV1().Nodes()
	patch := fmt.Appendf(nil, `{"status":{"capacity":{"pods":"110","cpu":"64","memory":"512Gi"},"allocatable":{"pods":"110","cpu":"64","memory":"512Gi"},`+
		`"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":%[1]q,"lastTransitionTime":%[1]q}]}}`, time.Now().UTC().Format(time.RFC3339))
	if _, err := nodes.Patch(ctx, n.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		tb.Fatal(err)
	}
	if _, err := nodes.Patch(ctx, n.name, types.MergePatchType, []byte(`{"spec":{"taints":null}}`), metav1.PatchOptions{}); err != nil {
		tb.Fatal(err)
	}
}

// draResourceName is the allocatedResourcesStatus entry the kubelet writes for the test
// claim pods' claim (pod claim entry "gpu", no request named by the container).
const draResourceName = corev1.ResourceName("claim:" + harness.ClaimRequestName)

// claimPod is a running pod whose claim kube-scheduler allocated on the DRA GPU with NVML
// index gpu, prepared by the kubelet's DRA manager, with the status the kubelet writes when
// its container started: running, and the claim's device Healthy. It returns the pod and the
// resource ID of its device.
func (n *healthNode) claimPod(tb testing.TB, name string, gpu int) (*corev1.Pod, corev1.ResourceID) {
	tb.Helper()
	sel := fmt.Sprintf("device.attributes[%q].index == %d", n.profile.Driver, gpu)
	claim, pod := cp.CreateClaimPod(tb, n.name, name, harness.Claim(n.name, name, n.profile.Driver, harness.ClaimRequest{Count: 1, Memory: "10Gi", Cores: "30", Selectors: []string{sel}}))
	cp.WaitForAllocation(tb, claim.Namespace, claim.Name)
	pod = cp.WaitForBound(tb, pod.Namespace, pod.Name)
	ctx, cancel := context.WithTimeout(harness.Context(tb), harness.DRAWait)
	defer cancel()
	if err := n.dra.Prepare(ctx, pod); err != nil {
		tb.Fatalf("prepare pod %s: %v", pod.Name, err)
	}
	ids, err := n.dra.GetResources(pod, container)
	if err != nil || len(ids) != 1 {
		tb.Fatalf("CDI IDs of pod %s: %q, %v; want one", pod.Name, ids, err)
	}
	tb.Cleanup(func() { _ = n.dra.Unprepare(context.WithoutCancel(ctx), pod) })
	id := corev1.ResourceID(ids[0])
	n.markRunning(tb, pod)
	harness.Eventually(tb, fmt.Sprintf("pod %s's claim device %s Healthy in its status", name, id), harness.DRAWait, func() bool {
		if err := n.dra.WritePodStatus(ctx, cp.AdminClient().CoreV1(), pod); err != nil {
			tb.Fatal(err)
		}
		return health(n.getPod(ctx, tb, name), draResourceName)[id] == corev1.ResourceHealthStatusHealthy
	})
	return pod, id
}

// devicePluginPod is a running pod that HAMi's scheduler placed on the device plugin's GPU
// with NVML index gpu (one nvidia.com/gpu, 1000 MiB), admitted by the kubelet's device
// manager (the node agent's Allocate), with the status the kubelet writes when its container
// started: running, and its device Healthy. It returns the pod and its device's resource ID
// (a replica <GPU UUID>-<i> of that GPU).
func (n *healthNode) devicePluginPod(tb testing.TB, name string, gpu int) (*corev1.Pod, corev1.ResourceID) {
	tb.Helper()
	pods := cp.AdminClient().CoreV1().Pods(n.name)
	pod, err := pods.Create(tb.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: n.name},
		Spec: corev1.PodSpec{
			SchedulerName: "hami-scheduler", // not kube-scheduler's: allocationtest binds it
			NodeSelector:  map[string]string{corev1.LabelHostname: n.name},
			Containers: []corev1.Container{{Name: container, Image: "registry.invalid/cuda:0", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				harness.GPUResource: resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse("1000"),
			}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = pods.Delete(context.WithoutCancel(tb.Context()), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
	})
	uuid := n.sim.UUID(gpu)
	pod = allocationtest.Schedule(tb, cp.AdminClient(), pod, n.name,
		allocation.PodDevices{{{UUID: uuid, Type: "NVIDIA", Usedmem: 1000}}}, allocationtest.Options{})
	ctx, cancel := context.WithTimeout(harness.Context(tb), harness.DRAWait)
	defer cancel()
	a, err := n.dm.Allocate(ctx, pod, container)
	if err != nil {
		tb.Fatalf("admit pod %s: %v", name, err)
	}
	ids := a.DeviceIDs[harness.GPUResource]
	if len(ids) != 1 || !strings.HasPrefix(ids[0], uuid+"-") {
		tb.Fatalf("pod %s got device IDs %q, want one replica of GPU %d (%s)", name, ids, gpu, uuid)
	}
	id := corev1.ResourceID(ids[0])
	n.markRunning(tb, pod)
	harness.Eventually(tb, fmt.Sprintf("pod %s's device %s Healthy in its status", name, id), harness.DRAWait, func() bool {
		if err := n.dm.WritePodStatus(ctx, cp.AdminClient().CoreV1(), pod); err != nil {
			tb.Fatal(err)
		}
		return health(n.getPod(ctx, tb, name), harness.GPUResource)[id] == corev1.ResourceHealthStatusHealthy
	})
	return pod, id
}

// markRunning writes the status the kubelet writes once the pod's container runs.
func (n *healthNode) markRunning(tb testing.TB, pod *corev1.Pod) {
	tb.Helper()
	pods := cp.AdminClient().CoreV1().Pods(pod.Namespace)
	p, err := pods.Get(tb.Context(), pod.Name, metav1.GetOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	now := metav1.Now()
	p.Status.Phase = corev1.PodRunning
	p.Status.StartTime = &now
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: container, Image: p.Spec.Containers[0].Image, ImageID: "registry.invalid/cuda@sha256:0", ContainerID: "containerd://" + string(p.UID),
		Ready: true, Started: new(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
	}}
	if _, err := pods.UpdateStatus(tb.Context(), p, metav1.UpdateOptions{}); err != nil {
		tb.Fatalf("mark pod %s running: %v", pod.Name, err)
	}
}

func (n *healthNode) getPod(ctx context.Context, tb testing.TB, name string) *corev1.Pod {
	tb.Helper()
	p, err := cp.AdminClient().CoreV1().Pods(n.name).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// health is the health of each resource of the allocatedResourcesStatus entry name of the
// pod's container, by resource ID.
func health(pod *corev1.Pod, name corev1.ResourceName) map[corev1.ResourceID]corev1.ResourceHealthStatus {
	out := map[corev1.ResourceID]corev1.ResourceHealthStatus{}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != container {
			continue
		}
		for _, rs := range cs.AllocatedResourcesStatus {
			if rs.Name == name {
				for _, r := range rs.Resources {
					out[r.ResourceID] = r.Health
				}
			}
		}
	}
	return out
}

// message is the health message of resource id in the entry name of the pod's container.
func message(pod *corev1.Pod, name corev1.ResourceName, id corev1.ResourceID) string {
	for _, cs := range pod.Status.ContainerStatuses {
		for _, rs := range cs.AllocatedResourcesStatus {
			if rs.Name != name {
				continue
			}
			for _, r := range rs.Resources {
				if r.ResourceID == id && r.Message != nil {
					return *r.Message
				}
			}
		}
	}
	return ""
}

// healthIs is a pod condition: resource id of entry name reads want.
func healthIs(name corev1.ResourceName, id corev1.ResourceID, want corev1.ResourceHealthStatus) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool { return health(p, name)[id] == want }
}

// recover steps the scanner's clock past the quiet period: the next probe finds the GPUs
// answering and marks them healthy again.
func (n *healthNode) recover() { n.clock.Step(quietPeriod + probeInterval) }

// watcher is a watch opened before an event a test causes, so that it sees the first change
// after it and when it arrived.
type watcher struct {
	w watch.Interface
}

// watchPod watches the pod ns/name from its current version on.
func watchPod(tb testing.TB, ns, name string) *watcher {
	tb.Helper()
	pods := cp.AdminClient().CoreV1().Pods(ns)
	p, err := pods.Get(tb.Context(), name, metav1.GetOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	w, err := pods.Watch(tb.Context(), metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: p.ResourceVersion})
	if err != nil {
		tb.Fatal(err)
	}
	return &watcher{w: w}
}

// watchSlices watches the node's ResourceSlices of driver from their current version on.
func watchSlices(tb testing.TB, node, driver string) *watcher {
	tb.Helper()
	slices := cp.AdminClient().ResourceV1().ResourceSlices()
	sel := fields.AndSelectors(fields.OneTermEqualSelector(resourcev1.ResourceSliceSelectorNodeName, node),
		fields.OneTermEqualSelector(resourcev1.ResourceSliceSelectorDriver, driver)).String()
	list, err := slices.List(tb.Context(), metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		tb.Fatal(err)
	}
	w, err := slices.Watch(tb.Context(), metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
	if err != nil {
		tb.Fatal(err)
	}
	return &watcher{w: w}
}

// until reads events until cond holds for an object of type T and returns it with the time
// its event arrived; it fails tb, naming what, after harness.DRAWait. It stops the watch.
func until[T any](tb testing.TB, w *watcher, what string, cond func(T) bool) (T, time.Time) {
	tb.Helper()
	defer w.w.Stop()
	timeout := time.NewTimer(harness.DRAWait)
	defer timeout.Stop()
	var last T
	for {
		select {
		case ev, ok := <-w.w.ResultChan():
			if !ok {
				tb.Fatalf("watch closed while waiting for %s (last seen %+v)", what, last)
			}
			at := time.Now()
			o, ok := ev.Object.(T)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			last = o
			if cond(o) {
				return o, at
			}
		case <-timeout.C:
			tb.Fatalf("timed out after %v waiting for %s (last seen %+v)", harness.DRAWait, what, last)
		}
	}
}

// tainted is a slice condition: its device name carries the <driver>/unhealthy taint.
func tainted(p dra.Profile, name string) func(*resourcev1.ResourceSlice) bool {
	return func(s *resourcev1.ResourceSlice) bool {
		return slices.ContainsFunc(s.Spec.Devices, func(d resourcev1.Device) bool {
			return d.Name == name && slices.ContainsFunc(d.Taints, func(t resourcev1.DeviceTaint) bool { return t.Key == p.UnhealthyTaint() })
		})
	}
}

// describe is v as JSON, for logs.
func describe(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%+v", v)
	}
	return string(b)
}
