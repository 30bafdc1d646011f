package nodeagent

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/clienttest"
	"github.com/hamireg/hamireg/register"
)

// fakeDRA is a DRA world that owns the GPUs of gpus (all when empty) and records what the
// agent hands it.
type fakeDRA struct {
	gpus []string
	// setErr, when set, is SetDevices' error.
	setErr error

	mu       sync.Mutex
	devs     []annotation.Device
	pci      map[string]string
	sets     int
	prepared map[string][]types.UID
	host     DRAHost
}

var _ DRA = (*fakeDRA)(nil)

func (f *fakeDRA) Owns(d annotation.Device) bool {
	return len(f.gpus) == 0 || slices.Contains(f.gpus, d.ID)
}

func (f *fakeDRA) SetDevices(_ context.Context, devs []annotation.Device, pci map[string]string) error {
	if f.setErr != nil {
		return f.setErr
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.devs, f.pci = slices.Clone(devs), pci
	f.sets++
	return nil
}

func (f *fakeDRA) Run(ctx context.Context, host DRAHost) error {
	f.mu.Lock()
	f.host = host
	f.mu.Unlock()
	<-ctx.Done()
	return nil
}

func (f *fakeDRA) PreparedGPUs() map[string][]types.UID {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.prepared
}

func (f *fakeDRA) last() []annotation.Device {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.devs
}

func (f *fakeDRA) runHost() DRAHost {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.host
}

// pciSource is a Source that knows the GPUs' PCI bus IDs.
type pciSource struct {
	*mutableSource
}

func (pciSource) PCIBusIDs() map[string]string {
	return map[string]string{"GPU-0": "0000:07:00.0", "GPU-3": "0000:0a:00.0"}
}

// mutableSource is a Source whose devices the test replaces.
type mutableSource struct {
	mu   sync.Mutex
	devs []annotation.Device
}

func (s *mutableSource) Devices(context.Context) ([]annotation.Device, []error, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.devs), nil, nil
}
func (*mutableSource) Changed() <-chan struct{} { return nil }

func (s *mutableSource) set(f func([]annotation.Device)) {
	s.mu.Lock()
	f(s.devs)
	s.mu.Unlock()
}

// newDRAAgent is an agent with opts (not run) on a fake clientset holding the node.
func newDRAAgent(t *testing.T, src Source, opts Options) (*Agent, *record.FakeRecorder) {
	t.Helper()
	cs := clienttest.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}})
	rec := record.NewFakeRecorder(100)
	opts.EventRecorder = rec
	a, err := New(cs, testNode, src, opts)
	if err != nil {
		t.Fatal(err)
	}
	return a, rec
}

// TestOwnedByDRA: the world's answer, for a GPU in MIG mode too, never without a world.
func TestOwnedByDRA(t *testing.T) {
	t.Parallel()
	devs := append(testGPUs(), annotation.Device{ID: "GPU-9", Index: 9, Count: 1, Devmem: 40960, Devcore: 100, Mode: "mig", Health: true})
	for name, tc := range map[string]struct {
		world DRA
		want  []string
	}{
		"all":          {&fakeDRA{}, []string{"GPU-0", "GPU-1", "GPU-2", "GPU-3", "GPU-9"}},
		"some":         {&fakeDRA{gpus: []string{"GPU-1", "GPU-3"}}, []string{"GPU-1", "GPU-3"}},
		"MIG included": {&fakeDRA{gpus: []string{"GPU-9", "GPU-1"}}, []string{"GPU-1", "GPU-9"}},
		"no DRA":       {nil, nil},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a, _ := newDRAAgent(t, staticSource(devs), Options{DRA: tc.world})
			var got []string
			for _, d := range devs {
				if a.OwnedByDRA(d) {
					got = append(got, d.ID)
				}
			}
			if d := gocmp.Diff(tc.want, got); d != "" {
				t.Errorf("DRA-owned (-want +got):\n%s", d)
			}
		})
	}
}

// scanned runs one scan of a and writes the register annotation once; it returns the Node's
// annotations.
func scanned(t *testing.T, a *Agent) map[string]string {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	if err := a.scan(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.writer.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	n, err := a.client.CoreV1().Nodes().Get(ctx, testNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Annotations
}

func ids(devs []annotation.Device) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.ID)
	}
	return out
}

// TestScanThreeOutputs: one scan feeds the register annotation (every GPU; the DRA-owned ones
// cordoned on master, unhealthy for v2.9.0), the kubelet (without the DRA-owned GPUs) and the
// DRA world (every GPU, with the source's PCI bus IDs).
func TestScanThreeOutputs(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		version     annotation.Version
		wantHealthy []bool
	}{
		"master": {annotation.VersionMaster, []bool{true, true, true, true}},
		"v2.9.0": {annotation.VersionV290, []bool{true, false, true, false}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			src := pciSource{&mutableSource{devs: testGPUs()}}
			f := &fakeDRA{gpus: []string{"GPU-1", "GPU-3"}}
			a, _ := newDRAAgent(t, src, Options{Version: tc.version, DRA: f})
			ann := scanned(t, a)

			reg, err := annotation.DecodeShape(ann[annotation.KeyNVIDIARegister], tc.version)
			if err != nil {
				t.Fatal(err)
			}
			var healthy []bool
			for _, d := range annotation.Canonical(reg) {
				healthy = append(healthy, d.Health)
			}
			if d := gocmp.Diff(tc.wantHealthy, healthy); d != "" {
				t.Errorf("register annotation health (-want +got):\n%s", d)
			}
			if got := ann[allocation.KeyDeviceCordon]; got != "GPU-1,GPU-3" {
				t.Errorf("%s = %q, want the DRA-owned GPUs", allocation.KeyDeviceCordon, got)
			}
			if got := ann[register.CordonKey]; got != "GPU-1,GPU-3" {
				t.Errorf("%s = %q", register.CordonKey, got)
			}
			if d := gocmp.Diff([]string{"GPU-0", "GPU-2"}, ids(a.plugin.Devices())); d != "" {
				t.Errorf("kubelet devices (-want +got):\n%s", d)
			}
			if d := gocmp.Diff([]string{"GPU-0", "GPU-1", "GPU-2", "GPU-3"}, ids(f.last())); d != "" {
				t.Errorf("DRA devices (-want +got):\n%s", d)
			}
			if d := gocmp.Diff(src.PCIBusIDs(), f.pci); d != "" {
				t.Errorf("PCI bus IDs (-want +got):\n%s", d)
			}
		})
	}
}

// TestScanWithoutDRA: no cordon annotation, every GPU to the kubelet.
func TestScanWithoutDRA(t *testing.T) {
	t.Parallel()
	a, _ := newDRAAgent(t, staticSource(testGPUs()), Options{})
	ann := scanned(t, a)
	if _, ok := ann[allocation.KeyDeviceCordon]; ok {
		t.Errorf("cordon %q written without DRA", ann[allocation.KeyDeviceCordon])
	}
	if _, ok := ann[register.CordonKey]; ok {
		t.Error("cordon record written without DRA")
	}
	if n := len(a.plugin.Devices()); n != 4 {
		t.Errorf("%d kubelet devices, want 4", n)
	}
}

// TestScanChangeReachesDRA: a GPU turning unhealthy reaches the DRA world in the same scan
// that writes health false in the register annotation.
func TestScanChangeReachesDRA(t *testing.T) {
	t.Parallel()
	src := &mutableSource{devs: testGPUs()}
	f := &fakeDRA{}
	a, _ := newDRAAgent(t, src, Options{DRA: f})
	scanned(t, a)
	src.set(func(d []annotation.Device) { d[2].Health = false })
	ann := scanned(t, a)
	reg, err := annotation.Decode(ann[annotation.KeyNVIDIARegister])
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range reg {
		if d.Health != (d.ID != "GPU-2") {
			t.Errorf("register annotation: %s health %v", d.ID, d.Health)
		}
	}
	for _, d := range f.last() {
		if d.Health != (d.ID != "GPU-2") {
			t.Errorf("DRA world: %s health %v", d.ID, d.Health)
		}
	}
	if f.sets != 2 {
		t.Errorf("%d SetDevices, want one per scan", f.sets)
	}
}

// TestScanDRAPublishFails: a scan the DRA world cannot publish is recorded once as
// DRAPublishFailed, and the other two outputs still get the scan.
func TestScanDRAPublishFails(t *testing.T) {
	t.Parallel()
	f := &fakeDRA{gpus: []string{"GPU-1"}, setErr: errors.New("two GPUs with index 0")}
	a, rec := newDRAAgent(t, staticSource(testGPUs()), Options{DRA: f})
	scanned(t, a)
	ann := scanned(t, a)
	var events []string
	for len(rec.Events) > 0 {
		events = append(events, <-rec.Events)
	}
	if len(events) != 1 || !strings.Contains(events[0], EventReasonDRAPublishFailed) || !strings.Contains(events[0], "index 0") {
		t.Errorf("events %q, want one %s naming the index", events, EventReasonDRAPublishFailed)
	}
	if ann[allocation.KeyDeviceCordon] != "GPU-1" || len(a.plugin.Devices()) != 3 {
		t.Errorf("cordon %q, %d kubelet devices: the other outputs did not get the scan", ann[allocation.KeyDeviceCordon], len(a.plugin.Devices()))
	}
}

// TestAllocateRefusesDRAGPUs: a pod whose entry names a DRA-owned GPU, or one with a prepared
// claim, fails Allocate with ErrOwnership (bind-phase failed, an AllocateFailed Event); a
// device-plugin-owned GPU is served.
func TestAllocateRefusesDRAGPUs(t *testing.T) {
	t.Parallel()
	owned, claimed, free := gpuPod("owned", "main"), gpuPod("claimed", "main"), gpuPod("free", "main")
	fake := &fakeDRA{gpus: []string{"GPU-1"}, prepared: map[string][]types.UID{"GPU-2": {"claim-uid-7"}}}
	f := newFixture(t, Options{DRA: fake}, owned, claimed, free)

	for _, tc := range []struct {
		pod  *corev1.Pod
		gpu  int
		want []string
	}{
		{owned, 1, []string{"GPU-1", "owned by the DRA world", "Options.DRA"}},
		{claimed, 2, []string{"GPU-2", "claim-uid-7", "unprepared"}},
	} {
		f.schedule(t, tc.pod, allocation.PodDevices{{dev(tc.gpu, 1000, 10)}})
		_, err := f.call("GPU-0-1")
		if err == nil {
			t.Fatalf("pod %s: Allocate succeeded", tc.pod.Name)
		}
		msg := message(err)
		for _, w := range append(tc.want, ErrOwnership.Error(), "bind-phase set to failed") {
			if !strings.Contains(msg, w) {
				t.Errorf("pod %s: error %q does not say %q", tc.pod.Name, msg, w)
			}
		}
		if e := f.event(t); !strings.Contains(e, EventReasonAllocateFailed) {
			t.Errorf("pod %s: event %q", tc.pod.Name, e)
		}
		if p := f.pod(t, tc.pod.Name); p.Annotations[allocation.KeyBindPhase] != string(allocation.PhaseFailed) {
			t.Errorf("pod %s: bind-phase %q", tc.pod.Name, p.Annotations[allocation.KeyBindPhase])
		}
	}
	f.schedule(t, free, allocation.PodDevices{{dev(0, 1000, 10)}})
	if _, err := f.call("GPU-0-1"); err != nil {
		t.Fatalf("a device-plugin GPU: %v", err)
	}
}

// TestAllocateOwnershipError: the Allocate error of an ownership conflict is of class
// ErrOwnership.
func TestAllocateOwnershipError(t *testing.T) {
	t.Parallel()
	a, _ := newDRAAgent(t, staticSource(testGPUs()), Options{DRA: &fakeDRA{gpus: []string{"GPU-1"}}})
	_, ctx := ktesting.NewTestContext(t)
	if err := a.scan(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := a.allocateDirect(ctx, *a.devices.Load(), []string{"GPU-1-0"})
	if !errors.Is(err, ErrOwnership) {
		t.Fatalf("allocate of a DRA GPU = %v, want ErrOwnership", err)
	}
	if ae, ok := errors.AsType[*AllocateError](err); !ok || !errors.Is(ae.Kind, ErrOwnership) {
		t.Errorf("error %#v, want an AllocateError of class ErrOwnership", err)
	}
	if _, err := a.allocateDirect(ctx, *a.devices.Load(), []string{"GPU-0-0"}); errors.Is(err, ErrOwnership) {
		t.Errorf("allocate of a device-plugin GPU = %v", err)
	}
}

// allocatedPod is a pod holding gpu through HAMi's allocated annotation.
func allocatedPod(name, node string, phase corev1.PodPhase, gpu int) *corev1.Pod {
	p := gpuPod(name, "main")
	p.Spec.NodeName, p.Status.Phase = node, phase
	p.Annotations = map[string]string{annotation.NVIDIA().AllocatedKey: allocation.EncodePodDevices(allocation.PodDevices{{dev(gpu, 1000, 10)}})}
	return p
}

// TestHeldByHAMi: the host's check at Prepare refuses a GPU that a live pod on the node holds
// through HAMi; a finished pod, a pod on another node and a pod on another GPU do not count.
// It reads the agent's pod informer: one LIST and one WATCH, however many checks.
func TestHeldByHAMi(t *testing.T) {
	t.Parallel()
	cs := clienttest.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}},
		allocatedPod("holder", testNode, corev1.PodRunning, 1),
		allocatedPod("done", testNode, corev1.PodSucceeded, 2),
		allocatedPod("elsewhere", "gpu-2", corev1.PodRunning, 3),
		allocatedPod("other-gpu", testNode, corev1.PodPending, 0),
	)
	w := &fakeDRA{gpus: []string{"GPU-1", "GPU-2", "GPU-3"}}
	f := newFixtureOn(t, cs, Options{DRA: w})
	waitFor(t, "the DRA world's run", func() bool { return w.runHost() != nil })
	host := w.runHost()
	for name, tc := range map[string]struct {
		gpus []string
		want string // "" allowed
	}{
		"held by a live pod":         {[]string{"GPU-2", "GPU-1"}, "default/holder"},
		"finished pod and elsewhere": {[]string{"GPU-2", "GPU-3"}, ""},
	} {
		err := host.HeldByHAMi(f.ctx, tc.gpus)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", name, err)
		case tc.want != "" && (!errors.Is(err, ErrOwnership) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: HeldByHAMi = %v, want ErrOwnership naming %q", name, err, tc.want)
		}
	}
	verbs := map[string]int{}
	for _, act := range cs.Actions() {
		if act.GetResource().Resource == "pods" {
			verbs[act.GetVerb()]++
		}
	}
	if d := gocmp.Diff(map[string]int{"list": 1, "watch": 1}, verbs); d != "" {
		t.Errorf("pod requests (-want +got):\n%s", d)
	}
}

// TestHeldByHAMiNotSynced: before the informer's first LIST the check refuses with
// ErrPodsNotSynced instead of reading an empty cache.
func TestHeldByHAMiNotSynced(t *testing.T) {
	t.Parallel()
	a, _ := newDRAAgent(t, staticSource(testGPUs()), Options{DRA: &fakeDRA{}})
	_, ctx := ktesting.NewTestContext(t)
	if err := (draHost{a}).HeldByHAMi(ctx, []string{"GPU-0"}); !errors.Is(err, ErrPodsNotSynced) {
		t.Errorf("HeldByHAMi before Run = %v, want ErrPodsNotSynced", err)
	}
}

// TestRunRunsTheDRAWorld: Run runs the DRA world beside the rest and joins it.
func TestRunRunsTheDRAWorld(t *testing.T) {
	t.Parallel()
	w := &fakeDRA{gpus: []string{"GPU-1"}}
	f := newFixture(t, Options{DRA: w})
	waitFor(t, "the DRA devices", func() bool { return len(w.last()) == 4 })
	if d := gocmp.Diff([]string{"GPU-0", "GPU-2", "GPU-3"}, ids(f.agent.plugin.Devices())); d != "" {
		t.Errorf("kubelet devices (-want +got):\n%s", d)
	}
}
