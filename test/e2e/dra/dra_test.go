package dra_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// TestSlice: the agent publishes the dgxa100's 8 GPUs as one slice with the SDK profile's
// capacities and attributes; rescans of an unchanged node write no slice; the slice is back
// after a kubelet restart wiped it; an XID taints one device while the register annotation
// shows the GPU unhealthy.
func TestSlice(t *testing.T) {
	t.Parallel()
	n := startDRANode(t, nodeOptions{period: 200 * time.Millisecond})
	w := cp.WatchSlices(t, n.profile.Driver, n.name)
	devs := n.waitForSlice(t, w, "8 devices", func([]resourcev1.Device) bool { return true })

	regs := n.registered(t)
	byIndex := map[uint]annotation.Device{}
	for _, d := range regs {
		byIndex[d.Index] = d
	}
	for i, d := range devs {
		g, ok := byIndex[uint(i)]
		if d.Name != fmt.Sprintf("gpu-%d", i) || !ok {
			t.Fatalf("device %d is %s (registered: %v); want gpu-%d, sorted by index", i, d.Name, ok, i)
		}
		if got := d.Attributes["uuid"].StringValue; got == nil || *got != g.ID {
			t.Errorf("%s uuid = %v, want %s", d.Name, got, g.ID)
		}
		if got := d.Attributes["index"].IntValue; got == nil || *got != int64(i) {
			t.Errorf("%s index = %v, want %d", d.Name, got, i)
		}
		if got := d.Attributes["type"].StringValue; got == nil || *got != g.Type {
			t.Errorf("%s type = %v, want %s", d.Name, got, g.Type)
		}
		if got := d.Attributes["productName"].StringValue; got == nil || *got != strings.TrimPrefix(g.Type, "NVIDIA-") {
			t.Errorf("%s productName = %v, want %s", d.Name, got, strings.TrimPrefix(g.Type, "NVIDIA-"))
		}
		if got := d.Attributes["resource.kubernetes.io/pciBusID"].StringValue; got == nil || *got == "" {
			t.Errorf("%s has no resource.kubernetes.io/pciBusID", d.Name)
		}
		if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
			t.Errorf("%s allowMultipleAllocations = %v, want true", d.Name, d.AllowMultipleAllocations)
		}
		mem := d.Capacity[dra.CapacityMemory]
		if want := resource.NewQuantity(int64(g.Devmem)<<20, resource.BinarySI); mem.Value.Cmp(*want) != 0 {
			t.Errorf("%s memory = %s, want %s (devmem %d MiB)", d.Name, mem.Value.String(), want, g.Devmem)
		}
		if mem.RequestPolicy == nil || mem.RequestPolicy.ValidRange == nil || mem.RequestPolicy.Default == nil || mem.RequestPolicy.Default.Cmp(mem.Value) != 0 {
			t.Errorf("%s memory request policy = %+v, want default = the full memory and a valid range", d.Name, mem.RequestPolicy)
		}
		cores := d.Capacity[dra.CapacityCores]
		if cores.Value.Value() != int64(g.Devcore) || cores.RequestPolicy == nil || cores.RequestPolicy.Default == nil || cores.RequestPolicy.Default.Value() != 0 {
			t.Errorf("%s cores = %s, policy %+v; want %d, default 0", d.Name, cores.Value.String(), cores.RequestPolicy, g.Devcore)
		}
		if shares := d.Capacity[dra.CapacityShares]; shares.Value.Value() != int64(g.Count) {
			t.Errorf("%s shares = %s, want %d", d.Name, shares.Value.String(), g.Count)
		}
		if len(d.Taints) != 0 {
			t.Errorf("%s taints = %+v, want none", d.Name, d.Taints)
		}
	}

	// Unchanged scans write nothing. The plugin's slice controller counts its create once the
	// request returned, which may be after the watch saw the slice: wait for the count first.
	harness.Eventually(t, "the plugin's count of its slice create", harness.DRAWait, func() bool {
		return n.currentWorld().Plugin().Stats().SliceCreates >= 1
	})
	before, scans := w.Writes(), n.currentAgent().Stats().Scans
	pluginBefore := n.currentWorld().Plugin().Stats()
	harness.Eventually(t, "5 more scans", harness.DRAWait, func() bool { return n.currentAgent().Stats().Scans >= scans+5 })
	if got := w.Writes(); got != before {
		t.Errorf("%d slice writes during 5 unchanged scans, want 0", got-before)
	}
	if got := n.currentWorld().Plugin().Stats(); got.SliceCreates != pluginBefore.SliceCreates || got.SliceUpdates != pluginBefore.SliceUpdates || got.SliceDeletes != pluginBefore.SliceDeletes {
		t.Errorf("plugin slice writes during 5 unchanged scans: %+v, before %+v", got, pluginBefore)
	}

	// A kubelet restart: the new DRA manager wipes the node's slices, the agent's slice
	// controller writes the slice again.
	beforeRestart := w.Writes()
	if err := n.dra.Stop(); err != nil {
		t.Fatal(err)
	}
	n.dra = cp.StartDRAManagerForTest(t, kubeletpeer.DRAManagerOptions{NodeName: n.name, RegistryDir: n.dra.RegistryDir()}) // waits for the wipe
	harness.WaitForDriver(t, n.dra, n.profile.Driver)
	n.waitForSlice(t, w, "the slice deleted by the kubelet's wipe and written again", func([]resourcev1.Device) bool { return w.Writes() >= beforeRestart+2 })

	// An XID: GPU 3 unhealthy in both outputs.
	n.sim.XID(3, 79)
	uuid3 := byIndex[3].ID
	n.waitForSlice(t, w, "gpu-3 tainted unhealthy", func(d []resourcev1.Device) bool { return hasTaint(d[3], n.profile.UnhealthyTaint()) })
	harness.Eventually(t, "GPU 3 unhealthy in the register annotation", harness.DRAWait, func() bool {
		for _, d := range n.registered(t) {
			if d.ID == uuid3 {
				return !d.Health
			}
		}
		return false
	})
	for i, d := range w.Slices()[0].Spec.Devices {
		if i != 3 && len(d.Taints) != 0 {
			t.Errorf("%s taints = %+v after GPU 3's XID, want none", d.Name, d.Taints)
		}
	}
}

// TestClaimPrepared: a claim of 10Gi and 30 cores is allocated by kube-scheduler, the pod
// bound, prepared with HAMi-core's limits in the CDI spec, and unprepared by an agent
// restarted in between.
func TestClaimPrepared(t *testing.T) {
	t.Parallel()
	n := startDRANode(t, nodeOptions{})
	claim, pod := cp.CreateClaimPod(t, n.name, "cuda", harness.Claim(n.name, "cuda", n.profile.Driver, harness.ClaimRequest{Count: 1, Memory: "10Gi", Cores: "30"}))
	allocated := cp.WaitForAllocation(t, claim.Namespace, claim.Name)
	pod = cp.WaitForBound(t, pod.Namespace, pod.Name)
	if pod.Spec.NodeName != n.name {
		t.Fatalf("pod bound to %s, want %s", pod.Spec.NodeName, n.name)
	}
	results := allocated.Status.Allocation.Devices.Results
	if len(results) != 1 || results[0].Driver != n.profile.Driver || results[0].ShareID == nil {
		t.Fatalf("allocation results = %+v, want one shared device of %s", results, n.profile.Driver)
	}
	if got := results[0].ConsumedCapacity[dra.CapacityMemory]; got.Cmp(resource.MustParse("10Gi")) != 0 {
		t.Errorf("consumed memory = %s, want 10Gi", got.String())
	}

	ids := n.prepare(t, pod)
	if len(ids) != 1 || !strings.HasPrefix(ids[0], "k8s.hamireg.io/claim="+string(claim.UID)+"-") {
		t.Fatalf("CDI IDs = %q, want one k8s.hamireg.io/claim=%s-<device>", ids, claim.UID)
	}
	edits := harness.ResolveCDI(t, n.cdiDir, ids[0])
	env := edits.EnvMap()
	for k, want := range map[string]string{"CUDA_DEVICE_MEMORY_LIMIT_0": "10240m", "CUDA_DEVICE_SM_LIMIT_0": "30"} {
		if env[k] != want {
			t.Errorf("CDI env %s = %q, want %q (env %q)", k, env[k], want, edits.Env)
		}
	}
	if !slices.ContainsFunc(edits.Mounts, func(m *cdispec.Mount) bool { return m.ContainerPath == "/etc/ld.so.preload" }) {
		t.Errorf("CDI mounts %+v lack /etc/ld.so.preload", edits.Mounts)
	}

	// The agent restarts between Prepare and Unprepare: the new one unprepares from its
	// checkpoint once it has registered again.
	regs := n.dra.Registrations(n.profile.Driver)
	n.stopAgent()
	n.startAgent(t)
	harness.Eventually(t, "the restarted agent registered", harness.DRAWait, func() bool { return n.dra.Registrations(n.profile.Driver) > regs })
	ctx := harness.Context(t)
	harness.Eventually(t, "Unprepare through the restarted agent", harness.DRAWait, func() bool {
		err := n.dra.Unprepare(ctx, pod)
		if err != nil {
			t.Logf("unprepare: %v", err)
		}
		return err == nil
	})
	if _, err := os.Stat(edits.Path); !os.IsNotExist(err) {
		t.Errorf("CDI spec %s after Unprepare: %v; want it removed", edits.Path, err)
	}
	if got := n.currentWorld().Plugin().PreparedGPUs(); len(got) != 0 {
		t.Errorf("prepared GPUs after Unprepare = %v, want none", got)
	}
}

// TestClaimDoesNotFit: a claim larger than any GPU stays pending with the scheduler's reason.
func TestClaimDoesNotFit(t *testing.T) {
	t.Parallel()
	n := startDRANode(t, nodeOptions{})
	_, pod := cp.CreateClaimPod(t, n.name, "big", harness.Claim(n.name, "big", n.profile.Driver, harness.ClaimRequest{Count: 1, Memory: "41Gi"}))
	msg := cp.WaitForUnschedulable(t, pod.Namespace, pod.Name)
	if !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("unschedulable message %q, want kube-scheduler's \"cannot allocate all claims\"", msg)
	}
	c, err := cp.AdminClient().ResourceV1().ResourceClaims(pod.Namespace).Get(t.Context(), "big", metav1.GetOptions{})
	if err != nil || c.Status.Allocation != nil {
		t.Errorf("claim after the failed schedule: allocation %+v, %v; want none", c.Status.Allocation, err)
	}
}

// TestDevicePluginOwnedNeverChosen: with only GPU 5 DRA-owned, the other seven are tainted
// owned-by-hami and no claim gets them: three claims share GPU 5, a claim of two GPUs
// stays pending.
func TestDevicePluginOwnedNeverChosen(t *testing.T) {
	t.Parallel()
	n := startDRANode(t, nodeOptions{gpus: []string{"5"}})
	w := cp.WatchSlices(t, n.profile.Driver, n.name)
	n.waitForSlice(t, w, "7 GPUs tainted owned-by-hami", func(d []resourcev1.Device) bool {
		for i := range d {
			if hasTaint(d[i], n.profile.OwnedByHAMiTaint()) != (i != 5) {
				return false
			}
		}
		return true
	})
	for i := range 3 {
		name := fmt.Sprintf("small-%d", i)
		claim, _ := cp.CreateClaimPod(t, n.name, name, harness.Claim(n.name, name, n.profile.Driver, harness.ClaimRequest{Count: 1, Memory: "1Gi", Cores: "10"}))
		c := cp.WaitForAllocation(t, claim.Namespace, claim.Name)
		if r := c.Status.Allocation.Devices.Results; len(r) != 1 || r[0].Device != "gpu-5" {
			t.Errorf("claim %s allocated %+v, want gpu-5 only", name, r)
		}
	}
	_, pod := cp.CreateClaimPod(t, n.name, "two", harness.Claim(n.name, "two", n.profile.Driver, harness.ClaimRequest{Count: 2, Memory: "1Gi"}))
	if msg := cp.WaitForUnschedulable(t, pod.Namespace, pod.Name); !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("two-GPU claim: unschedulable message %q, want \"cannot allocate all claims\"", msg)
	}
}

// TestExtenderSkipsDRAOwned: with GPUs 0–6 DRA-owned, GPU pods scheduled by kube-scheduler
// with examples/extender on the same node all get GPU 7, at the extender's filter and at
// the kubelet's Allocate.
func TestExtenderSkipsDRAOwned(t *testing.T) {
	t.Parallel()
	if errExtenderBuild != nil {
		t.Fatalf("build examples/extender: %v", errExtenderBuild)
	}
	n := startDRANode(t, nodeOptions{gpus: []string{"0", "1", "2", "3", "4", "5", "6"}, deviceManager: true})
	var uuid7 string
	for _, d := range n.registered(t) {
		if d.Index == 7 {
			uuid7 = d.ID
		}
	}
	if uuid7 == "" {
		t.Fatal("GPU 7 not in the register annotation")
	}
	url := cp.StartExtender(t, extenderBin, "--node-label-selector="+harness.TestLabel+"="+n.name)
	s, err := cp.StartScheduler(harness.Context(t), envtest.SchedulerOptions{Config: harness.ExtenderSchedulerConfig(t, url)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	pods := cp.AdminClient().CoreV1().Pods(n.name)
	for i := range 3 {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("dp-%d", i), Namespace: n.name},
			Spec: corev1.PodSpec{
				SchedulerName: "hami-scheduler",
				NodeSelector:  map[string]string{corev1.LabelHostname: n.name},
				Containers: []corev1.Container{{Name: "cuda", Image: "registry.invalid/cuda:0", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					harness.GPUResource: resource.MustParse("1"), "nvidia.com/gpumem": resource.MustParse("1000"),
				}}}},
			},
		}
		if _, err := pods.Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = pods.Delete(context.WithoutCancel(t.Context()), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
		})
		bound := cp.WaitForBound(t, n.name, pod.Name)
		devs, err := allocation.DecodePodDevices(bound.Annotations[annotation.NVIDIA().ToAllocateKey], allocation.VersionMaster)
		if err != nil {
			t.Fatalf("pod %s: decode %s: %v", pod.Name, annotation.NVIDIA().ToAllocateKey, err)
		}
		for _, ctr := range devs {
			for _, d := range ctr {
				if d.UUID != uuid7 {
					t.Errorf("pod %s got GPU %s, want GPU 7 (%s): the others are DRA-owned", pod.Name, d.UUID, uuid7)
				}
			}
		}
		// The kubelet admits the pod: the agent hands GPU 7 and releases the node lock
		// the extender's bind took, so that the next pod can bind.
		a, err := n.dm.Allocate(harness.Context(t), bound, "cuda")
		if err != nil {
			t.Fatalf("admit pod %s: %v", pod.Name, err)
		}
		if got := a.Envs["NVIDIA_VISIBLE_DEVICES"]; got != uuid7 {
			t.Errorf("pod %s: Allocate gave NVIDIA_VISIBLE_DEVICES=%q, want GPU 7 (%s)", pod.Name, got, uuid7)
		}
	}
}

// TestHAMiProfile: a claim written exactly as HAMi-DRA's webhook writes it is allocated on
// the HAMi profile's devices and prepared with its limits.
func TestHAMiProfile(t *testing.T) {
	t.Parallel()
	n := startDRANode(t, nodeOptions{profile: dra.HAMiProfile()})
	const mib = 8000
	podName := "vllm"
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: n.name + "-" + podName + "-cuda", Namespace: n.name, Labels: map[string]string{"hami.io/dra": "true"}},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: dra.HAMiDriver,
				AllocationMode:  resourcev1.DeviceAllocationModeExactCount,
				Count:           1,
				Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
					Expression: `device.attributes["hami-core-gpu.project-hami.io"].type == "hami-gpu"`,
				}}},
				Capacity: &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{
					"cores":  resource.MustParse("30"),
					"memory": resource.MustParse(fmt.Sprint(mib * 1048576)),
				}},
			},
		}}}},
	}
	claim, pod := cp.CreateClaimPod(t, n.name, podName, claim)
	c := cp.WaitForAllocation(t, claim.Namespace, claim.Name)
	if r := c.Status.Allocation.Devices.Results; len(r) != 1 || r[0].Driver != dra.HAMiDriver || !strings.HasPrefix(r[0].Device, "hami-gpu-") {
		t.Fatalf("allocation %+v, want one hami-gpu-<i> of %s", r, dra.HAMiDriver)
	}
	pod = cp.WaitForBound(t, pod.Namespace, pod.Name)
	ids := n.prepare(t, pod)
	if len(ids) != 1 {
		t.Fatalf("CDI IDs = %q, want one", ids)
	}
	env := harness.ResolveCDI(t, n.cdiDir, ids[0]).EnvMap()
	for k, want := range map[string]string{"CUDA_DEVICE_MEMORY_LIMIT_0": fmt.Sprintf("%dm", mib), "CUDA_DEVICE_SM_LIMIT_0": "30"} {
		if env[k] != want {
			t.Errorf("CDI env %s = %q, want %q", k, env[k], want)
		}
	}
	if err := n.dra.Unprepare(harness.Context(t), pod); err != nil {
		t.Fatal(err)
	}
	if files := harness.CDISpecFiles(t, n.cdiDir); len(files) != 0 {
		t.Errorf("CDI specs after Unprepare: %q", files)
	}
}
