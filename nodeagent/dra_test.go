package nodeagent

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/clienttest"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
	"github.com/hamireg/hamireg/register"
)

// fakeDRA is a draPlugin that records what the agent hands it.
type fakeDRA struct {
	mu       sync.Mutex
	gpus     []annotation.Device
	devices  []resourcev1.Device
	sets     int
	prepared map[string][]types.UID
}

func (f *fakeDRA) SetDevices(gpus []annotation.Device, devices []resourcev1.Device) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gpus, f.devices = slices.Clone(gpus), slices.Clone(devices)
	f.sets++
}

func (f *fakeDRA) Run(ctx context.Context) error { <-ctx.Done(); return nil }

func (f *fakeDRA) PreparedGPUs() map[string][]types.UID {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.prepared
}

func (f *fakeDRA) last() []resourcev1.Device {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.devices
}

// draOptions is a DRA configuration whose folders are the test's.
func draOptions(t *testing.T, gpus ...string) *DRAOptions {
	t.Helper()
	return &DRAOptions{Plugin: draplugin.Options{Profile: dra.SDKProfile(), PluginDir: t.TempDir(), RegistrarDir: t.TempDir()}, GPUs: gpus}
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

// newDRAAgent is an agent with opts (not run) on a fake clientset holding the node, with the
// fake DRA plugin.
func newDRAAgent(t *testing.T, src Source, opts Options) (*Agent, *fakeDRA, *record.FakeRecorder) {
	t.Helper()
	cs := clienttest.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}})
	rec := record.NewFakeRecorder(100)
	opts.EventRecorder = rec
	a, err := New(cs, testNode, src, opts)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeDRA{}
	if a.dra != nil {
		a.dra.plugin = f
	}
	return a, f, rec
}

func TestNewDRAOptions(t *testing.T) {
	t.Parallel()
	src := staticSource(testGPUs())
	for name, tc := range map[string]struct {
		opts func(*DRAOptions)
		ok   bool
	}{
		"all":               {opts: func(*DRAOptions) {}, ok: true},
		"uuids and indexes": {opts: func(o *DRAOptions) { o.GPUs = []string{"GPU-1", "3", "0"} }, ok: true},
		"no profile":        {opts: func(o *DRAOptions) { o.Plugin.Profile = dra.Profile{} }},
		"refuse set":        {opts: func(o *DRAOptions) { o.Plugin.Refuse = func(context.Context, []annotation.Device) error { return nil } }},
		"empty entry":       {opts: func(o *DRAOptions) { o.GPUs = []string{""} }},
		"spaces":            {opts: func(o *DRAOptions) { o.GPUs = []string{" GPU-1"} }},
		"comma list":        {opts: func(o *DRAOptions) { o.GPUs = []string{"GPU-1,GPU-2"} }},
		"negative index":    {opts: func(o *DRAOptions) { o.GPUs = []string{"-1"} }},
		"not decimal":       {opts: func(o *DRAOptions) { o.GPUs = []string{"0x1"} }},
		"long socket path":  {opts: func(o *DRAOptions) { o.Plugin.PluginDir = "/" + strings.Repeat("d", 120) }},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			o := draOptions(t)
			tc.opts(o)
			a, err := New(clienttest.NewClientset(), testNode, src, Options{DRA: o})
			switch {
			case tc.ok && err != nil:
				t.Fatalf("New = %v", err)
			case tc.ok:
				if a.DRA() == nil || a.DRA().Driver() != dra.SDKDriver {
					t.Errorf("DRA() = %v, want the SDK profile's plugin", a.DRA())
				}
			case !errors.Is(err, ErrInvalidOptions):
				t.Fatalf("New = %v, want ErrInvalidOptions", err)
			}
		})
	}
	a, err := New(clienttest.NewClientset(), testNode, src, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if a.DRA() != nil || a.OwnedByDRA(testGPUs()[0]) {
		t.Error("an agent without Options.DRA has a DRA plugin or owns a GPU for DRA")
	}
}

// TestOwnedByDRA: GPUs chosen by UUID and by index, all of them when none is listed; a GPU in
// MIG mode never.
func TestOwnedByDRA(t *testing.T) {
	t.Parallel()
	devs := testGPUs()
	mig := annotation.Device{ID: "GPU-9", Index: 9, Count: 1, Devmem: 40960, Devcore: 100, Mode: "mig", Health: true}
	devs = append(devs, mig)
	for name, tc := range map[string]struct {
		gpus []string
		want []string
	}{
		"all":          {nil, []string{"GPU-0", "GPU-1", "GPU-2", "GPU-3"}},
		"by UUID":      {[]string{"GPU-1", "GPU-3"}, []string{"GPU-1", "GPU-3"}},
		"by index":     {[]string{"0", "2"}, []string{"GPU-0", "GPU-2"}},
		"mixed":        {[]string{"GPU-0", "3"}, []string{"GPU-0", "GPU-3"}},
		"MIG excluded": {[]string{"GPU-9", "9", "1"}, []string{"GPU-1"}},
		"unknown":      {[]string{"GPU-42", "42"}, nil},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a, _, _ := newDRAAgent(t, staticSource(devs), Options{DRA: draOptions(t, tc.gpus...)})
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

func taints(d resourcev1.Device) []string {
	var out []string
	for _, t := range d.Taints {
		out = append(out, t.Key)
	}
	return out
}

// TestScanThreeOutputs: one scan feeds the register annotation (every GPU; the DRA-owned ones
// cordoned on master, unhealthy for v2.9.0), the kubelet (without the DRA-owned GPUs) and the
// DRA devices (every GPU, the device-plugin-owned ones tainted, PCI bus IDs from the source).
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
			a, f, _ := newDRAAgent(t, src, Options{Version: tc.version, DRA: draOptions(t, "GPU-1", "3")})
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

			devs := f.last()
			if len(devs) != 4 || len(f.gpus) != 4 {
				t.Fatalf("%d DRA devices of %d GPUs, want 4 of 4", len(devs), len(f.gpus))
			}
			p := dra.SDKProfile()
			for i, d := range devs {
				var want []string
				if i == 0 || i == 2 {
					want = []string{p.OwnedByHAMiTaint()}
				}
				if gd := gocmp.Diff(want, taints(d)); gd != "" {
					t.Errorf("device %s taints (-want +got):\n%s", d.Name, gd)
				}
			}
			pci := func(i int) string {
				a := devs[i].Attributes[dra.AttributePCIBusID]
				if a.StringValue == nil {
					return ""
				}
				return *a.StringValue
			}
			if pci(0) != "0000:07:00.0" || pci(3) != "0000:0a:00.0" || pci(1) != "" {
				t.Errorf("PCI bus IDs %q %q %q", pci(0), pci(1), pci(3))
			}
		})
	}
}

// TestScanWithoutDRA: no cordon annotation, every GPU to the kubelet.
func TestScanWithoutDRA(t *testing.T) {
	t.Parallel()
	a, _, _ := newDRAAgent(t, staticSource(testGPUs()), Options{})
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

// TestScanChangeReachesDRA: a GPU turning unhealthy is tainted in the DRA devices in the same
// scan that writes health false in the register annotation.
func TestScanChangeReachesDRA(t *testing.T) {
	t.Parallel()
	src := &mutableSource{devs: testGPUs()}
	a, f, _ := newDRAAgent(t, src, Options{DRA: draOptions(t)})
	scanned(t, a)
	for _, d := range f.last() {
		if len(d.Taints) != 0 {
			t.Fatalf("device %s tainted %v before the change", d.Name, taints(d))
		}
	}
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
	for i, d := range f.last() {
		var want []string
		if i == 2 {
			want = []string{dra.SDKProfile().UnhealthyTaint()}
		}
		if gd := gocmp.Diff(want, taints(d)); gd != "" {
			t.Errorf("device %s taints (-want +got):\n%s", d.Name, gd)
		}
	}
	if f.sets != 2 {
		t.Errorf("%d SetDevices, want one per scan", f.sets)
	}
}

// TestScanDRAMappingFails: devices DRA cannot publish keep the slice's last devices, are
// recorded once as DRAPublishFailed, and the other two outputs still get the scan.
func TestScanDRAMappingFails(t *testing.T) {
	t.Parallel()
	devs := testGPUs()
	devs[1].Index = 0 // two GPUs with index 0: device names would collide
	a, f, rec := newDRAAgent(t, staticSource(devs), Options{DRA: draOptions(t)})
	scanned(t, a)
	scanned(t, a)
	if f.sets != 0 {
		t.Errorf("%d SetDevices for devices that cannot be mapped", f.sets)
	}
	var events []string
	for len(rec.Events) > 0 {
		events = append(events, <-rec.Events)
	}
	if len(events) != 1 || !strings.Contains(events[0], EventReasonDRAPublishFailed) || !strings.Contains(events[0], "index 0") {
		t.Errorf("events %q, want one %s naming the index", events, EventReasonDRAPublishFailed)
	}
}

// TestAllocateRefusesDRAGPUs: a pod whose entry names a DRA-owned GPU, or one with a prepared
// claim, fails Allocate with ErrOwnership (bind-phase failed, an AllocateFailed Event); a
// device-plugin-owned GPU is served.
func TestAllocateRefusesDRAGPUs(t *testing.T) {
	t.Parallel()
	owned, claimed, free := gpuPod("owned", "main"), gpuPod("claimed", "main"), gpuPod("free", "main")
	fake := &fakeDRA{prepared: map[string][]types.UID{"GPU-2": {"claim-uid-7"}}}
	f := newFixtureWith(t, Options{DRA: draOptions(t, "GPU-1")}, func(a *Agent) { a.dra.plugin = fake }, owned, claimed, free)

	for _, tc := range []struct {
		pod  *corev1.Pod
		gpu  int
		want []string
	}{
		{owned, 1, []string{"GPU-1", "owned by the DRA world", "Options.DRA.GPUs"}},
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
	a, _, _ := newDRAAgent(t, staticSource(testGPUs()), Options{DRA: draOptions(t, "GPU-1")})
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

// TestRefuseAtPrepare: Prepare's check refuses a GPU of the device-plugin world and a GPU that
// a live pod on the node holds through HAMi; a finished pod, a pod on another node and a pod
// on another GPU do not count.
func TestRefuseAtPrepare(t *testing.T) {
	t.Parallel()
	allocated := func(name, node string, phase corev1.PodPhase, gpu int) *corev1.Pod {
		p := gpuPod(name, "main")
		p.Spec.NodeName, p.Status.Phase = node, phase
		p.Annotations = map[string]string{annotation.NVIDIA().AllocatedKey: allocation.EncodePodDevices(allocation.PodDevices{{dev(gpu, 1000, 10)}})}
		return p
	}
	pods := []runtime.Object{
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}},
		allocated("holder", testNode, corev1.PodRunning, 1),
		allocated("done", testNode, corev1.PodSucceeded, 2),
		allocated("elsewhere", "gpu-2", corev1.PodRunning, 3),
		allocated("other-gpu", testNode, corev1.PodPending, 0),
	}
	cs := clienttest.NewClientset(pods...)
	a, err := New(cs, testNode, staticSource(testGPUs()), Options{EventRecorder: &record.FakeRecorder{}, DRA: draOptions(t, "1", "2", "3")})
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	gpu := func(i int) annotation.Device { return testGPUs()[i] }
	for name, tc := range map[string]struct {
		gpus []annotation.Device
		want string // "" allowed
	}{
		"device-plugin GPU":          {[]annotation.Device{gpu(0)}, "device-plugin world"},
		"held by a live pod":         {[]annotation.Device{gpu(2), gpu(1)}, "default/holder"},
		"finished pod and elsewhere": {[]annotation.Device{gpu(2), gpu(3)}, ""},
	} {
		err := a.refuse(ctx, tc.gpus)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", name, err)
		case tc.want != "" && (!errors.Is(err, ErrOwnership) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: refuse = %v, want ErrOwnership naming %q", name, err, tc.want)
		}
	}
	// The pods are listed by the node's field selector.
	for _, act := range cs.Actions() {
		if l, ok := act.(k8stesting.ListAction); ok && act.GetResource().Resource == "pods" {
			if fs := l.GetListRestrictions().Fields.String(); fs != "spec.nodeName="+testNode {
				t.Errorf("pods listed with field selector %q", fs)
			}
		}
	}
}

func TestDRAClusterRoleRules(t *testing.T) {
	t.Parallel()
	rules := DRAClusterRoleRules()
	has := func(group, res, verb string) bool {
		return slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool {
			return slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, res) && slices.Contains(r.Verbs, verb)
		})
	}
	for _, want := range [][3]string{
		{"resource.k8s.io", "resourceslices", "create"}, {"resource.k8s.io", "resourceslices", "update"},
		{"resource.k8s.io", "resourceslices", "delete"}, {"resource.k8s.io", "resourceclaims", "get"},
		{"", "pods", "list"}, {"", "nodes", "get"},
	} {
		if !has(want[0], want[1], want[2]) {
			t.Errorf("DRAClusterRoleRules lacks %s %s/%s", want[2], want[0], want[1])
		}
	}
}

// TestRunRunsTheDRAPlugin: Run runs the DRA plugin beside the rest and joins it.
func TestRunRunsTheDRAPlugin(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, Options{DRA: draOptions(t, "1")}, func(a *Agent) { a.dra.plugin = &fakeDRA{} })
	waitFor(t, "the DRA devices", func() bool { return len(f.agent.dra.plugin.(*fakeDRA).last()) == 4 })
	if d := gocmp.Diff([]string{"GPU-0", "GPU-2", "GPU-3"}, ids(f.agent.plugin.Devices())); d != "" {
		t.Errorf("kubelet devices (-want +got):\n%s", d)
	}
}

// TestRunPublishesTheSlice: with the real DRA plugin, Run publishes one ResourceSlice of every
// GPU (the device-plugin one tainted), cordons the DRA GPUs in the register annotation's patch
// and offers the kubelet only the device-plugin GPU.
func TestRunPublishesTheSlice(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	cs := clienttest.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "node-uid"}})
	generateNames(cs)
	k := kubelettest.Start(t)
	a, err := New(cs, testNode, staticSource(testGPUs()), Options{
		Period: time.Hour, EventRecorder: &record.FakeRecorder{}, Kubelet: kubeletplugin.Options{PluginDir: k.Dir()},
		DRA: &DRAOptions{Plugin: draplugin.Options{Profile: dra.HAMiProfile(), PluginDir: t.TempDir(), RegistrarDir: t.TempDir(),
			CDIDir: t.TempDir(), SliceSyncDelay: -1}, GPUs: []string{"0", "2", "GPU-3"}},
	})
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
	var slice resourcev1.ResourceSlice
	waitFor(t, "the ResourceSlice", func() bool {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != 1 {
			return false
		}
		slice = l.Items[0]
		return true
	})
	p := dra.HAMiProfile()
	if slice.Spec.Driver != p.Driver || slice.Spec.Pool.Name != testNode || len(slice.Spec.Devices) != 4 {
		t.Fatalf("slice driver %s pool %s with %d devices", slice.Spec.Driver, slice.Spec.Pool.Name, len(slice.Spec.Devices))
	}
	for i, d := range slice.Spec.Devices {
		var want []string
		if i == 1 {
			want = []string{p.OwnedByHAMiTaint()}
		}
		if gd := gocmp.Diff(want, taints(d)); gd != "" {
			t.Errorf("device %s taints (-want +got):\n%s", d.Name, gd)
		}
	}
	waitFor(t, "the cordon", func() bool {
		n, err := cs.CoreV1().Nodes().Get(ctx, testNode, metav1.GetOptions{})
		return err == nil && n.Annotations[allocation.KeyDeviceCordon] == "GPU-0,GPU-2,GPU-3"
	})
	waitFor(t, "the kubelet's device count", func() bool {
		r, ok := k.State().Resource(gpuResource)
		return ok && len(r.Devices) == 10
	})
}
