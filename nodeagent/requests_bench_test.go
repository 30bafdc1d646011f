package nodeagent

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/hamireg/hamireg/clienttest"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/kubeletplugin/kubelettest"
)

// preparesPerHour is the DRA Prepare rate of the benchmark's node-hour: one claim every five
// minutes.
const preparesPerHour = 12

// countRequests counts every request the fake clientset answers (watches once, when opened).
func countRequests(cs *fake.Clientset) *atomic.Int64 {
	var n atomic.Int64
	count := func(k8stesting.Action) (bool, runtime.Object, error) { n.Add(1); return false, nil, nil }
	cs.PrependReactor("*", "*", count)
	cs.PrependWatchReactor("*", func(k8stesting.Action) (bool, watch.Interface, error) { n.Add(1); return false, nil, nil })
	return &n
}

// BenchmarkAPIRequests: the API requests of a node agent with MIG and DRA on, for one
// simulated node-hour in steady state (the start-up's LISTs, WATCHes and first write
// excluded: reported as startup-requests), driven by a fake clock: the MIG release every 5 s
// (720 times) and 12 DRA Prepares, whose ownership check reads the node's pods. agent: the
// agent reads the pods from its one node-scoped informer (goal ≤ 12, as the register writer
// alone). baseline: the agent as it was, a LIST of the node's pods at every MIG release and
// every Prepare beside the same register writer.
func BenchmarkAPIRequests(b *testing.B) {
	b.Run("agent", func(b *testing.B) { benchRequests(b, false) })
	b.Run("baseline", func(b *testing.B) { benchRequests(b, true) })
}

func benchRequests(b *testing.B, baseline bool) {
	b.Helper()
	_, ctx := ktesting.NewTestContext(b)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pods := []runtime.Object{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}}}
	for _, name := range []string{"a", "b", "c"} {
		p := gpuPod(name, "main")
		p.Spec.NodeName, p.Status.Phase = testNode, corev1.PodRunning
		pods = append(pods, p)
	}
	cs := clienttest.NewClientset(pods...)
	requests := countRequests(cs)
	k := kubelettest.Start(b)
	clk := testingclock.NewFakeClock(time.Unix(0, 0))
	fm := newFakeMIG(migGPU0, migGPU1)
	world := &fakeDRA{gpus: []string{"GPU-plain"}}
	opts := Options{Clock: clk, EventRecorder: &record.FakeRecorder{}, Kubelet: kubeletplugin.Options{PluginDir: k.Dir()}}
	if !baseline { // the baseline's MIG and DRA are its LISTs below
		opts.MIG, opts.DRA = fm, world
	}
	a, err := New(cs, testNode, staticSource(migDevices()), opts)
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
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(100 * time.Microsecond) {
			if time.Now().After(deadline) {
				b.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	releases := func() int {
		fm.mu.Lock()
		defer fm.mu.Unlock()
		return len(fm.calls)
	}
	poll("the registration", func() bool { _, ok := k.State().Resource(gpuResource); return ok && a.writer.Stats().Writes > 0 })
	if !baseline {
		poll("the DRA world", func() bool { return world.runHost() != nil && releases() > 0 })
	}
	startup := requests.Load()
	selector := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", testNode).String()}
	steps := int(time.Hour / DefaultMIGReconcilePeriod)
	b.ResetTimer()
	for range b.N {
		for i := range steps {
			n := releases()
			clk.Step(DefaultMIGReconcilePeriod)
			if baseline {
				if _, err := cs.CoreV1().Pods("").List(ctx, selector); err != nil { // the old liveClaims
					b.Fatal(err)
				}
			} else {
				poll("a MIG release", func() bool { return releases() > n })
			}
			if i%(steps/preparesPerHour) != 0 {
				continue
			}
			if baseline {
				if _, err := cs.CoreV1().Pods("").List(ctx, selector); err != nil { // the old refuse
					b.Fatal(err)
				}
			} else if err := world.runHost().HeldByHAMi(ctx, []string{"GPU-plain"}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	time.Sleep(10 * time.Millisecond) // let a last write land before counting
	b.ReportMetric(float64(requests.Load()-startup)/float64(b.N), "requests/node-hour")
	b.ReportMetric(float64(startup), "startup-requests")
}
