package nodeagent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/clienttest"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
	"github.com/hamireg/hamireg/nodelock"
)

const testNode = "gpu-1"

// testGPUs are the node's 4 GPUs, split 10 ways.
func testGPUs() []annotation.Device {
	devs := make([]annotation.Device, 4)
	for i := range devs {
		devs[i] = annotation.Device{ID: fmt.Sprintf("GPU-%d", i), Index: uint(i), Count: 10, Devmem: 40960, Devcore: 100, Type: "NVIDIA-A100", Mode: "hami-core", Health: true}
	}
	return devs
}

// gpuPod returns a pending pod whose containers ask for the given numbers of GPUs (0: none);
// names starting with "init-" are init containers.
func gpuPod(name string, containers ...string) *corev1.Pod {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)}}
	for _, c := range containers {
		ctr := corev1.Container{Name: c, Image: "cuda"}
		if !strings.HasSuffix(c, "-nogpu") {
			ctr.Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
		}
		if strings.HasPrefix(c, "init-") {
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, ctr)
		} else {
			pod.Spec.Containers = append(pod.Spec.Containers, ctr)
		}
	}
	return pod
}

// dev is the share of one GPU.
func dev(gpu int, mem, cores int32) allocation.ContainerDevice {
	return allocation.ContainerDevice{UUID: fmt.Sprintf("GPU-%d", gpu), Type: "NVIDIA", Usedmem: mem, Usedcores: cores}
}

// gpuResource is the kubelet resource of the default vendor.
const gpuResource = "nvidia.com/gpu"

type fixture struct {
	cs      *fake.Clientset
	agent   *Agent
	kubelet *kubelettest.Kubelet
	rec     *record.FakeRecorder
	ctx     context.Context
	// resource is the vendor's kubelet resource.
	resource string
}

// newFixture runs an agent with opts (the fixture's recorder, plugin folder and an hour's
// period filled in) against a clientset holding the node and pods and a fake kubelet, and
// returns once the agent registered with it: the test then calls Allocate as the kubelet
// does, over gRPC. The agent stops when the test ends.
func newFixture(t *testing.T, opts Options, pods ...*corev1.Pod) *fixture {
	t.Helper()
	return newFixtureWith(t, opts, nil, pods...)
}

// newFixtureWith is newFixture that calls prep, when not nil, between New and Run.
func newFixtureWith(t *testing.T, opts Options, prep func(*Agent), pods ...*corev1.Pod) *fixture {
	t.Helper()
	objs := []runtime.Object{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}}}
	for _, p := range pods {
		objs = append(objs, p)
	}
	return fixtureOn(t, clienttest.NewClientset(objs...), opts, prep)
}

// newFixtureOn is newFixture on the clientset cs.
func newFixtureOn(t *testing.T, cs *fake.Clientset, opts Options) *fixture {
	t.Helper()
	return fixtureOn(t, cs, opts, nil)
}

func fixtureOn(t *testing.T, cs *fake.Clientset, opts Options, prep func(*Agent)) *fixture {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	k := kubelettest.Start(t)
	rec := record.NewFakeRecorder(100)
	opts.EventRecorder, opts.Kubelet.PluginDir = rec, k.Dir()
	opts.Period = cmp.Or(opts.Period, time.Hour)
	a, err := New(cs, testNode, staticSource(testGPUs()), opts)
	if err != nil {
		t.Fatal(err)
	}
	a.backoff = wait.Backoff{Duration: time.Millisecond, Factor: 1, Steps: 2}
	if prep != nil {
		prep(a)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
	f := &fixture{cs: cs, agent: a, kubelet: k, rec: rec, ctx: ctx, resource: a.vendor.ResourceName}
	waitCtx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	if _, err := k.WaitFor(waitCtx, func(s kubelettest.State) bool { _, ok := s.Resource(f.resource); return ok }); err != nil {
		t.Fatalf("the agent did not register: %v", err)
	}
	return f
}

// staticSource is a Source whose devices never change.
type staticSource []annotation.Device

func (s staticSource) Devices(context.Context) ([]annotation.Device, []error, error) {
	return s, nil, nil
}
func (staticSource) Changed() <-chan struct{} { return nil }

// schedule binds pod as HAMi's scheduler does, with one entry per container.
func (f *fixture) schedule(t *testing.T, pod *corev1.Pod, pd allocation.PodDevices) {
	t.Helper()
	allocationtest.Schedule(t, f.cs, pod, testNode, pd, allocationtest.Options{})
}

// call sends the kubelet's Allocate for one container with these replica ids, over gRPC. An
// error is the gRPC status the kubelet gets.
func (f *fixture) call(ids ...string) (*pluginapi.ContainerAllocateResponse, error) {
	resp, err := f.kubelet.Allocate(f.ctx, f.resource, ids)
	if err != nil {
		return nil, err
	}
	return resp.GetContainerResponses()[0], nil
}

// message is the text of the agent's error as the kubelet receives it.
func message(err error) string {
	return status.Convert(errors.Unwrap(err)).Message()
}

// event returns the next Event the agent recorded, or fails the test.
func (f *fixture) event(t *testing.T) string {
	t.Helper()
	select {
	case e := <-f.rec.Events:
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("no Event recorded")
		return ""
	}
}

func (f *fixture) pod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	p, err := f.cs.CoreV1().Pods("default").Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (f *fixture) lock(t *testing.T) (string, bool) {
	t.Helper()
	n, err := f.cs.CoreV1().Nodes().Get(f.ctx, testNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v, ok := n.Annotations[nodelock.Key]
	return v, ok
}

// TestAllocateServesEveryContainer: init container first, a sidecar without GPU skipped, the
// entries consumed one per call, and after the last one bind-phase success and no lock.
func TestAllocateServesEveryContainer(t *testing.T) {
	t.Parallel()
	pod := gpuPod("train", "init-warmup", "worker", "sidecar-nogpu", "eval")
	f := newFixture(t, Options{}, pod)
	f.schedule(t, pod, allocation.PodDevices{
		{dev(2, 1000, 10)},
		{dev(0, 3000, 30), dev(1, 3000, 30)},
		{},
		{dev(3, 2048, 0)},
	})
	key := annotation.KeyNVIDIAToAllocate

	r, err := f.call("GPU-2-4")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"NVIDIA_VISIBLE_DEVICES":          "GPU-2",
		"CUDA_DEVICE_MEMORY_LIMIT_0":      "1000m",
		"CUDA_DEVICE_SM_LIMIT":            "10",
		"CUDA_DEVICE_MEMORY_SHARED_CACHE": r.GetEnvs()["CUDA_DEVICE_MEMORY_SHARED_CACHE"],
		"LIBCUDA_LOG_LEVEL":               "1",
	}
	if d := gocmp.Diff(want, r.GetEnvs()); d != "" {
		t.Errorf("init container env (-want +got):\n%s", d)
	}
	if c := r.GetEnvs()["CUDA_DEVICE_MEMORY_SHARED_CACHE"]; !strings.HasPrefix(c, "/usr/local/vgpu/") || !strings.HasSuffix(c, ".cache") {
		t.Errorf("shared cache %q", c)
	}
	var state string
	for _, m := range r.GetMounts() {
		if m.GetContainerPath() == "/usr/local/vgpu" {
			state = m.GetHostPath()
		}
	}
	if state != "/usr/local/vgpu/containers/uid-train_init-warmup" {
		t.Errorf("state folder mount %q", state)
	}
	p := f.pod(t, "train")
	if got := p.Annotations[key]; got != ";GPU-0,NVIDIA,3000,30:GPU-1,NVIDIA,3000,30:;;GPU-3,NVIDIA,2048,0:;" {
		t.Errorf("%s after the init container = %q", key, got)
	}
	if _, locked := f.lock(t); !locked || p.Annotations[allocation.KeyBindPhase] != "allocating" {
		t.Fatalf("after the first container: lock %v, bind-phase %q; want locked, allocating", locked, p.Annotations[allocation.KeyBindPhase])
	}

	r, err = f.call("GPU-1-0", "GPU-0-3")
	if err != nil {
		t.Fatal(err)
	}
	if e := r.GetEnvs(); e["NVIDIA_VISIBLE_DEVICES"] != "GPU-0,GPU-1" || e["CUDA_DEVICE_MEMORY_LIMIT_1"] != "3000m" || e["CUDA_DEVICE_SM_LIMIT"] != "30" {
		t.Errorf("worker env %v", e)
	}
	if _, err := f.call("GPU-3-9"); err != nil {
		t.Fatal(err)
	}
	p = f.pod(t, "train")
	if got := p.Annotations[key]; got != ";;;;" {
		t.Errorf("%s after the last container = %q", key, got)
	}
	if got := p.Annotations[allocation.KeyBindPhase]; got != "success" {
		t.Errorf("bind-phase = %q, want success", got)
	}
	if v, locked := f.lock(t); locked {
		t.Errorf("lock %q still on the node", v)
	}
	if s := f.agent.Stats(); s.Allocations != 3 || s.PodsCompleted != 1 || s.AllocateFailures != 0 {
		t.Errorf("Stats = %+v", s)
	}
	// The allocated list, from which schedulers count usage, is untouched.
	if pd, ok, err := allocation.Allocated(p, annotation.NVIDIA(), allocation.VersionMaster); err != nil || !ok || len(pd) != 4 || len(pd[1]) != 2 {
		t.Errorf("allocated = %v, %v, %v", pd, ok, err)
	}
}

// TestAllocateFailures: each failure where the pod is known sets bind-phase failed and
// releases the lock; the error names the class in HAMi's words and what to do.
func TestAllocateFailures(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		prepare   func(t *testing.T, f *fixture)
		ids       []string
		wantKind  error
		wantMsg   string
		wantPhase string // "" when the pod is gone
		wantLock  bool
	}{
		"entry count mismatch": {
			ids:       []string{"GPU-0-0"},
			wantKind:  ErrDeviceCountMismatch,
			wantMsg:   "device number not matched: pod default/p container main: the kubelet asked for 1 device(s), the scheduler assigned 2; bind-phase set to failed and node lock released",
			wantPhase: "failed",
		},
		"malformed to-allocate": {
			prepare: func(t *testing.T, f *fixture) {
				t.Helper()
				f.patchPod(t, map[string]string{annotation.KeyNVIDIAToAllocate: "GPU-0,NVIDIA,notanumber,30:;"})
			},
			ids:       []string{"GPU-0-0", "GPU-1-0"},
			wantKind:  ErrMalformed,
			wantMsg:   "malformed annotation: pod default/p: annotation hami.io/vgpu-devices-to-allocate",
			wantPhase: "failed",
		},
		"no entry left": {
			prepare: func(t *testing.T, f *fixture) {
				t.Helper()
				f.patchPod(t, map[string]string{annotation.KeyNVIDIAToAllocate: ";"})
			},
			ids:       []string{"GPU-0-0"},
			wantKind:  ErrNoPendingEntry,
			wantMsg:   "no pending device allocation found: pod default/p",
			wantPhase: "failed",
		},
		"pod deleted between bind and Allocate": {
			prepare: func(t *testing.T, f *fixture) {
				t.Helper()
				if err := f.cs.CoreV1().Pods("default").Delete(f.ctx, "p", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			},
			ids:      []string{"GPU-0-0", "GPU-1-0"},
			wantKind: ErrPodGone,
			wantMsg:  "pod of the node lock not found: pod default/p: deleted between bind and Allocate; node lock released",
		},
		"no lock": {
			prepare: func(t *testing.T, f *fixture) {
				t.Helper()
				if err := f.agent.locks.ForceRelease(f.ctx, testNode); err != nil {
					t.Fatal(err)
				}
			},
			ids:       []string{"GPU-0-0", "GPU-1-0"},
			wantKind:  ErrNoBindingPod,
			wantMsg:   "no binding pod found on node gpu-1: the node carries no hami.io/mutex.lock",
			wantPhase: "allocating",
		},
		"malformed lock": {
			prepare: func(t *testing.T, f *fixture) {
				t.Helper()
				f.patchNode(t, map[string]any{nodelock.Key: "yesterday,default"})
			},
			ids:       []string{"GPU-0-0", "GPU-1-0"},
			wantKind:  ErrMalformed,
			wantPhase: "allocating",
			wantLock:  true,
		},
		"legacy lock names no pod": {
			prepare: func(t *testing.T, f *fixture) {
				t.Helper()
				f.patchNode(t, map[string]any{nodelock.Key: "2026-12-01T10:00:00Z"})
			},
			ids:       []string{"GPU-0-0", "GPU-1-0"},
			wantKind:  ErrNoBindingPod,
			wantMsg:   "names no pod (legacy format)",
			wantPhase: "allocating",
			wantLock:  true,
		},
		"pod already allocated (stale lock)": {
			prepare: func(t *testing.T, f *fixture) {
				t.Helper()
				f.patchPod(t, map[string]string{allocation.KeyBindPhase: "success"})
			},
			ids:       []string{"GPU-0-0", "GPU-1-0"},
			wantKind:  ErrNoBindingPod,
			wantMsg:   "past allocation (hami.io/bind-phase success)",
			wantPhase: "success",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pod := gpuPod("p", "main")
			f := newFixture(t, Options{}, pod)
			f.schedule(t, pod, allocation.PodDevices{{dev(0, 1000, 30), dev(1, 1000, 30)}})
			if tc.prepare != nil {
				tc.prepare(t, f)
			}
			_, err := f.call(tc.ids...)
			if err == nil || !strings.HasPrefix(message(err), tc.wantKind.Error()) {
				t.Fatalf("Allocate error %v, want %v", err, tc.wantKind)
			}
			if !strings.Contains(message(err), tc.wantMsg) {
				t.Errorf("error %q does not contain %q", message(err), tc.wantMsg)
			}
			if tc.wantPhase == "failed" {
				if e := f.event(t); !strings.HasPrefix(e, "Warning "+EventReasonAllocateFailed+" "+tc.wantKind.Error()) {
					t.Errorf("Event %q", e)
				}
			}
			if tc.wantPhase != "" {
				if got := f.pod(t, "p").Annotations[allocation.KeyBindPhase]; got != tc.wantPhase {
					t.Errorf("bind-phase = %q, want %q", got, tc.wantPhase)
				}
			}
			if _, locked := f.lock(t); locked != tc.wantLock {
				t.Errorf("node locked = %v, want %v", locked, tc.wantLock)
			}
			if s := f.agent.Stats(); s.AllocateFailures != 1 || s.Allocations != 0 {
				t.Errorf("Stats = %+v", s)
			}
		})
	}
}

// A lock naming a pod that is not bound to this node yet (its scheduler is between the lock
// and the Binding) is left alone, and the pod is not touched: the container being admitted is
// someone else's, and gets none of the locked pod's devices.
func TestAllocateLeavesAPodBoundElsewhereAlone(t *testing.T) {
	t.Parallel()
	pod := gpuPod("p", "main")
	f := newFixture(t, Options{}, pod)
	s := allocationtest.NewScheduler(f.cs, allocationtest.Options{})
	if _, err := s.Filter(f.ctx, pod, testNode, allocation.PodDevices{{dev(0, 1000, 30)}}); err != nil {
		t.Fatal(err)
	}
	if err := f.agent.locks.Acquire(f.ctx, testNode, types.NamespacedName{Namespace: "default", Name: "p"}); err != nil {
		t.Fatal(err)
	}
	before := f.pod(t, "p")
	_, err := f.call("GPU-0-0")
	if !strings.HasPrefix(message(err), ErrNoBindingPod.Error()) || !strings.Contains(message(err), `bound to "", not to this node`) {
		t.Fatalf("Allocate error %v", err)
	}
	if after := f.pod(t, "p"); !gocmp.Equal(before.Annotations, after.Annotations) {
		t.Errorf("pod annotations changed: %s", gocmp.Diff(before.Annotations, after.Annotations))
	}
	if _, locked := f.lock(t); !locked {
		t.Error("the lock of a pod mid-bind was removed")
	}
}

// While the API server does not answer, Allocate fails after its retries; once it answers
// again the agent's cleanup loop finishes the protocol at once: bind-phase failed and the lock
// released. (TestCleanupLoopRetries follows the loop's retries while the outage lasts.)
func TestAllocateCleansUpAfterAPIOutage(t *testing.T) {
	t.Parallel()
	pod := gpuPod("p", "main")
	f := newFixture(t, Options{}, pod)
	f.schedule(t, pod, allocation.PodDevices{{dev(0, 1000, 30)}})
	outage := apierrors.NewServiceUnavailable("apiserver restarting")
	// Every try of one Allocate: the GET of the pod the watch's lock names, then the retried
	// GETs of the fresh path. A failure left over delays the cleanup by its first retry.
	clienttest.Fail(&f.cs.Fake, "get", "pods", 1+f.agent.backoff.Steps, outage)
	_, err := f.call("GPU-0-0")
	if !strings.HasPrefix(message(err), ErrAPI.Error()) || !strings.Contains(message(err), "apiserver restarting") {
		t.Fatalf("Allocate error %v, want ErrAPI with the outage", err)
	}
	waitFor(t, "bind-phase failed and the lock released", func() bool {
		_, locked := f.lock(t)
		return !locked && f.pod(t, "p").Annotations[allocation.KeyBindPhase] == "failed"
	})
}

// GetPreferredAllocation steers the kubelet to replicas of the scheduler's GPUs, must-include
// ids first; with another size it answers no preference.
func TestPreferredAllocation(t *testing.T) {
	t.Parallel()
	pod := gpuPod("p", "main")
	f := newFixture(t, Options{}, pod)
	f.schedule(t, pod, allocation.PodDevices{{dev(2, 1000, 30), dev(0, 1000, 30)}})
	avail := []string{"GPU-1-0", "GPU-2-5", "GPU-0-7", "GPU-2-1", "GPU-0-2", "GPU-3-0"}
	var got [][]string
	for _, req := range []struct {
		must []string
		size int32
	}{{nil, 2}, {[]string{"GPU-0-7"}, 2}, {nil, 1}} {
		resp, err := f.kubelet.GetPreferredAllocation(f.ctx, gpuResource, avail, req.must, req.size)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, resp.GetContainerResponses()[0].GetDeviceIDs())
	}
	// Sorted replicas of the scheduler's GPUs, must-include first; another size: no preference.
	want := [][]string{{"GPU-2-1", "GPU-0-2"}, {"GPU-2-1", "GPU-0-7"}, nil}
	if d := gocmp.Diff(want, got); d != "" {
		t.Errorf("preferred (-want +got):\n%s", d)
	}
	// The kubelet's pick follows the preference.
	if ids, err := f.kubelet.PickHealthy(f.ctx, gpuResource, 2); err != nil || !slices.Equal(ids, []string{"GPU-2-0", "GPU-0-0"}) {
		t.Errorf("PickHealthy = %v, %v", ids, err)
	}
	if got := pick(allocation.ContainerDevices{dev(2, 1, 1), dev(0, 1, 1)}, &pluginapi.ContainerPreferredAllocationRequest{AvailableDeviceIDs: avail, MustIncludeDeviceIDs: []string{"GPU-0-7"}, AllocationSize: 2}); !gocmp.Equal(got, []string{"GPU-2-1", "GPU-0-7"}) {
		t.Errorf("pick with must-include = %v", got)
	}
	if got := pick(allocation.ContainerDevices{dev(4, 1, 1)}, &pluginapi.ContainerPreferredAllocationRequest{AvailableDeviceIDs: avail, AllocationSize: 1}); got != nil {
		t.Errorf("pick of a GPU without replicas = %v", got)
	}
}

func (f *fixture) patchPod(t *testing.T, annotations map[string]string) {
	t.Helper()
	if err := f.agent.patchPod(f.ctx, types.NamespacedName{Namespace: "default", Name: "p"}, annotations); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) patchNode(t *testing.T, annotations map[string]any) {
	t.Helper()
	n, err := f.cs.CoreV1().Nodes().Get(f.ctx, testNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	for k, v := range annotations {
		n.Annotations[k] = fmt.Sprint(v)
	}
	if _, err := f.cs.CoreV1().Nodes().Update(f.ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Allocate reads the lock from the register writer's watch first: wait until the watch
	// shows the change, or a test may Allocate against the lock from before it.
	deadline := time.Now().Add(10 * time.Second)
	for !f.watched(n.Annotations, annotations) {
		if time.Now().After(deadline) {
			t.Fatalf("the register writer's watch never showed %v", annotations)
		}
		time.Sleep(time.Millisecond)
	}
}

// watched reports whether the register writer's copy of the Node carries the keys of want
// with the values of set.
func (f *fixture) watched(set map[string]string, want map[string]any) bool {
	n := f.agent.writer.Node()
	if n == nil {
		return false
	}
	for k := range want {
		if n.Annotations[k] != set[k] {
			return false
		}
	}
	return true
}

// Allocate reads the node lock from the register writer's watch of the Node:
// a pod is served without one GET of the Node besides the lock's release.
func TestAllocateReadsTheLockFromTheWatch(t *testing.T) {
	t.Parallel()
	pod := gpuPod("p", "main")
	f := newFixture(t, Options{}, pod)
	f.schedule(t, pod, allocation.PodDevices{{dev(0, 1000, 30)}})
	deadline := time.Now().Add(10 * time.Second)
	for n := f.agent.writer.Node(); n == nil || n.Annotations[nodelock.Key] == ""; n = f.agent.writer.Node() {
		if time.Now().After(deadline) {
			t.Fatal("the writer's watch never showed the lock")
		}
		time.Sleep(time.Millisecond)
	}
	f.cs.ClearActions()
	if _, err := f.call("GPU-0-0"); err != nil {
		t.Fatal(err)
	}
	var verbs []string
	for _, a := range f.cs.Actions() {
		verbs = append(verbs, a.GetVerb()+" "+a.GetResource().Resource)
	}
	// The pod, its one patch (entry consumed and bind-phase success), and the lock's release.
	want := []string{"get pods", "patch pods", "get nodes", "patch nodes"}
	if d := gocmp.Diff(want, verbs); d != "" {
		t.Errorf("requests of one Allocate (-want +got):\n%s", d)
	}
	if got := f.pod(t, "p").Annotations[allocation.KeyBindPhase]; got != "success" {
		t.Errorf("bind-phase = %q", got)
	}
}

// waitFor polls cond until it holds, or fails the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
