package nodeagent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/clienttest"
	"github.com/hamireg/hamireg/hamicore"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
	"github.com/hamireg/hamireg/mig"
)

// recorder is an Allocator that records its requests and answers with answer or err.
type recorder struct {
	mu     sync.Mutex
	reqs   []ContainerRequest
	answer allocation.Response
	err    error
}

func (r *recorder) Allocate(_ context.Context, req ContainerRequest) (allocation.Response, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, req)
	return r.answer, r.err
}

func (r *recorder) requests() []ContainerRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]ContainerRequest(nil), r.reqs...)
}

// A vendor's Allocator answers for the scheduler's devices: its env, mounts, device nodes
// (default permissions rw), CDI devices and annotations reach the kubelet as they are, and
// the protocol around it is the agent's (entry consumed, bind-phase success, lock released).
func TestAllocatorAnswerReachesTheKubelet(t *testing.T) {
	t.Parallel()
	alloc := &recorder{answer: allocation.Response{
		Envs:        map[string]string{"ACME_VISIBLE_DEVICES": "0,1"},
		Mounts:      []allocation.Mount{{ContainerPath: "/opt/acme", HostPath: "/usr/local/acme", ReadOnly: true}},
		DeviceNodes: []allocation.DeviceNode{{ContainerPath: "/dev/acme0", HostPath: "/dev/acme0"}, {ContainerPath: "/dev/acmectl", HostPath: "/dev/acmectl", Permissions: "r"}},
		CDIDevices:  []string{"acme.com/npu=0", "acme.com/npu=1"},
		Annotations: map[string]string{"acme.com/devices": "0,1"},
	}}
	pod := gpuPod("p", "main")
	f := newFixture(t, Options{Allocator: alloc}, pod)
	f.schedule(t, pod, allocation.PodDevices{{dev(0, 1000, 30), dev(1, 2000, 40)}})
	got, err := f.call("GPU-1-3", "GPU-0-0")
	if err != nil {
		t.Fatal(err)
	}
	want := &pluginapi.ContainerAllocateResponse{
		Envs:   map[string]string{"ACME_VISIBLE_DEVICES": "0,1"},
		Mounts: []*pluginapi.Mount{{ContainerPath: "/opt/acme", HostPath: "/usr/local/acme", ReadOnly: true}},
		Devices: []*pluginapi.DeviceSpec{
			{ContainerPath: "/dev/acme0", HostPath: "/dev/acme0", Permissions: "rw"},
			{ContainerPath: "/dev/acmectl", HostPath: "/dev/acmectl", Permissions: "r"},
		},
		CdiDevices:  []*pluginapi.CDIDevice{{Name: "acme.com/npu=0"}, {Name: "acme.com/npu=1"}},
		Annotations: map[string]string{"acme.com/devices": "0,1"},
	}
	if d := gocmp.Diff(want, got, protocmp.Transform()); d != "" {
		t.Errorf("the kubelet's answer (-want +got):\n%s", d)
	}
	reqs := alloc.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d Allocator calls, want 1", len(reqs))
	}
	r := reqs[0]
	if r.Pod == nil || r.Pod.Name != "p" || r.Container == nil || r.Container.Name != "main" {
		t.Errorf("request for pod %v container %v", r.Pod, r.Container)
	}
	if d := gocmp.Diff(allocation.ContainerDevices{dev(0, 1000, 30), dev(1, 2000, 40)}, r.Devices); d != "" {
		t.Errorf("Devices (-want +got):\n%s", d)
	}
	if !gocmp.Equal(r.DeviceIDs, []string{"GPU-1-3", "GPU-0-0"}) || len(r.NodeDevices) != 4 {
		t.Errorf("DeviceIDs %v, %d node devices", r.DeviceIDs, len(r.NodeDevices))
	}
	if p := f.pod(t, "p"); p.Annotations[allocation.KeyBindPhase] != "success" {
		t.Errorf("bind-phase %q", p.Annotations[allocation.KeyBindPhase])
	}
	if _, locked := f.lock(t); locked {
		t.Error("lock left after the last entry")
	}
}

// An Allocator's error, or an answer the kubelet cannot use, fails the pod as every Allocate
// failure does: bind-phase failed, lock released, a Warning Event naming the Allocator; the
// entry is not consumed.
func TestAllocatorFailure(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		alloc   Allocator
		wantMsg string
	}{
		"error": {
			alloc:   &recorder{err: errors.New("npu 0 is in firmware update")},
			wantMsg: "device allocator failed: pod default/p container main: the vendor's Allocator (*nodeagent.recorder) failed for devices [GPU-0]: npu 0 is in firmware update; bind-phase set to failed and node lock released",
		},
		"CDI name not qualified": {
			alloc:   &recorder{answer: allocation.Response{CDIDevices: []string{"npu0"}}},
			wantMsg: `device allocator failed: pod default/p container main: the vendor's Allocator (*nodeagent.recorder) answered what the kubelet cannot use: CDI device "npu0" is not a fully qualified name`,
		},
		"device node without a host path": {
			alloc:   &recorder{answer: allocation.Response{DeviceNodes: []allocation.DeviceNode{{ContainerPath: "/dev/acme0"}}}},
			wantMsg: "device node {ContainerPath:/dev/acme0 HostPath: Permissions:}: both paths are needed",
		},
		"bad permissions": {
			alloc:   &recorder{answer: allocation.Response{DeviceNodes: []allocation.DeviceNode{{ContainerPath: "/dev/a", HostPath: "/dev/a", Permissions: "rwx"}}}},
			wantMsg: `permissions "rwx" are not a combination of r, w and m`,
		},
		"HAMi-core state folder": {
			alloc:   HAMiCore{Env: hamicore.EnvOptions{HookPath: "/dev/null/hook"}, PrepareStateDir: true},
			wantMsg: "host preparation failed: pod default/p container main: the vendor's Allocator (nodeagent.HAMiCore) failed for devices [GPU-0]: state folder: host preparation failed: ",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pod := gpuPod("p", "main")
			f := newFixture(t, Options{Allocator: tc.alloc}, pod)
			f.schedule(t, pod, allocation.PodDevices{{dev(0, 1000, 30)}})
			_, err := f.call("GPU-0-0")
			if err == nil || !strings.Contains(message(err), tc.wantMsg) {
				t.Fatalf("Allocate error %q, want it to contain %q", message(err), tc.wantMsg)
			}
			p := f.pod(t, "p")
			if p.Annotations[allocation.KeyBindPhase] != "failed" || p.Annotations[annotation.KeyNVIDIAToAllocate] != "GPU-0,NVIDIA,1000,30:;" {
				t.Errorf("pod annotations %v, want bind-phase failed and the entry kept", p.Annotations)
			}
			if _, locked := f.lock(t); locked {
				t.Error("lock not released")
			}
			if e := f.event(t); !strings.HasPrefix(e, "Warning "+EventReasonAllocateFailed+" ") || !strings.Contains(e, "Allocator") {
				t.Errorf("Event %q", e)
			}
			if s := f.agent.Stats(); s.AllocateFailures != 1 || s.Allocations != 0 {
				t.Errorf("Stats %+v", s)
			}
		})
	}
}

// The errors of an Allocator are classed: ErrHost for HAMi-core's state folder, ErrAllocator
// for the rest; both unwrap to the cause.
func TestAllocatorErrorKinds(t *testing.T) {
	t.Parallel()
	a := &Agent{alloc: HAMiCore{Env: hamicore.EnvOptions{HookPath: "/dev/null/hook"}, PrepareStateDir: true}}
	req := ContainerRequest{Pod: gpuPod("p", "main"), Container: &corev1.Container{Name: "main"}, Devices: allocation.ContainerDevices{dev(0, 1, 1)}, NodeDevices: testGPUs()}
	_, e := a.answer(t.Context(), req)
	if e == nil || !errors.Is(e, ErrHost) || errors.Is(e, ErrAllocator) {
		t.Errorf("state folder failure %v, want ErrHost", e)
	}
	cause := errors.New("boom")
	a.alloc = AllocatorFunc(func(context.Context, ContainerRequest) (allocation.Response, error) {
		return allocation.Response{}, cause
	})
	if _, e := a.answer(t.Context(), req); e == nil || !errors.Is(e, ErrAllocator) || !errors.Is(e, cause) {
		t.Errorf("Allocator failure %v, want ErrAllocator wrapping the cause", e)
	}
}

// HAMiCore with PrepareStateDir recreates the container's state folder, empty, mode 0777.
func TestHAMiCorePreparesTheStateFolder(t *testing.T) {
	t.Parallel()
	hook := t.TempDir()
	dir := filepath.Join(hook, "vgpu", "containers", "uid-p_main")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stale"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	pod := gpuPod("p", "main")
	r, err := HAMiCore{Env: hamicore.EnvOptions{HookPath: hook}, PrepareStateDir: true}.Allocate(t.Context(), ContainerRequest{
		Pod: pod, Container: &pod.Spec.Containers[0], Devices: allocation.ContainerDevices{dev(0, 1000, 30)}, NodeDevices: testGPUs(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.StateDir != dir || r.Envs["NVIDIA_VISIBLE_DEVICES"] != "GPU-0" {
		t.Errorf("StateDir %q, env %v", r.StateDir, r.Envs)
	}
	info, err := os.Stat(dir)
	if err != nil || info.Mode().Perm() != 0o777 {
		t.Fatalf("state folder %v, %v; want mode 0777", info, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("state folder not emptied: %v", entries)
	}
	if _, err := (HAMiCore{}).Allocate(t.Context(), ContainerRequest{Devices: allocation.ContainerDevices{dev(0, 1, 1)}}); err == nil || !strings.Contains(err.Error(), "set Options.Allocator") {
		t.Errorf("HAMiCore without a pod = %v", err)
	}
}

// For a GPU in mig mode HAMiCore answers the realised MIG devices alone, as HAMi's plugin
// does: no HAMi-core limit, mount or preload, and no state folder even with PrepareStateDir.
// Without the realised instances it refuses (the GPU's UUID would hand out the whole GPU), and
// an answer gRPC cannot carry (not UTF-8) is refused by the agent.
func TestHAMiCoreMIGMode(t *testing.T) {
	t.Parallel()
	hook := t.TempDir()
	gpus := testGPUs()
	for i := range gpus {
		gpus[i].Mode = allocation.ModeMIG
	}
	pod := gpuPod("p", "main")
	h := HAMiCore{Env: hamicore.EnvOptions{HookPath: hook}, PrepareStateDir: true}
	req := ContainerRequest{Pod: pod, Container: &pod.Spec.Containers[0], Devices: allocation.ContainerDevices{dev(0, 1000, 30)}, NodeDevices: gpus}
	if _, err := h.Allocate(t.Context(), req); err == nil || !strings.Contains(err.Error(), "Options.MIG") {
		t.Errorf("MIG GPU without its instance = %v, want a refusal naming Options.MIG", err)
	}
	req.MIG = []mig.Instance{{GPUUUID: "GPU-0", Profile: "1g.5gb", Runtime: mig.Runtime{MigUUID: "MIG-0"}}}
	r, err := h.Allocate(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if diff := gocmp.Diff(allocation.Response{Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": "MIG-0"}}, r); diff != "" {
		t.Errorf("answer (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(filepath.Join(hook, "vgpu")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state folder made for a MIG GPU: %v", err)
	}
	a := &Agent{alloc: AllocatorFunc(func(context.Context, ContainerRequest) (allocation.Response, error) {
		return allocation.Response{Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-\xff"}}, nil
	})}
	if _, e := a.answer(t.Context(), req); e == nil || !errors.Is(e, ErrAllocator) || !strings.Contains(e.Error(), "UTF-8") {
		t.Errorf("answer with invalid UTF-8 = %v, want ErrAllocator naming UTF-8", e)
	}
}

// acmeSource is a vendor's Source that is also its Allocator: one device node per device.
type acmeSource struct{ recorder }

func (*acmeSource) Devices(context.Context) ([]annotation.Device, []error, error) {
	return []annotation.Device{{ID: "npu-0", Count: 2, Health: true}, {ID: "npu-1", Count: 2, Health: true}}, nil, nil
}
func (*acmeSource) Changed() <-chan struct{} { return nil }

// A vendor without a to-allocate annotation (HAMi's scheduler writes no pod device list for
// it) is served from the kubelet's replica IDs: no pod is read or written, no preference is
// advertised, and a Source that implements Allocator is the default Allocator.
func TestVendorWithoutToAllocateKey(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	vendor := annotation.Vendor{Name: "acme", RegisterKey: "hami.io/node-acme-register", ResourceName: "acme.com/npu", Format: annotation.FormatJSON}
	src := &acmeSource{recorder{answer: allocation.Response{DeviceNodes: []allocation.DeviceNode{{ContainerPath: "/dev/acme0", HostPath: "/dev/acme0"}}}}}
	cs := clienttest.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}})
	f := &fixture{cs: cs, ctx: ctx, resource: vendor.ResourceName}
	f.kubelet, f.agent = runAgent(t, cs, src, Options{Vendor: vendor})

	if p, _ := f.kubelet.State().Resource("acme.com/npu"); p.Options.GetGetPreferredAllocationAvailable() {
		t.Error("GetPreferredAllocation advertised without a pod device list")
	}
	ids, err := f.kubelet.PickHealthy(ctx, "acme.com/npu", 2)
	if err != nil {
		t.Fatal(err)
	}
	cs.ClearActions()
	got, err := f.call(ids...)
	if err != nil {
		t.Fatal(err)
	}
	if d := gocmp.Diff([]*pluginapi.DeviceSpec{{ContainerPath: "/dev/acme0", HostPath: "/dev/acme0", Permissions: "rw"}}, got.GetDevices(), protocmp.Transform()); d != "" {
		t.Errorf("device nodes (-want +got):\n%s", d)
	}
	reqs := src.requests()
	if len(reqs) != 1 || reqs[0].Pod != nil || reqs[0].Container != nil {
		t.Fatalf("Allocator requests %+v, want one without a pod", reqs)
	}
	wantDevs := allocation.ContainerDevices{{UUID: "npu-0", Type: "acme"}, {UUID: "npu-0", Type: "acme"}}
	if d := gocmp.Diff(wantDevs, reqs[0].Devices); d != "" || !gocmp.Equal(reqs[0].DeviceIDs, []string{"npu-0-0", "npu-0-1"}) {
		t.Errorf("Devices (-want +got):\n%s; ids %v", d, reqs[0].DeviceIDs)
	}
	for _, a := range cs.Actions() {
		if a.GetResource().Resource == "pods" {
			t.Errorf("request %s %s without a pod protocol", a.GetVerb(), a.GetResource().Resource)
		}
	}
	_, err = f.call("npu-7-0")
	if !strings.HasPrefix(message(err), ErrMalformed.Error()) || !strings.Contains(message(err), `replica "npu-7-0"`) {
		t.Errorf("Allocate of an unknown replica = %v", err)
	}
	if s := f.agent.Stats(); s.Allocations != 1 || s.AllocateFailures != 1 || s.PodsCompleted != 0 {
		t.Errorf("Stats %+v", s)
	}
}

// runAgent runs an agent for src against cs and a fake kubelet until the test ends, and
// returns once it registered.
func runAgent(t *testing.T, cs *fake.Clientset, src Source, opts Options) (*kubelettest.Kubelet, *Agent) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	k := kubelettest.Start(t)
	opts.EventRecorder, opts.Kubelet.PluginDir, opts.Period = record.NewFakeRecorder(100), k.Dir(), time.Hour
	a, err := New(cs, testNode, src, opts)
	if err != nil {
		t.Fatal(err)
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
	waitCtx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	if _, err := k.WaitFor(waitCtx, func(s kubelettest.State) bool {
		p, ok := s.Resource(a.vendor.ResourceName)
		return ok && p.Messages > 0
	}); err != nil {
		t.Fatalf("the agent did not register: %v", err)
	}
	return k, a
}

// The cleanup loop finishes the protocol for a pod whose Allocate failed while the API server
// was away: it retries after 1 s, doubling up to the period, and stops once it succeeds. The
// loop runs alone in a synctest bubble (no gRPC: real sockets do not run in a bubble), so its
// timers are the bubble's fake time.
func TestCleanupLoopRetries(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		pod := gpuPod("p", "main")
		cs := clienttest.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}}, pod)
		allocationtest.Schedule(t, cs, pod, testNode, allocation.PodDevices{{dev(0, 1000, 30)}}, allocationtest.Options{})
		a, err := New(cs, testNode, staticSource(testGPUs()), Options{Period: 5 * time.Second, EventRecorder: &record.FakeRecorder{}, Kubelet: kubeletplugin.Options{PluginDir: t.TempDir()}})
		if err != nil {
			t.Fatal(err)
		}
		a.backoff = wait.Backoff{Duration: time.Millisecond, Steps: 1}
		var (
			down   atomic.Bool
			tries  atomic.Int32
			mu     sync.Mutex
			failed []time.Duration // when the GETs during the outage came, from the failure
		)
		down.Store(true)
		start := time.Now()
		cs.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
			tries.Add(1)
			if down.Load() {
				mu.Lock()
				failed = append(failed, time.Since(start))
				mu.Unlock()
				return true, nil, apierrors.NewServiceUnavailable("apiserver restarting")
			}
			return false, nil, nil
		})
		loopCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); a.cleanupLoop(loopCtx) }()

		a.needCleanup(start, types.NamespacedName{})
		time.Sleep(12*time.Second + time.Millisecond)
		synctest.Wait()
		mu.Lock()
		// At once, then after 1, 2 and 4 s, then every period (5 s).
		want := []time.Duration{0, time.Second, 3 * time.Second, 7 * time.Second, 12 * time.Second}
		if d := gocmp.Diff(want, failed); d != "" {
			t.Errorf("tries during the outage (-want +got):\n%s", d)
		}
		mu.Unlock()
		down.Store(false)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		p, err := cs.CoreV1().Pods("default").Get(ctx, "p", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n, _ := cs.CoreV1().Nodes().Get(ctx, testNode, metav1.GetOptions{})
		if p.Annotations[allocation.KeyBindPhase] != "failed" || n.Annotations[annotation.KeyNodeLock] != "" {
			t.Errorf("after the outage: bind-phase %q, lock %q; want failed and none", p.Annotations[allocation.KeyBindPhase], n.Annotations[annotation.KeyNodeLock])
		}
		settledTries := tries.Load()
		time.Sleep(time.Minute)
		synctest.Wait()
		if tries.Load() != settledTries {
			t.Errorf("the loop kept trying after it succeeded: %d more GETs", tries.Load()-settledTries)
		}
		cancel()
		<-done
	})
}

// timedSource fails its first fails scans and records when each scan came.
type timedSource struct {
	mu    sync.Mutex
	start time.Time
	fails int
	at    []time.Duration
}

func (s *timedSource) Devices(context.Context) ([]annotation.Device, []error, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.at = append(s.at, time.Since(s.start))
	if len(s.at) <= s.fails {
		return nil, nil, errors.New("management library not loaded yet")
	}
	return testGPUs(), nil, nil
}
func (*timedSource) Changed() <-chan struct{} { return nil }

// A failed scan is retried after 1 s, doubling up to the period; after a good scan the source
// is rescanned every period. The scan loop runs alone in a synctest bubble.
func TestScanLoopRetries(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		src := &timedSource{start: time.Now(), fails: 5}
		cs := clienttest.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}})
		rec := record.NewFakeRecorder(100)
		a, err := New(cs, testNode, src, Options{Period: 5 * time.Second, EventRecorder: rec, Kubelet: kubeletplugin.Options{PluginDir: t.TempDir()}})
		if err != nil {
			t.Fatal(err)
		}
		loopCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); a.scanLoop(loopCtx) }()
		time.Sleep(22*time.Second + time.Millisecond)
		synctest.Wait()
		cancel()
		<-done
		// Failures at 0, 1, 3, 7, 12 (waits 1, 2, 4, 5 s), the good scan at 17, the next at 22.
		want := []time.Duration{0, time.Second, 3 * time.Second, 7 * time.Second, 12 * time.Second, 17 * time.Second, 22 * time.Second}
		src.mu.Lock()
		defer src.mu.Unlock()
		if d := gocmp.Diff(want, src.at); d != "" {
			t.Errorf("scans (-want +got):\n%s", d)
		}
		if s := a.Stats(); s.ScanFailures != 5 || s.Scans != 2 {
			t.Errorf("Stats %+v", s)
		}
		if len(rec.Events) != 5 {
			t.Errorf("%d Events, want one per failed scan", len(rec.Events))
		}
	})
}

// With the CDI device list strategies HAMiCore's answer reaches the kubelet as CDI devices
// (ContainerAllocateResponse.CdiDevices) and as HAMi's CDI annotation, beside HAMi-core's
// limits, and without NVIDIA_VISIBLE_DEVICES.
func TestHAMiCoreCDIThroughTheKubelet(t *testing.T) {
	t.Parallel()
	pod := gpuPod("p", "main")
	f := newFixture(t, Options{Allocator: HAMiCore{Env: hamicore.EnvOptions{DeviceListStrategy: "cdi-annotations,cdi-cri"}}}, pod)
	f.schedule(t, pod, allocation.PodDevices{{dev(0, 1000, 30)}})
	r, err := f.call("GPU-0-0")
	if err != nil {
		t.Fatal(message(err))
	}
	const name = hamicore.DefaultCDIKind + "=GPU-0"
	if len(r.CdiDevices) != 1 || r.CdiDevices[0].Name != name {
		t.Errorf("CdiDevices %v, want %s", r.CdiDevices, name)
	}
	if len(r.Annotations) != 1 {
		t.Fatalf("annotations %v, want one CDI annotation", r.Annotations)
	}
	for k, v := range r.Annotations {
		if !strings.HasPrefix(k, hamicore.DefaultCDIAnnotationPrefix+hamicore.CDIAnnotationPlugin+"_") || v != name {
			t.Errorf("annotation %s=%s", k, v)
		}
	}
	if _, ok := r.Envs["NVIDIA_VISIBLE_DEVICES"]; ok || r.Envs["CUDA_DEVICE_MEMORY_LIMIT_0"] != "1000m" {
		t.Errorf("env %v, want HAMi-core's limits without NVIDIA_VISIBLE_DEVICES", r.Envs)
	}
}
