package nodedra_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/clienttest"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/nodeagent/nodedra"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const testNode = "gpu-1"

func testGPUs() []annotation.Device {
	devs := make([]annotation.Device, 4)
	for i := range devs {
		devs[i] = annotation.Device{ID: fmt.Sprintf("GPU-%d", i), Index: uint(i), Count: 10, Devmem: 40960, Devcore: 100, Type: "NVIDIA-A100", Mode: "hami-core", Health: true}
	}
	return devs
}

// pciSource is a Source whose devices never change and that knows two PCI bus IDs.
type pciSource []annotation.Device

func (s pciSource) Devices(context.Context) ([]annotation.Device, []error, error) {
	return slices.Clone(s), nil, nil
}
func (pciSource) Changed() <-chan struct{} { return nil }
func (pciSource) PCIBusIDs() map[string]string {
	return map[string]string{"GPU-0": "0000:07:00.0", "GPU-3": "0000:0a:00.0"}
}

// NUMANodes makes pciSource a nodeagent.NUMASource that knows two NUMA nodes.
func (pciSource) NUMANodes() map[string]int { return map[string]int{"GPU-0": 1, "GPU-2": 0} }

// options is a World configuration whose folders are the test's.
func options(tb testing.TB, gpus ...string) nodedra.Options {
	tb.Helper()
	return nodedra.Options{Plugin: draplugin.Options{Profile: dra.SDKProfile(), PluginDir: tb.TempDir(), RegistrarDir: tb.TempDir(), CDIDir: tb.TempDir(), SliceSyncDelay: -1}, GPUs: gpus}
}

func TestNew(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		opts func(*nodedra.Options)
		ok   bool
	}{
		"all":               {opts: func(*nodedra.Options) {}, ok: true},
		"uuids and indexes": {opts: func(o *nodedra.Options) { o.GPUs = []string{"GPU-1", "3", "0"} }, ok: true},
		"no profile":        {opts: func(o *nodedra.Options) { o.Plugin.Profile = dra.Profile{} }},
		"refuse set": {opts: func(o *nodedra.Options) {
			o.Plugin.Refuse = func(context.Context, []annotation.Device) error { return nil }
		}},
		"empty entry":      {opts: func(o *nodedra.Options) { o.GPUs = []string{""} }},
		"spaces":           {opts: func(o *nodedra.Options) { o.GPUs = []string{" GPU-1"} }},
		"comma list":       {opts: func(o *nodedra.Options) { o.GPUs = []string{"GPU-1,GPU-2"} }},
		"negative index":   {opts: func(o *nodedra.Options) { o.GPUs = []string{"-1"} }},
		"not decimal":      {opts: func(o *nodedra.Options) { o.GPUs = []string{"0x1"} }},
		"long socket path": {opts: func(o *nodedra.Options) { o.Plugin.PluginDir = "/" + strings.Repeat("d", 120) }},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			o := options(t)
			tc.opts(&o)
			w, err := nodedra.New(clienttest.NewClientset(), testNode, o)
			switch {
			case tc.ok && err != nil:
				t.Fatalf("New = %v", err)
			case tc.ok:
				if w.Plugin().Driver() != dra.SDKDriver {
					t.Errorf("driver %q, want the SDK profile's", w.Plugin().Driver())
				}
			case !errors.Is(err, nodedra.ErrInvalidOptions):
				t.Fatalf("New = %v, want ErrInvalidOptions", err)
			}
		})
	}
}

// TestOwns: GPUs chosen by UUID and by index, all of them when none is listed; a GPU in MIG
// mode too.
func TestOwns(t *testing.T) {
	t.Parallel()
	devs := append(testGPUs(), annotation.Device{ID: "GPU-9", Index: 9, Count: 1, Devmem: 40960, Devcore: 100, Mode: "mig", Health: true})
	for name, tc := range map[string]struct {
		gpus []string
		want []string
	}{
		"all":          {nil, []string{"GPU-0", "GPU-1", "GPU-2", "GPU-3", "GPU-9"}},
		"by UUID":      {[]string{"GPU-1", "GPU-3"}, []string{"GPU-1", "GPU-3"}},
		"by index":     {[]string{"0", "2"}, []string{"GPU-0", "GPU-2"}},
		"mixed":        {[]string{"GPU-0", "3"}, []string{"GPU-0", "GPU-3"}},
		"MIG included": {[]string{"GPU-9", "1"}, []string{"GPU-1", "GPU-9"}},
		"unknown":      {[]string{"GPU-42", "42"}, nil},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w, err := nodedra.New(clienttest.NewClientset(), testNode, options(t, tc.gpus...))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range devs {
				if w.Owns(d) {
					got = append(got, d.ID)
				}
			}
			if d := gocmp.Diff(tc.want, got); d != "" {
				t.Errorf("owned (-want +got):\n%s", d)
			}
		})
	}
}

// TestSetDevicesMappingFails: devices DRA cannot name (two GPUs with index 0) are an error
// naming the index; the agent records it.
func TestSetDevicesMappingFails(t *testing.T) {
	t.Parallel()
	w, err := nodedra.New(clienttest.NewClientset(), testNode, options(t))
	if err != nil {
		t.Fatal(err)
	}
	devs := testGPUs()
	devs[1].Index = 0
	_, ctx := ktesting.NewTestContext(t)
	if err := w.SetDevices(ctx, devs, nil); err == nil || !strings.Contains(err.Error(), "index 0") {
		t.Errorf("SetDevices = %v, want an error naming the index", err)
	}
	if err := w.SetDevices(ctx, testGPUs(), nil); err != nil {
		t.Errorf("SetDevices = %v", err)
	}
}

// TestClusterRoleRules: the DRA plugin's rules and the pod informer's.
func TestClusterRoleRules(t *testing.T) {
	t.Parallel()
	rules := nodedra.ClusterRoleRules()
	has := func(group, res, verb string) bool {
		return slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool {
			return slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, res) && slices.Contains(r.Verbs, verb)
		})
	}
	for _, want := range [][3]string{
		{"resource.k8s.io", "resourceslices", "create"}, {"resource.k8s.io", "resourceslices", "update"},
		{"resource.k8s.io", "resourceslices", "delete"}, {"resource.k8s.io", "resourceclaims", "get"},
		{"", "pods", "list"}, {"", "pods", "watch"}, {"", "nodes", "get"},
	} {
		if !has(want[0], want[1], want[2]) {
			t.Errorf("ClusterRoleRules lacks %s %s/%s", want[2], want[0], want[1])
		}
	}
}

func taints(d resourcev1.Device) []string {
	var out []string
	for _, t := range d.Taints {
		out = append(out, t.Key)
	}
	return out
}

// generateNames makes the fake clientset name created ResourceSlices from their GenerateName,
// as the API server does (the fake leaves the name empty).
func generateNames(cs *fake.Clientset) {
	var n atomic.Int64
	cs.PrependReactor("create", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if s, ok := a.(k8stesting.CreateAction).GetObject().(*resourcev1.ResourceSlice); ok && s.Name == "" && s.GenerateName != "" {
			s.Name = s.GenerateName + strconv.FormatInt(n.Add(1), 10)
		}
		return false, nil, nil
	})
}

func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestRunPublishesTheSlice: an agent with a World publishes one ResourceSlice of every GPU
// (the device-plugin one tainted, PCI bus IDs from the source), cordons the DRA GPUs in the
// register annotation's patch and offers the kubelet only the device-plugin GPU.
func TestRunPublishesTheSlice(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	cs := clienttest.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "node-uid"}})
	generateNames(cs)
	k := kubelettest.Start(t)
	o := options(t, "0", "2", "GPU-3")
	o.Plugin.Profile = dra.HAMiProfile()
	w, err := nodedra.New(cs, testNode, o)
	if err != nil {
		t.Fatal(err)
	}
	a, err := nodeagent.New(cs, testNode, pciSource(testGPUs()), nodeagent.Options{
		Period: time.Hour, EventRecorder: &record.FakeRecorder{}, Kubelet: kubeletplugin.Options{PluginDir: k.Dir()}, DRA: w,
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
	pci := func(i int) string {
		a := slice.Spec.Devices[i].Attributes[dra.AttributePCIBusID]
		if a.StringValue == nil {
			return ""
		}
		return *a.StringValue
	}
	if pci(0) != "0000:07:00.0" || pci(3) != "0000:0a:00.0" || pci(1) != "" {
		t.Errorf("PCI bus IDs %q %q %q", pci(0), pci(1), pci(3))
	}
	numa := func(i int) string {
		a, ok := slice.Spec.Devices[i].Attributes[dra.AttributeNUMANode]
		if !ok || a.IntValue == nil {
			return "none"
		}
		return fmt.Sprint(*a.IntValue)
	}
	if numa(0) != "1" || numa(2) != "0" || numa(1) != "none" || numa(3) != "none" {
		t.Errorf("NUMA nodes %s %s %s %s, want 1 none 0 none", numa(0), numa(1), numa(2), numa(3))
	}
	waitFor(t, "the cordon", func() bool {
		n, err := cs.CoreV1().Nodes().Get(ctx, testNode, metav1.GetOptions{})
		return err == nil && n.Annotations["hami.io/device-cordon"] == "GPU-0,GPU-2,GPU-3"
	})
	waitFor(t, "the kubelet's device count", func() bool {
		r, ok := k.State().Resource("nvidia.com/gpu")
		return ok && len(r.Devices) == 10
	})
}
