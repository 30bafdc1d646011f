package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/clienttest"
	"github.com/hamireg/hamireg/hamicore"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
	"github.com/hamireg/hamireg/mig"
)

// migGPU0 and migGPU1 are the MIG fixture's GPUs, in MIG mode; GPU-plain is a hami-core GPU.
const (
	migGPU0 = "GPU-mig-0"
	migGPU1 = "GPU-mig-1"
)

func migDevices() []annotation.Device {
	devs := []annotation.Device{
		{ID: migGPU0, Index: 0, Count: 7, Devmem: 40960, Devcore: 100, Type: "NVIDIA-NVIDIA A100-SXM4-40GB", Mode: "mig", Health: true},
		{ID: migGPU1, Index: 1, Count: 7, Devmem: 40960, Devcore: 100, Type: "NVIDIA-NVIDIA A100-SXM4-40GB", Mode: "mig", Health: true},
		{ID: "GPU-plain", Index: 2, Count: 10, Devmem: 40960, Devcore: 100, Type: "NVIDIA-A100", Mode: "hami-core", Health: true},
	}
	return devs
}

// newMIGFixture is newFixture on migDevices, with the agent's MIG manager fm (nil: none). The
// release loop's period is an hour: tests call reconcileMIG themselves.
func newMIGFixture(t *testing.T, fm *fakeMIG, opts Options, objs ...runtime.Object) *fixture {
	t.Helper()
	all := append([]runtime.Object{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}}}, objs...)
	return startMIGAgent(t, testNode, migDevices(), fm, opts, all...)
}

// startMIGAgent runs an agent of node on devs with the MIG manager fm (nil: none) against a
// clientset holding objs, and returns once it registered with the fake kubelet.
func startMIGAgent(t *testing.T, node string, devs []annotation.Device, fm *fakeMIG, opts Options, objs ...runtime.Object) *fixture {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	cs := clienttest.NewClientset(objs...)
	k := kubelettest.Start(t)
	rec := record.NewFakeRecorder(100)
	opts.EventRecorder, opts.Kubelet.PluginDir = rec, k.Dir()
	opts.Period = time.Hour
	opts.MIGReconcilePeriod = time.Hour
	if fm != nil {
		opts.MIG = fm
	}
	a, err := New(cs, node, staticSource(devs), opts)
	if err != nil {
		t.Fatal(err)
	}
	a.backoff = wait.Backoff{Duration: time.Millisecond, Factor: 1, Steps: 2}
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

// podsCaughtUp waits until the agent's pod informer holds every pod of the node as the fake
// clientset has it (resourceVersion, phase, annotations): a test that changes pods and then
// has the agent read its cache waits for the watch first, as the agent's next period would.
func podsCaughtUp(t *testing.T, a *Agent) {
	t.Helper()
	cs := a.client.(*fake.Clientset)
	waitFor(t, "the pod informer", func() bool {
		list, err := cs.CoreV1().Pods("").List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range list.Items {
			if p.Spec.NodeName != a.node {
				continue
			}
			obj, ok, err := a.pods.informer.GetStore().GetByKey(p.Namespace + "/" + p.Name)
			if err != nil || !ok {
				return false
			}
			c := obj.(*corev1.Pod)
			if c.ResourceVersion != p.ResourceVersion || c.Status.Phase != p.Status.Phase || !maps.Equal(c.Annotations, p.Annotations) {
				return false
			}
		}
		return true
	})
}

// startPods runs the pod informer of an agent that is not run, until the test ends, and
// waits for its sync.
func startPods(t *testing.T, a *Agent) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); a.pods.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	if !a.pods.waitSynced(ctx) {
		t.Fatal("the pod informer did not sync")
	}
}

// migPod is a pod with one GPU container per reservation list, reserved as given.
func migPod(name string, phase corev1.PodPhase, allocs ...mig.Allocation) *corev1.Pod {
	n := 0
	for _, al := range allocs {
		n = max(n, al.ContainerIndex+1)
	}
	ctrs := make([]string, max(n, 1))
	for i := range ctrs {
		ctrs[i] = fmt.Sprintf("c%d", i)
	}
	pod := gpuPod(name, ctrs...)
	pod.Spec.NodeName = testNode
	pod.Status.Phase = phase
	pod.Annotations = map[string]string{}
	if len(allocs) > 0 {
		pod.Annotations[mig.KeyAllocations] = mig.EncodeAllocations(allocs)
	}
	return pod
}

// res is a reservation.
func res(ctr, dev int, gpu, profile string, start, size uint32) mig.Allocation {
	return mig.Allocation{ContainerIndex: ctr, DeviceIndex: dev, GPUUUID: gpu, Profile: profile, Placement: mig.Placement{Start: start, Size: size}}
}

// withRuntime is al realised as inst.
func withRuntime(al mig.Allocation, inst mig.Instance) mig.Allocation {
	rt := inst.Runtime
	al.Runtime = &rt
	return al
}

func migDev(gpu string, mem, cores int32) allocation.ContainerDevice {
	return allocation.ContainerDevice{UUID: gpu, Type: "NVIDIA", Usedmem: mem, Usedcores: cores}
}

func (f *fixture) reservations(t *testing.T, name string) []mig.Allocation {
	t.Helper()
	allocs, err := mig.DecodeAllocations(f.pod(t, name).Annotations[mig.KeyAllocations])
	if err != nil {
		t.Fatal(err)
	}
	return allocs
}

// TestMIGAllocate: each reservation of the container is created at its placement, in
// deviceIndex order; the container gets the MIG UUIDs alone; the runtime identity lands in
// the reservation annotation; the pod completes.
func TestMIGAllocate(t *testing.T) {
	t.Parallel()
	fm := newFakeMIG(migGPU0, migGPU1)
	allocs := []mig.Allocation{res(0, 0, migGPU0, "1g.5gb", 6, 1), res(0, 1, migGPU0, "2g.10gb", 0, 2)}
	pod := migPod("p", corev1.PodPending, allocs...)
	f := newMIGFixture(t, fm, Options{}, pod)
	f.schedule(t, pod, allocation.PodDevices{{migDev(migGPU0, 4864, 15), migDev(migGPU0, 9856, 29)}})

	r, err := f.call(migGPU0+"-0", migGPU0+"-1")
	if err != nil {
		t.Fatal(err)
	}
	st := fm.state()
	if len(st) != 2 {
		t.Fatalf("instances %+v, want 2", st)
	}
	want := map[string]string{"NVIDIA_VISIBLE_DEVICES": st[0].MigUUID + "," + st[1].MigUUID}
	if diff := gocmp.Diff(want, r.Envs); diff != "" {
		t.Errorf("envs (-want +got):\n%s", diff)
	}
	if len(r.Mounts) != 0 || len(r.Devices) != 0 {
		t.Errorf("mounts %v devices %v, want none on MIG", r.Mounts, r.Devices)
	}
	wantAllocs := []mig.Allocation{withRuntime(allocs[0], st[0]), withRuntime(allocs[1], st[1])}
	if diff := gocmp.Diff(wantAllocs, f.reservations(t, "p")); diff != "" {
		t.Errorf("reservations (-want +got):\n%s", diff)
	}
	if got := f.pod(t, "p").Annotations[allocation.KeyBindPhase]; got != string(allocation.PhaseSuccess) {
		t.Errorf("bind-phase %q, want success", got)
	}
	if _, locked := f.lock(t); locked {
		t.Error("node lock left")
	}
	// The release keeps what a live pod owns.
	podsCaughtUp(t, f.agent)
	if err := f.agent.reconcileMIG(f.ctx); err != nil {
		t.Fatal(err)
	}
	if got := fm.state(); len(got) != 2 {
		t.Errorf("after release: %+v, want both kept", got)
	}
}

// TestMIGAllocateReusesRealised: a reservation that records the identity of an instance that
// exists (a retried Allocate, an agent restarted) is served with that instance, not a new one.
func TestMIGAllocateReusesRealised(t *testing.T) {
	t.Parallel()
	fm := newFakeMIG(migGPU0, migGPU1)
	al := res(0, 0, migGPU1, "3g.20gb", 4, 4)
	inst := fm.add(migGPU1, "3g.20gb", al.Placement, 4)
	pod := migPod("p", corev1.PodPending, withRuntime(al, inst))
	f := newMIGFixture(t, fm, Options{}, pod)
	f.schedule(t, pod, allocation.PodDevices{{migDev(migGPU1, 19968, 43)}})
	r, err := f.call(migGPU1 + "-3")
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Envs["NVIDIA_VISIBLE_DEVICES"]; got != inst.MigUUID {
		t.Errorf("NVIDIA_VISIBLE_DEVICES %q, want the realised %s", got, inst.MigUUID)
	}
	for _, c := range fm.calls {
		if strings.HasPrefix(c, "Create") || strings.HasPrefix(c, "Destroy") {
			t.Errorf("MIG call %q, want none", c)
		}
	}
}

// TestMIGAllocateOwnership: an instance overlapping the reserved placement is destroyed when
// no live reservation owns it (a finished pod's, one made by hand) and a fresh one created; an
// instance another live pod's reservation owns fails the pod with ErrPlacementTaken and stays.
func TestMIGAllocateOwnership(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		ownerPhase corev1.PodPhase // "" no owner pod
		wantTaken  bool
	}{
		"finished pod's instance": {ownerPhase: corev1.PodSucceeded},
		"failed pod's instance":   {ownerPhase: corev1.PodFailed},
		"nobody's instance":       {},
		"running pod's instance":  {ownerPhase: corev1.PodRunning, wantTaken: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fm := newFakeMIG(migGPU0, migGPU1)
			old := fm.add(migGPU0, "1g.5gb", mig.Placement{Start: 6, Size: 1}, 1)
			objs := []runtime.Object{}
			if tc.ownerPhase != "" {
				objs = append(objs, migPod("old", tc.ownerPhase, withRuntime(res(0, 0, migGPU0, "1g.5gb", 6, 1), old)))
			}
			pod := migPod("p", corev1.PodPending, res(0, 0, migGPU0, "1g.5gb", 6, 1))
			f := newMIGFixture(t, fm, Options{}, append(objs, pod)...)
			f.schedule(t, pod, allocation.PodDevices{{migDev(migGPU0, 4864, 15)}})
			r, err := f.call(migGPU0 + "-0")
			st := fm.state()
			if tc.wantTaken {
				if err == nil || !strings.Contains(message(err), ErrPlacementTaken.Error()) || !strings.Contains(message(err), "pod default/old") {
					t.Fatalf("err %v, want placement taken by pod default/old", err)
				}
				if diff := gocmp.Diff([]mig.Instance{old}, st); diff != "" {
					t.Errorf("instances (-want +got):\n%s", diff)
				}
				if got := f.pod(t, "p").Annotations[allocation.KeyBindPhase]; got != string(allocation.PhaseFailed) {
					t.Errorf("bind-phase %q, want failed", got)
				}
				if ev := f.event(t); !strings.Contains(ev, EventReasonAllocateFailed) || !strings.Contains(ev, "MIG placement taken") {
					t.Errorf("event %q", ev)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(st) != 1 || st[0].MigUUID == old.MigUUID || st[0].Placement != old.Placement {
				t.Fatalf("instances %+v, want one new instance at {6,1} instead of %s", st, old.MigUUID)
			}
			if got := r.Envs["NVIDIA_VISIBLE_DEVICES"]; got != st[0].MigUUID {
				t.Errorf("NVIDIA_VISIBLE_DEVICES %q, want the new %s", got, st[0].MigUUID)
			}
		})
	}
}

// TestMIGAllocateFailures: every failure follows the protocol (bind-phase failed, lock
// released, an Event) and destroys the instances the call created.
func TestMIGAllocateFailures(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		allocs   []mig.Allocation
		rawAlloc string // instead of allocs
		entry    allocation.ContainerDevices
		noMIG    bool
		version  annotation.Version
		mutate   func(*fakeMIG)
		wantKind error
		wantMsg  string
	}{
		"no reservation": {
			entry: allocation.ContainerDevices{migDev(migGPU0, 4864, 15)}, wantKind: ErrMIG,
			wantMsg: "container c0 has 0 MIG reservations, requested 1 devices",
		},
		"too few reservations": {
			allocs: []mig.Allocation{res(0, 0, migGPU0, "1g.5gb", 6, 1)},
			entry:  allocation.ContainerDevices{migDev(migGPU0, 4864, 15), migDev(migGPU0, 4864, 15)}, wantKind: ErrMIG,
			wantMsg: "container c0 has 1 MIG reservations, requested 2 devices",
		},
		"reservation on another GPU": {
			allocs: []mig.Allocation{res(0, 0, migGPU1, "1g.5gb", 6, 1)},
			entry:  allocation.ContainerDevices{migDev(migGPU0, 4864, 15)}, wantKind: ErrMIG, wantMsg: "names GPU " + migGPU1,
		},
		"malformed reservation": {
			rawAlloc: `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-mig-0","profile":"1g.5gb","placement":{"start":6,"size":1},"migUUID":"MIG-x"}]`,
			entry:    allocation.ContainerDevices{migDev(migGPU0, 4864, 15)}, wantKind: ErrMalformed, wantMsg: mig.KeyAllocations,
		},
		"no MIG manager": {
			allocs: []mig.Allocation{res(0, 0, migGPU0, "1g.5gb", 6, 1)},
			entry:  allocation.ContainerDevices{migDev(migGPU0, 4864, 15)}, noMIG: true, wantKind: ErrMIG, wantMsg: "Options.MIG",
		},
		"NVML refuses the second device": {
			allocs: []mig.Allocation{res(0, 0, migGPU0, "1g.5gb", 6, 1), res(0, 1, migGPU0, "2g.10gb", 1, 2)},
			entry:  allocation.ContainerDevices{migDev(migGPU0, 4864, 15), migDev(migGPU0, 9856, 29)}, wantKind: ErrMIG,
			wantMsg: "invalid placement {Start:1 Size:2}",
		},
		"MIG mode pending a reset": {
			allocs: []mig.Allocation{res(0, 0, migGPU0, "1g.5gb", 6, 1)},
			entry:  allocation.ContainerDevices{migDev(migGPU0, 4864, 15)},
			mutate: func(fm *fakeMIG) { fm.gpus[0].modeCurrent = 0 }, wantKind: ErrMIG, wantMsg: "GPU reset required",
		},
		"mixed modes": {
			allocs: []mig.Allocation{res(0, 0, migGPU0, "1g.5gb", 6, 1)},
			entry:  allocation.ContainerDevices{migDev(migGPU0, 4864, 15), migDev("GPU-plain", 1000, 10)}, wantKind: ErrMIG,
			wantMsg: hamicore.ErrMixedModes.Error(),
		},
		"v2.9.0 geometry entry": {
			entry: allocation.ContainerDevices{migDev(migGPU0+"[0-2]", 5120, 14)}, version: annotation.VersionV290, wantKind: ErrMIG,
			wantMsg: "HAMi master's dynamic MIG",
		},
		"v2.9.0 plain entry on a MIG GPU": {
			entry: allocation.ContainerDevices{migDev(migGPU0, 4000, 0)}, version: annotation.VersionV290, wantKind: ErrMIG,
			wantMsg: "HAMi master's dynamic MIG",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fm := newFakeMIG(migGPU0, migGPU1)
			if tc.mutate != nil {
				tc.mutate(fm)
			}
			pod := migPod("p", corev1.PodPending, tc.allocs...)
			if tc.rawAlloc != "" {
				pod.Annotations[mig.KeyAllocations] = tc.rawAlloc
			}
			var m *fakeMIG
			if !tc.noMIG {
				m = fm
			}
			f := newMIGFixture(t, m, Options{Version: tc.version}, pod)
			allocationtest.Schedule(t, f.cs, pod, testNode, allocation.PodDevices{tc.entry}, allocationtest.Options{Version: tc.version})
			ids := make([]string, len(tc.entry))
			for i, d := range tc.entry {
				ids[i] = d.GPU() + fmt.Sprintf("-%d", i)
			}
			_, err := f.call(ids...)
			if err == nil {
				t.Fatal("Allocate succeeded")
			}
			msg := message(err)
			if !strings.Contains(msg, tc.wantKind.Error()) || !strings.Contains(msg, tc.wantMsg) {
				t.Errorf("error %q, want %q and %q", msg, tc.wantKind, tc.wantMsg)
			}
			if !strings.Contains(msg, "bind-phase set to failed and node lock released") {
				t.Errorf("error %q does not say the protocol was finished", msg)
			}
			if got := f.pod(t, "p").Annotations[allocation.KeyBindPhase]; got != string(allocation.PhaseFailed) {
				t.Errorf("bind-phase %q, want failed", got)
			}
			if ev := f.event(t); !strings.Contains(ev, tc.wantMsg) {
				t.Errorf("event %q does not name the cause %q", ev, tc.wantMsg)
			}
			if st := fm.state(); len(st) != 0 {
				t.Errorf("instances left: %+v", st)
			}
		})
	}
}

// TestMIGRecordConflict: the reservation patch carries the pod's resourceVersion; when the pod
// changed in between (409), the agent reads it again and records the identity into the fresh
// value, keeping what the other writer wrote.
func TestMIGRecordConflict(t *testing.T) {
	t.Parallel()
	fm := newFakeMIG(migGPU0, migGPU1)
	pod := migPod("p", corev1.PodPending, res(0, 0, migGPU0, "2g.10gb", 2, 2))
	f := newMIGFixture(t, fm, Options{}, pod)
	f.schedule(t, pod, allocation.PodDevices{{migDev(migGPU0, 9856, 29)}})
	var bumped atomic.Bool
	var bodies []string
	f.cs.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		body := string(a.(k8stesting.PatchAction).GetPatch())
		if !strings.Contains(body, "vgpu-mig-allocations") {
			return false, nil, nil
		}
		bodies = append(bodies, body)
		if bumped.CompareAndSwap(false, true) { // another writer gets in first (through the tracker: the clientset is locked here)
			gvr := corev1.SchemeGroupVersion.WithResource("pods")
			obj, err := f.cs.Tracker().Get(gvr, "default", "p")
			if err != nil {
				t.Error(err)
				return false, nil, nil
			}
			p := obj.(*corev1.Pod).DeepCopy()
			p.Annotations["other"] = "x"
			p.ResourceVersion = clienttest.NextResourceVersion()
			if err := f.cs.Tracker().Update(gvr, p, "default"); err != nil {
				t.Error(err)
			}
		}
		return false, nil, nil
	})
	podsCaughtUp(t, f.agent)
	if _, err := f.call(migGPU0 + "-0"); err != nil {
		t.Fatal(err)
	}
	if len(bodies) != 2 || bodies[0] == bodies[1] {
		t.Errorf("reservation patches %q, want a retry with the fresh resourceVersion", bodies)
	}
	got := f.pod(t, "p")
	if got.Annotations["other"] != "x" || f.reservations(t, "p")[0].Runtime == nil {
		t.Errorf("annotations %v, want the other writer's and the runtime identity", got.Annotations)
	}
}

// TestMIGReconcile: the release destroys the instances on the node's MIG GPUs that no live
// reservation owns, keeps (adopts) those a live reservation names by runtime identity and
// those at the exact placement of a live reservation without one yet, skips reservations
// naming GPUs the node does not have, and leaves GPUs in another mode alone.
func TestMIGReconcile(t *testing.T) {
	t.Parallel()
	fm := newFakeMIG(migGPU0, migGPU1, "GPU-plain")
	running := fm.add(migGPU0, "2g.10gb", mig.Placement{Start: 0, Size: 2}, 1)
	finished := fm.add(migGPU0, "1g.5gb", mig.Placement{Start: 6, Size: 1}, 2)
	orphan := fm.add(migGPU1, "3g.20gb", mig.Placement{Start: 0, Size: 4}, 1)
	pending := fm.add(migGPU1, "1g.5gb", mig.Placement{Start: 6, Size: 1}, 2)
	plain := fm.add("GPU-plain", "1g.5gb", mig.Placement{Start: 0, Size: 1}, 1)
	f := newMIGFixture(t, fm, Options{},
		migPod("running", corev1.PodRunning, withRuntime(res(0, 0, migGPU0, "2g.10gb", 0, 2), running), res(1, 0, "GPU-gone", "1g.5gb", 0, 1)),
		migPod("finished", corev1.PodSucceeded, withRuntime(res(0, 0, migGPU0, "1g.5gb", 6, 1), finished)),
		migPod("pending", corev1.PodPending, res(0, 0, migGPU1, "1g.5gb", 6, 1)),
	)
	podsCaughtUp(t, f.agent)
	if err := f.agent.reconcileMIG(f.ctx); err != nil {
		t.Fatal(err)
	}
	want := []mig.Instance{running, pending, plain}
	if diff := gocmp.Diff(want, fm.state()); diff != "" {
		t.Errorf("instances (-want +got):\n%s", diff)
	}
	_ = orphan
	// An undecodable live reservation stops the release: what it owns is unknown.
	fm.add(migGPU1, "3g.20gb", mig.Placement{Start: 0, Size: 4}, 3)
	if _, err := f.cs.CoreV1().Pods("default").Create(f.ctx, func() *corev1.Pod {
		p := migPod("bad", corev1.PodRunning)
		p.Annotations[mig.KeyAllocations] = "{"
		return p
	}(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	podsCaughtUp(t, f.agent)
	if err := f.agent.reconcileMIG(f.ctx); err == nil || !strings.Contains(err.Error(), "default/bad") {
		t.Errorf("reconcile = %v, want the undecodable pod named", err)
	}
	if got := len(fm.state()); got != 4 {
		t.Errorf("%d instances, want 4 (nothing released)", got)
	}
}

// TestMIGOptions: a negative release period is refused.
func TestMIGOptions(t *testing.T) {
	t.Parallel()
	_, err := New(clienttest.NewClientset(), testNode, staticSource(migDevices()), Options{MIG: newFakeMIG(), MIGReconcilePeriod: -time.Second})
	if !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("New = %v, want ErrInvalidOptions", err)
	}
}

// TestMIGOwnedByDRA: a MIG GPU the DRA world owns is cordoned for HAMi's extender and left
// out of the kubelet's devices, the release leaves its instances (the DRA world's claims')
// alone, and the DRA world gets the agent's MIG realiser through its host.
func TestMIGOwnedByDRA(t *testing.T) {
	t.Parallel()
	fm := newFakeMIG(migGPU0, migGPU1, "GPU-plain")
	world := &fakeDRA{gpus: []string{migGPU1}}
	f := newMIGFixture(t, fm, Options{DRA: world})
	orphan := fm.add(migGPU0, "1g.5gb", mig.Placement{Start: 6, Size: 1}, 1)
	claimed := fm.add(migGPU1, "3g.20gb", mig.Placement{Start: 0, Size: 4}, 1)
	_ = orphan
	podsCaughtUp(t, f.agent)
	if err := f.agent.reconcileMIG(f.ctx); err != nil {
		t.Fatal(err)
	}
	if diff := gocmp.Diff([]mig.Instance{claimed}, fm.state()); diff != "" {
		t.Errorf("instances after the release (-want +got):\n%s", diff)
	}
	waitFor(t, "the DRA-owned MIG GPU cordoned", func() bool {
		node, err := f.cs.CoreV1().Nodes().Get(f.ctx, testNode, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return node.Annotations[allocation.KeyDeviceCordon] == migGPU1
	})
	for _, d := range f.agent.plugin.Devices() {
		if strings.HasPrefix(d.ID, migGPU1) {
			t.Errorf("kubelet device %s of the DRA-owned MIG GPU", d.ID)
		}
	}

	waitFor(t, "the DRA world running", func() bool { return world.runHost() != nil })
	realiser := world.runHost().MIG()
	if realiser == nil {
		t.Fatal("the host lends no MIG realiser")
	}
	inst, err := realiser.Create(f.ctx, migGPU1, "1g.5gb", mig.Placement{Start: 6, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	if insts, err := realiser.Instances(f.ctx); err != nil || !slices.Contains(insts, inst) {
		t.Errorf("Instances = %v, %v; want the created %s", insts, err, inst.MigUUID)
	}
	if err := realiser.Destroy(f.ctx, inst); err != nil || slices.Contains(fm.state(), inst) {
		t.Errorf("Destroy = %v; instances %v", err, fm.state())
	}

	// Without Options.MIG the host lends none.
	g := newMIGFixture(t, nil, Options{DRA: &fakeDRA{gpus: []string{migGPU1}}})
	if m := (draHost{g.agent}).MIG(); m != nil {
		t.Errorf("MIG() without Options.MIG = %v, want nil", m)
	}
}

// TestMIGAllocateRefusesDRAGPU: a pod HAMi's scheduler placed on a MIG GPU the DRA world owns
// is refused at Allocate (ErrOwnership), and no instance is created for it.
func TestMIGAllocateRefusesDRAGPU(t *testing.T) {
	t.Parallel()
	fm := newFakeMIG(migGPU0, migGPU1)
	pod := migPod("p", corev1.PodPending, res(0, 0, migGPU1, "1g.5gb", 6, 1))
	f := newMIGFixture(t, fm, Options{DRA: &fakeDRA{gpus: []string{migGPU1}}}, pod)
	f.schedule(t, pod, allocation.PodDevices{{migDev(migGPU1, 4864, 15)}})
	_, err := f.call(migGPU0 + "-0")
	if err == nil {
		t.Fatal("Allocate succeeded")
	}
	if msg := message(err); !strings.Contains(msg, migGPU1) || !strings.Contains(msg, ErrOwnership.Error()) {
		t.Errorf("error %q, want the DRA-owned GPU and %q", msg, ErrOwnership)
	}
	if st := fm.state(); len(st) != 0 {
		t.Errorf("instances %+v, want none", st)
	}
}
