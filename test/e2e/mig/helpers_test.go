package mig_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
	"github.com/hamireg/hamireg/envtest/proc"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

const (
	resGPU   = "nvidia.com/gpu"
	resMem   = "nvidia.com/gpumem"
	resCores = "nvidia.com/gpucores"
	// gpus is the simulated DGX A100's GPU count.
	gpus = 8
	// agentRole is the ClusterRole the agent runs with: exactly nodeagent.ClusterRoleRules().
	agentRole = "e2e-mig-nodeagent"
	// waitPod bounds a pod's way from creation to bind-phase success (kube-scheduler's
	// backoff after a lock conflict included); waitReconcile the agent's destruction of a
	// deleted pod's instance (its reconcile runs every few seconds).
	waitPod       = 90 * time.Second
	waitReconcile = 60 * time.Second
)

// wireAllocation is one element of hami.io/vgpu-mig-allocations exactly as HAMi master's
// scheduler and device plugin write it (mig_allocations.go); decoded with unknown fields
// refused, so that a key the SDK writes and HAMi does not read fails the test.
type wireAllocation struct {
	ContainerIndex    int           `json:"containerIndex"`
	DeviceIndex       int           `json:"deviceIndex"`
	GPUUUID           string        `json:"gpuUUID"`
	Profile           string        `json:"profile"`
	Placement         wirePlacement `json:"placement"`
	MigUUID           string        `json:"migUUID,omitempty"`
	GPUInstanceID     *uint32       `json:"gpuInstanceID,omitempty"`
	ComputeInstanceID *uint32       `json:"computeInstanceID,omitempty"`
}

// wirePlacement is HAMi's MigPlacement.
type wirePlacement struct {
	Start uint32 `json:"start"`
	Size  uint32 `json:"size"`
}

func (p wirePlacement) mig() mig.Placement { return mig.Placement{Start: p.Start, Size: p.Size} }

func decodeWire(s string) ([]wireAllocation, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	var out []wireAllocation
	if err := dec.Decode(&out); err != nil {
		return nil, err
	}
	return out, nil
}

// simState is what examples/deviceplugin's --simulate-debug-address serves at
// /debug/nvmlsim/mig: the live MIG instances of each simulated GPU and the simulation's own
// overlap check.
type simState struct {
	GPUs []simGPU `json:"gpus"`
	// Overlaps is the simulation's MIGOverlaps() error text, "" when no two live instances
	// overlap.
	Overlaps string `json:"overlaps"`
}

type simGPU struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	// MIGMode is NVML's current MIG mode: 1 on.
	MIGMode   int           `json:"migMode"`
	Instances []simInstance `json:"instances"`
}

type simInstance struct {
	Profile           string        `json:"profile"`
	ProfileID         uint32        `json:"profileID"`
	Placement         wirePlacement `json:"placement"`
	GPUInstanceID     uint32        `json:"gpuInstanceID"`
	ComputeInstanceID uint32        `json:"computeInstanceID"`
	MigUUID           string        `json:"migUUID"`
}

// stack is one MIG node (the kubelet's device manager and examples/deviceplugin on a
// simulated DGX A100 in MIG mode), examples/extender registering that node only, and
// kube-scheduler calling the extender; a goroutine plays the kubelet's admission.
type stack struct {
	node, ns string
	dm       *kubeletpeer.DeviceManager
	agent    *proc.Process
	debugURL string
	// gpus are the registered GPUs by UUID.
	gpus    map[string]annotation.Device
	kubelet *kubelet
}

// newStack starts everything and waits until the node is registered with 8 MIG GPUs.
func newStack(t *testing.T) *stack {
	t.Helper()
	ctx := harness.Context(t)
	s := &stack{node: harness.UniqueName("mig"), ns: harness.UniqueName("mig")}
	cp.CreateNode(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.node, Labels: map[string]string{harness.TestLabel: s.node}}})
	if err := cp.EnsureNamespace(ctx, s.ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.AdminClient().CoreV1().Namespaces().Delete(context.WithoutCancel(t.Context()), s.ns, metav1.DeleteOptions{})
	})
	root := harness.ShortTempDir(t)
	s.dm = harness.StartDeviceManagerForTest(t, kubeletpeer.DeviceManagerOptions{Dir: filepath.Join(root, "device-plugins")})
	s.debugURL = fmt.Sprintf("http://127.0.0.1:%d", harness.FreePort(t))
	s.agent = startAgent(t, s.node, root, cp.AgentKubeconfig(t, s.ns, agentRole), "--simulate-debug-address", strings.TrimPrefix(s.debugURL, "http://"))

	var caps kubeletpeer.Resources
	harness.Eventually(t, "the kubelet's nvidia.com/gpu devices", 60*time.Second, func() bool {
		r, err := s.dm.Capacity(ctx)
		caps = r
		return err == nil && r.Allocatable[resGPU] > 0
	})
	harness.Eventually(t, "8 MIG GPUs in the register annotation", 60*time.Second, func() bool {
		devs, err := annotation.Decode(cp.GetNode(t, s.node).Annotations[annotation.KeyNVIDIARegister])
		if err != nil || len(devs) != gpus {
			return false
		}
		s.gpus = map[string]annotation.Device{}
		for _, d := range devs {
			s.gpus[d.ID] = d
		}
		return true
	})
	t.Logf("kubelet resources %v; register annotation of GPU 0: %s", caps.Allocatable, s.registerOf(t, 0))
	makeReady(t, s)

	if errExtenderBuild != nil {
		t.Fatal(errExtenderBuild)
	}
	url := cp.StartExtender(t, extenderBin, "--node-scheduler-policy", "binpack", "--gpu-scheduler-policy", "binpack",
		"--node-label-selector="+harness.TestLabel+"="+s.node)
	sched, err := cp.StartScheduler(ctx, envtest.SchedulerOptions{Config: harness.ExtenderSchedulerConfig(t, url)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-scheduler log:\n%s", sched.LogTail(40))
		}
		_ = sched.Stop()
	})
	s.kubelet = startKubelet(t, s)
	return s
}

// registerOf returns the register annotation's element of the GPU with NVML index i, as the
// Node carries it.
func (s *stack) registerOf(t *testing.T, i uint) string {
	t.Helper()
	var elems []json.RawMessage
	if err := json.Unmarshal([]byte(cp.GetNode(t, s.node).Annotations[annotation.KeyNVIDIARegister]), &elems); err != nil {
		t.Fatalf("register annotation: %v", err)
	}
	for _, e := range elems {
		var d struct {
			Index uint `json:"index"`
		}
		if json.Unmarshal(e, &d) == nil && d.Index == i {
			return string(e)
		}
	}
	return ""
}

// profile returns the GPU's published profile name.
func (s *stack) profile(t *testing.T, gpu, name string) annotation.MigProfile {
	t.Helper()
	d, ok := s.gpus[gpu]
	if !ok {
		t.Fatalf("GPU %s is not registered on %s", gpu, s.node)
	}
	for _, p := range d.MIGProfiles {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("GPU %s publishes no profile %s: %+v", gpu, name, d.MIGProfiles)
	return annotation.MigProfile{}
}

// makeReady gives the Node what a kubelet would: its device count, room for pods, the Ready
// condition, and no not-ready taint.
func makeReady(t *testing.T, s *stack) {
	t.Helper()
	ctx := harness.Context(t)
	if err := s.dm.UpdateNodeStatus(ctx, cp.AdminClient().CoreV1(), s.node); err != nil {
		t.Fatal(err)
	}
	patch := fmt.Appendf(nil, `{"status":{"capacity":{"pods":"110","cpu":"64","memory":"512Gi"},"allocatable":{"pods":"110","cpu":"64","memory":"512Gi"},`+
		`"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":%q}]}}`, time.Now().UTC().Format(time.RFC3339))
	if _, err := cp.AdminClient().CoreV1().Nodes().Patch(ctx, s.node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.AdminClient().CoreV1().Nodes().Patch(ctx, s.node, types.MergePatchType, []byte(`{"spec":{"taints":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// startAgent starts examples/deviceplugin for node on the simulated DGX A100 in MIG mode.
// When tb ends it is stopped with SIGTERM and must exit 0 (a race the detector found exits
// 66).
func startAgent(tb testing.TB, node, root, kubeconfig string, extra ...string) *proc.Process {
	tb.Helper()
	if errAgentBuild != nil {
		tb.Fatal(errAgentBuild)
	}
	sp := proc.NewSpawner()
	args := append([]string{"--simulate", "dgxa100", "--mig", "--kubeconfig", kubeconfig, "--kubelet-root-dir", root,
		"--prepare-state-dir=false", "--metrics-bind-address=127.0.0.1:0", "-v", "2"}, extra...)
	env := []string{"NODE_NAME=" + node}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "NODE_NAME=") && !strings.HasPrefix(e, "NodeName=") && !strings.HasPrefix(e, "HOOK_PATH=") {
			env = append(env, e)
		}
	}
	p, err := sp.Start(proc.Options{Name: "deviceplugin", Path: agentBin, Args: args, Env: env, LogPath: filepath.Join(tb.TempDir(), "deviceplugin.log")})
	if err != nil {
		sp.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		defer sp.Close()
		select {
		case <-p.Exited():
			tb.Errorf("deviceplugin had exited before SIGTERM: %v\n%s", p.ExitError(), p.LogTail(40))
			return
		default:
		}
		if err := p.Stop(20 * time.Second); err != nil {
			tb.Errorf("%v\n%s", err, p.LogTail(40))
		} else if ee := (*exec.ExitError)(nil); errors.As(p.ExitError(), &ee) {
			tb.Errorf("deviceplugin exited with %v after SIGTERM, want 0\n%s", ee, p.LogTail(40))
		}
		if tb.Failed() {
			tb.Logf("deviceplugin log:\n%s", p.LogTail(80))
		}
	})
	return p
}

// admission is what the kubelet's device manager got from the plugin for a pod's container.
type admission struct {
	alloc kubeletpeer.Allocation
	err   error
}

// kubelet admits every pod of the stack's namespace bound to its node, once, as soon as its
// bind-phase reads allocating: ManagerImpl.Allocate for the container "cuda".
type kubelet struct {
	mu   sync.Mutex
	done map[types.UID]admission
}

func startKubelet(t *testing.T, s *stack) *kubelet {
	t.Helper()
	k := &kubelet{done: map[types.UID]admission{}}
	ctx, cancel := context.WithCancel(harness.Context(t))
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			list, err := cp.AdminClient().CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{
				FieldSelector: fields.OneTermEqualSelector("spec.nodeName", s.node).String(),
			})
			if err != nil {
				continue
			}
			for i := range list.Items {
				pod := &list.Items[i]
				k.mu.Lock()
				_, seen := k.done[pod.UID]
				k.mu.Unlock()
				if seen || pod.DeletionTimestamp != nil || pod.Annotations[allocation.KeyBindPhase] != string(allocation.PhaseAllocating) {
					continue
				}
				a, err := s.dm.Allocate(ctx, pod, "cuda")
				if ctx.Err() != nil {
					return
				}
				k.mu.Lock()
				k.done[pod.UID] = admission{alloc: a, err: err}
				k.mu.Unlock()
			}
		}
	})
	return k
}

// admitted returns the admission of pod uid, ok false while there is none.
func (k *kubelet) admitted(uid types.UID) (admission, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	a, ok := k.done[uid]
	return a, ok
}

// createPod creates a pod with one container "cuda" asking for one GPU and, where > 0, mem
// MiB and cores percent.
func (s *stack) createPod(t *testing.T, name string, mem, cores int64) {
	t.Helper()
	s.createAnnotatedPod(t, name, mem, cores, nil)
}

// createAnnotatedPod is createPod with pod annotations.
func (s *stack) createAnnotatedPod(t *testing.T, name string, mem, cores int64, annotations map[string]string) {
	t.Helper()
	limits := corev1.ResourceList{resGPU: resource.MustParse("1")}
	if mem > 0 {
		limits[resMem] = *resource.NewQuantity(mem, resource.DecimalSI)
	}
	if cores > 0 {
		limits[resCores] = *resource.NewQuantity(cores, resource.DecimalSI)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns, Annotations: annotations},
		Spec: corev1.PodSpec{SchedulerName: "hami-scheduler", Containers: []corev1.Container{{
			Name: "cuda", Image: "registry.invalid/cuda:0", Resources: corev1.ResourceRequirements{Limits: limits},
		}}},
	}
	if _, err := cp.AdminClient().CoreV1().Pods(s.ns).Create(harness.Context(t), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
}

// deletePod deletes a pod at once (no kubelet confirms a graceful deletion).
func (s *stack) deletePod(t *testing.T, name string) {
	t.Helper()
	err := cp.AdminClient().CoreV1().Pods(s.ns).Delete(harness.Context(t), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete pod %s: %v", name, err)
	}
}

// getPod reads a pod of the stack's namespace.
func (s *stack) getPod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	p, err := cp.AdminClient().CoreV1().Pods(s.ns).Get(harness.Context(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get pod %s: %v", name, err)
	}
	return p
}

// placed is a MIG pod after its Allocate: the GPU and the reservation with runtime identity.
type placed struct {
	name    string
	gpu     string
	profile string
	at      mig.Placement
	migUUID string
	// gi and ci are the reservation's gpuInstanceID and computeInstanceID.
	gi, ci uint32
}

// waitPlaced waits for pod name's bind-phase success and checks everything a placed MIG pod
// carries (see checkPlaced).
func (s *stack) waitPlaced(t *testing.T, name, wantProfile string) placed {
	t.Helper()
	var pod *corev1.Pod
	// The agent writes bind-phase success before its Allocate answer reaches the kubelet:
	// wait for both.
	harness.Eventually(t, "bind-phase success of "+name+" and the kubelet's Allocate", waitPod, func() bool {
		pod = s.getPod(t, name)
		ph := pod.Annotations[allocation.KeyBindPhase]
		if ph == string(allocation.PhaseFailed) {
			t.Fatalf("pod %s: bind-phase failed; annotations %v", name, pod.Annotations)
		}
		_, admitted := s.kubelet.admitted(pod.UID)
		return ph == string(allocation.PhaseSuccess) && admitted
	})
	return s.checkPlaced(t, pod, wantProfile)
}

// checkPlaced checks a pod with bind-phase success on a MIG GPU: its device list is one GPU of
// the node with the memory and cores of the reserved profile wantProfile (as HAMi's
// AddResourceUsage replaces them), its hami.io/vgpu-mig-allocations is one reservation of a
// placement the GPU publishes for that profile, with the runtime identity; the kubelet's
// Allocate answered NVIDIA_VISIBLE_DEVICES = that migUUID and no HAMi-core limit or mount;
// the node lock is gone.
func (s *stack) checkPlaced(t *testing.T, pod *corev1.Pod, wantProfile string) placed {
	t.Helper()
	pd, err := allocation.DecodePodDevices(pod.Annotations[annotation.KeyNVIDIAAllocated], allocation.VersionMaster)
	if err != nil || len(pd) != 1 || len(pd[0]) != 1 {
		t.Fatalf("pod %s: %s = %q (%v), want one device", pod.Name, annotation.KeyNVIDIAAllocated, pod.Annotations[annotation.KeyNVIDIAAllocated], err)
	}
	dev := pd[0][0]
	prof := s.profile(t, dev.UUID, wantProfile)
	if dev.Usedmem != prof.MemoryMB || dev.Usedcores != prof.Core {
		t.Errorf("pod %s: device %+v, want the %s profile's %d MiB and %d%% cores", pod.Name, dev, wantProfile, prof.MemoryMB, prof.Core)
	}
	raw := pod.Annotations[mig.KeyAllocations]
	allocs, err := decodeWire(raw)
	if err != nil || len(allocs) != 1 {
		t.Fatalf("pod %s: %s = %q (%v), want one reservation in HAMi's shape", pod.Name, mig.KeyAllocations, raw, err)
	}
	a := allocs[0]
	if sdk, err := mig.DecodeAllocations(raw); err != nil || len(sdk) != 1 || sdk[0].Runtime == nil || sdk[0].Runtime.MigUUID != a.MigUUID {
		t.Errorf("pod %s: mig.DecodeAllocations(%s) = %+v, %v; want the one reservation with its runtime identity", pod.Name, raw, sdk, err)
	}
	if a.ContainerIndex != 0 || a.DeviceIndex != 0 || a.GPUUUID != dev.UUID || a.Profile != wantProfile {
		t.Errorf("pod %s: reservation %s, want container 0 device 0 of %s, profile %s", pod.Name, raw, dev.UUID, wantProfile)
	}
	if !slices.Contains(prof.Placements, a.Placement.mig()) {
		t.Errorf("pod %s: placement %+v is not one of %s's %+v", pod.Name, a.Placement, wantProfile, prof.Placements)
	}
	if a.MigUUID == "" || a.GPUInstanceID == nil || a.ComputeInstanceID == nil {
		t.Errorf("pod %s: reservation %s lacks the runtime identity the agent patches in", pod.Name, raw)
	}
	adm, ok := s.kubelet.admitted(pod.UID)
	switch {
	case !ok:
		t.Errorf("pod %s: bind-phase success without the kubelet's Allocate", pod.Name)
	case adm.err != nil:
		t.Errorf("pod %s: ManagerImpl.Allocate: %v", pod.Name, adm.err)
	default:
		if got := adm.alloc.Envs["NVIDIA_VISIBLE_DEVICES"]; got != a.MigUUID {
			t.Errorf("pod %s: Allocate answered NVIDIA_VISIBLE_DEVICES=%q, want the reservation's migUUID %q", pod.Name, got, a.MigUUID)
		}
		for k := range adm.alloc.Envs {
			if strings.HasPrefix(k, "CUDA_DEVICE_") {
				t.Errorf("pod %s: Allocate set the HAMi-core limit %s on a MIG device: %v", pod.Name, k, adm.alloc.Envs)
			}
		}
		for _, m := range adm.alloc.Mounts {
			if strings.Contains(m.HostPath, "vgpu") {
				t.Errorf("pod %s: Allocate mounted HAMi-core's %s on a MIG device", pod.Name, m.HostPath)
			}
		}
	}
	if l := cp.GetNode(t, s.node).Annotations[nodelock.Key]; l != "" {
		// The lock is released right after bind-phase success; give the agent a moment.
		harness.Eventually(t, "node lock released after "+pod.Name, 10*time.Second, func() bool {
			return cp.GetNode(t, s.node).Annotations[nodelock.Key] == ""
		})
	}
	out := placed{name: pod.Name, gpu: dev.UUID, profile: a.Profile, at: a.Placement.mig(), migUUID: a.MigUUID}
	if a.GPUInstanceID != nil && a.ComputeInstanceID != nil {
		out.gi, out.ci = *a.GPUInstanceID, *a.ComputeInstanceID
	}
	return out
}

// sim reads the simulation's live instances.
func (s *stack) sim(t *testing.T) simState {
	t.Helper()
	req, err := http.NewRequestWithContext(harness.Context(t), http.MethodGet, s.debugURL+"/debug/nvmlsim/mig", http.NoBody)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("simulation debug endpoint: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("simulation debug endpoint: %s: %s", resp.Status, buf.String())
	}
	var st simState
	if err := json.Unmarshal(buf.Bytes(), &st); err != nil {
		t.Fatalf("simulation debug endpoint: %v: %s", err, buf.String())
	}
	return st
}

// live returns the simulation's instances by MIG UUID, with their GPU.
func (st simState) live() map[string]struct {
	gpu string
	simInstance
} {
	out := map[string]struct {
		gpu string
		simInstance
	}{}
	for _, g := range st.GPUs {
		for _, in := range g.Instances {
			out[in.MigUUID] = struct {
				gpu string
				simInstance
			}{g.UUID, in}
		}
	}
	return out
}

// checkSim asks the simulation after a step: no two live instances overlap (its own check
// and ours), and the live instances are exactly those of pods (GPU, placement, MIG UUID).
func (s *stack) checkSim(t *testing.T, step string, pods ...placed) {
	t.Helper()
	st := s.sim(t)
	if st.Overlaps != "" {
		t.Errorf("%s: the simulation reports overlapping instances: %s", step, st.Overlaps)
	}
	if len(st.GPUs) != gpus {
		t.Errorf("%s: the simulation lists %d GPUs, want %d", step, len(st.GPUs), gpus)
	}
	n := 0
	for _, g := range st.GPUs {
		if g.MIGMode != 1 {
			t.Errorf("%s: GPU %s: MIG mode %d, want 1 (on)", step, g.UUID, g.MIGMode)
		}
		n += len(g.Instances)
		for i, a := range g.Instances {
			for _, b := range g.Instances[i+1:] {
				if mig.Overlaps(a.Placement.mig(), b.Placement.mig()) {
					t.Errorf("%s: GPU %s: instances %+v and %+v overlap", step, g.UUID, a, b)
				}
			}
		}
	}
	live := st.live()
	for _, p := range pods {
		in, ok := live[p.migUUID]
		switch {
		case !ok:
			t.Errorf("%s: pod %s's MIG device %s is not among the simulation's instances %+v", step, p.name, p.migUUID, st.GPUs)
		case in.gpu != p.gpu || in.Placement.mig() != p.at || in.Profile != p.profile:
			t.Errorf("%s: pod %s: the simulation has %s (%s) on %s at %+v, the reservation says %s on %s at %+v", step, p.name, p.migUUID, in.Profile, in.gpu, in.Placement, p.profile, p.gpu, p.at)
		case in.GPUInstanceID != p.gi || in.ComputeInstanceID != p.ci:
			t.Errorf("%s: pod %s: the simulation's %s is GPU instance %d compute instance %d, the reservation says %d and %d", step, p.name, p.migUUID, in.GPUInstanceID, in.ComputeInstanceID, p.gi, p.ci)
		}
	}
	if n != len(pods) {
		t.Errorf("%s: the simulation has %d live instances, the pods hold %d: %+v", step, n, len(pods), st.GPUs)
	}
	t.Logf("%s: %d live instances, none overlapping", step, n)
}

// waitNoInstances waits until the simulation has no instance left (the agent destroyed those
// of deleted pods).
func (s *stack) waitNoInstances(t *testing.T, step string) {
	t.Helper()
	harness.Eventually(t, step+": every instance destroyed", waitReconcile, func() bool { return len(s.sim(t).live()) == 0 })
}

// deleteAll deletes every pod of the namespace and waits until the agent destroyed every
// instance.
func (s *stack) deleteAll(t *testing.T, step string) {
	t.Helper()
	list, err := cp.AdminClient().CoreV1().Pods(s.ns).List(harness.Context(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		s.deletePod(t, p.Name)
	}
	s.waitNoInstances(t, step)
}

// failedScheduling returns the messages of pod's FailedScheduling events.
func (s *stack) failedScheduling(t *testing.T, pod string) []string {
	t.Helper()
	evs, err := cp.AdminClient().CoreV1().Events(s.ns).List(harness.Context(t), metav1.ListOptions{
		FieldSelector: fields.AndSelectors(fields.OneTermEqualSelector("involvedObject.name", pod), fields.OneTermEqualSelector("reason", "FailedScheduling")).String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, 0, len(evs.Items))
	for _, e := range evs.Items {
		out = append(out, e.Message)
	}
	return out
}

// waitPending waits for a FailedScheduling event of pod naming reason, and checks that the pod
// is not bound.
func (s *stack) waitPending(t *testing.T, pod, reason string) {
	t.Helper()
	var evs []string
	harness.Eventually(t, "FailedScheduling of "+pod+" naming "+reason, waitPod, func() bool {
		evs = s.failedScheduling(t, pod)
		return slices.ContainsFunc(evs, func(m string) bool { return strings.Contains(m, reason) })
	})
	p := s.getPod(t, pod)
	if p.Spec.NodeName != "" || p.Annotations[allocation.KeyBindPhase] != "" {
		t.Errorf("pod %s: bound to %q (bind-phase %q), want Pending", pod, p.Spec.NodeName, p.Annotations[allocation.KeyBindPhase])
	}
	t.Logf("%s: FailedScheduling %q", pod, evs)
}
