package nodedra_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/clienttest"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/nodeagent/nodedra"
)

// scansPerHour is a node-hour of scans at the default period (30 s).
const scansPerHour = int(time.Hour / nodeagent.DefaultPeriod)

// sliceWrites counts the ResourceSlice writes the fake clientset has seen.
func sliceWrites(cs *fake.Clientset) int {
	n := 0
	for _, a := range cs.Actions() {
		if a.GetResource().Resource != "resourceslices" {
			continue
		}
		switch a.GetVerb() {
		case "create", "update", "patch", "delete":
			n++
		}
	}
	return n
}

// BenchmarkSliceWrites: the ResourceSlice writes of a node-hour in steady state (every scan
// finds the same GPUs). agent: the node agent with the real DRA plugin, driven by a fake clock
// at the default 30 s period (goal 0, as the register writer); baseline: the naive way, a
// fresh slice written at every scan (120).
func BenchmarkSliceWrites(b *testing.B) {
	b.Run("agent", func(b *testing.B) {
		_, ctx := ktesting.NewTestContext(b) // the agent's logs go to the benchmark's log, not between its figures
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		cs := clienttest.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "node-uid"}})
		generateNames(cs)
		k := kubelettest.Start(b)
		clk := testingclock.NewFakeClock(time.Unix(0, 0))
		w, err := nodedra.New(cs, testNode, options(b))
		if err != nil {
			b.Fatal(err)
		}
		a, err := nodeagent.New(cs, testNode, pciSource(testGPUs()), nodeagent.Options{
			Clock: clk, EventRecorder: &record.FakeRecorder{},
			Kubelet: kubeletplugin.Options{PluginDir: k.Dir()},
			DRA:     w,
		})
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				b.Errorf("Run = %v", err)
			}
		}()
		poll := func(what string, cond func() bool) {
			for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					b.Fatalf("timed out waiting for %s", what)
				}
			}
		}
		poll("the first slice", func() bool { return w.Plugin().Stats().SliceCreates == 1 })
		first := sliceWrites(cs)
		b.ResetTimer()
		for range b.N {
			for range scansPerHour {
				// One period on: the other parts' timers (cleanup, retries) make HasWaiters
				// true before the scan loop has re-armed its own, so step again until it scans.
				scans := a.Stats().Scans
				poll("a scan", func() bool {
					clk.Step(nodeagent.DefaultPeriod)
					time.Sleep(time.Millisecond)
					return a.Stats().Scans > scans
				})
			}
		}
		b.StopTimer()
		time.Sleep(100 * time.Millisecond) // let the slice controller act on the last scans
		b.ReportMetric(float64(sliceWrites(cs)-first)/float64(b.N), "slice-writes-per-node-hour")
	})
	b.Run("baseline", func(b *testing.B) {
		ctx := b.Context()
		cs := clienttest.NewClientset()
		p := dra.SDKProfile()
		before := sliceWrites(cs)
		for range b.N {
			for i := range scansPerHour {
				devs, err := dra.Devices(testGPUs(), dra.Options{Profile: p})
				if err != nil {
					b.Fatal(err)
				}
				slice := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: testNode + "-" + p.Driver},
					Spec: resourcev1.ResourceSliceSpec{Driver: p.Driver, NodeName: ptrTo(testNode), Devices: devs,
						Pool: resourcev1.ResourcePool{Name: testNode, Generation: int64(i), ResourceSliceCount: 1}}}
				if i == 0 {
					_, err = cs.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{})
				} else {
					_, err = cs.ResourceV1().ResourceSlices().Update(ctx, slice, metav1.UpdateOptions{})
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			// The next hour starts over (not counted: a test artifact, not a write of the hour).
			if err := cs.Tracker().Delete(resourcev1.SchemeGroupVersion.WithResource("resourceslices"), "", testNode+"-"+p.Driver); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(sliceWrites(cs)-before)/float64(b.N), "baseline-slice-writes-per-node-hour")
	})
}

func ptrTo[T any](v T) *T { return &v }
