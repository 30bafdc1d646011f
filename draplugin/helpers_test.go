package draplugin

import (
	"context"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/hamicore"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(lockHolderEnv); dir != "" {
		os.Exit(holdLock(dir)) // a child of TestLockAcrossProcesses
	}
	goleak.VerifyTestMain(m)
}

const (
	testNode    = "node-a"
	testNodeUID = types.UID("node-a-uid")
)

// testProfile is the SDK's profile.
func testProfile() dra.Profile { return dra.SDKProfile() }

// testGPUs are two healthy 40 GiB GPUs of a node.
func testGPUs() []annotation.Device {
	return []annotation.Device{
		{ID: "GPU-00000000-0000-0000-0000-000000000000", Index: 0, Count: 10, Devmem: 40960, Devcore: 100, Type: "NVIDIA-A100-SXM4-40GB", Mode: "hami-core", Health: true},
		{ID: "GPU-11111111-1111-1111-1111-111111111111", Index: 1, Count: 10, Devmem: 40960, Devcore: 100, Type: "NVIDIA-A100-SXM4-40GB", Mode: "hami-core", Health: true},
	}
}

// testDevices are dra.Devices of gpus.
func testDevices(tb testing.TB, p dra.Profile, gpus []annotation.Device) []resourcev1.Device {
	tb.Helper()
	devs, err := dra.Devices(gpus, dra.Options{Profile: p})
	if err != nil {
		tb.Fatalf("dra.Devices: %v", err)
	}
	return devs
}

// sliceLog counts the ResourceSlice controller's "Completed comparison" lines (V(5)), so a
// test knows that the controller diffed the pool.
type sliceLog struct {
	mu    sync.Mutex
	syncs []string
}

func (l *sliceLog) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		if strings.Contains(args, `"msg"="Completed comparison"`) {
			l.mu.Lock()
			l.syncs = append(l.syncs, args)
			l.mu.Unlock()
		}
	}, funcr.Options{Verbosity: 5})
}

func (l *sliceLog) count() (int, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.syncs) == 0 {
		return 0, ""
	}
	return len(l.syncs), l.syncs[len(l.syncs)-1]
}

// newClient is a fake clientset with the node and the API server's GenerateName.
func newClient(objs ...runtime.Object) *fake.Clientset {
	objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: testNodeUID}})
	c := fake.NewClientset(objs...)
	var mu sync.Mutex
	n := 0
	c.PrependReactor("create", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		s := a.(k8stesting.CreateAction).GetObject().(*resourcev1.ResourceSlice)
		if s.Name == "" && s.GenerateName != "" {
			s.Name = s.GenerateName + strconv.Itoa(n)
			n++
		}
		return false, nil, nil
	})
	return c
}

// testOptions are options on temp dirs for client.
func testOptions(tb testing.TB, client *fake.Clientset) Options {
	tb.Helper()
	dir := tb.TempDir()
	return Options{
		Profile:        testProfile(),
		Client:         client,
		NodeName:       testNode,
		RegistrarDir:   path.Join(dir, "reg"),
		PluginDir:      path.Join(dir, "plugin"),
		CDIDir:         path.Join(dir, "cdi"),
		Env:            hamicore.EnvOptions{HookPath: path.Join(dir, "hook")},
		SliceSyncDelay: -1,
	}
}

func newPlugin(tb testing.TB, opts Options) *Plugin {
	tb.Helper()
	p, err := New(opts)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return p
}

// run runs p until the test ends; it returns the log of its slice controller.
func run(tb testing.TB, p *Plugin) *sliceLog {
	tb.Helper()
	l := &sliceLog{}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), l.logger()))
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("Run: %v", err)
		}
	})
	return l
}

// waitFor polls cond until it holds or 30 s passed.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// testClaim is an allocated claim of our driver with one result per device, each consuming
// memory and cores.
func testClaim(uid, name string, driver string, memory, cores string, devices ...string) *resourcev1.ResourceClaim {
	c := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(uid)},
		Status:     resourcev1.ResourceClaimStatus{Allocation: &resourcev1.AllocationResult{}},
	}
	for i, d := range devices {
		share := types.UID(fmt.Sprintf("share-%s-%d", uid, i))
		r := resourcev1.DeviceRequestAllocationResult{Request: "gpu", Driver: driver, Pool: testNode, Device: d, ShareID: &share}
		if memory != "" {
			r.ConsumedCapacity = map[resourcev1.QualifiedName]resource.Quantity{
				dra.CapacityMemory: resource.MustParse(memory),
				dra.CapacityCores:  resource.MustParse(cores),
			}
		}
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, r)
	}
	return c
}
