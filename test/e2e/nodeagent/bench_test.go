package nodeagent_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/allocation/allocationtest"
	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// podsPerOp is the number of pods one benchmark op binds and allocates.
const podsPerOp = 20

// BenchmarkAllocate binds 20 one-GPU pods to one node one after another, as HAMi's
// scheduler does (filter annotations, node lock, bind-phase, Binding), and admits each
// through the kubelet's device manager (ManagerImpl.Allocate, which calls the plugin's
// GetPreferredAllocation and Allocate, then GetDeviceRunContainerOptions). It reports:
//
//   - lock-held-p99-ms: from just before the bind's lock write to the moment a watch of the
//     Node shows the lock gone. The next GPU pod can be bound to the node only then. Goal
//     < 500 ms. Baseline: a plugin that registers but ignores the protocol never removes the
//     lock, so it is held until HAMi's --node-lock-timeout, 300,000 ms, and the node takes
//     one GPU pod per 5 minutes (spec hami-allocation.md 8.1).
//   - allocate-p99-ms: one Allocate of the kubelet's device manager for one container,
//     round trip to the device-manager process included. Goal < 50 ms.
//
// The plugin runs with its default client limits (--kube-qps 50, --kube-burst 100) and,
// for comparison in the same run, with limits that never throttle: one Allocate sends about
// nine requests (GetPreferredAllocation: 2 GETs; Allocate: 2 GETs, 2 pod patches, the lock's
// GET and patch, an Event), so 20 pods back to back exhaust the default burst and the last
// ones wait for the client's rate limiter.
//
// One op is 20 pods; run it with -benchtime=1x (each op allocates 20 of the node's 80
// devices, and the kubelet keeps them).
func BenchmarkAllocate(b *testing.B) {
	b.Run("default-client", func(b *testing.B) { benchmarkAllocate(b) })
	b.Run("unthrottled-client", func(b *testing.B) { benchmarkAllocate(b, "--kube-qps=10000", "--kube-burst=10000") })
}

func benchmarkAllocate(b *testing.B, args ...string) {
	b.Helper()
	f := newFixture(b, args...)
	ctx := b.Context()
	gone := watchLockRemovals(b, f.Name)
	sched := allocationtest.NewScheduler(cp.AdminClient(), allocationtest.Options{})
	var held, alloc []time.Duration
	for op := 0; b.Loop(); op++ {
		for i := range podsPerOp {
			pod := f.CreatePod(b, fmt.Sprintf("bench-%d-%d", op, i), harness.Ctr{Name: "cuda", GPUs: 1})
			pod, err := sched.Filter(ctx, pod, f.Name, allocation.PodDevices{{f.Share(uint(i%gpus), 1000, 10)}})
			if err != nil {
				b.Fatal(err)
			}
			locked := time.Now()
			pod, err = sched.Bind(ctx, pod, f.Name)
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			if _, err := f.DM.Allocate(ctx, pod, "cuda"); err != nil {
				b.Fatalf("allocate pod %s: %v", pod.Name, err)
			}
			alloc = append(alloc, time.Since(start))
			select {
			case at := <-gone:
				held = append(held, at.Sub(locked))
			case <-time.After(30 * time.Second):
				b.Fatalf("the lock of pod %s was not removed", pod.Name)
			}
		}
	}
	b.ReportMetric(quantileMs(held, 0.99), "lock-held-p99-ms")
	b.ReportMetric(quantileMs(alloc, 0.99), "allocate-p99-ms")
	b.ReportMetric(quantileMs(held, 0.5), "lock-held-p50-ms")
	b.ReportMetric(quantileMs(alloc, 0.5), "allocate-p50-ms")
}

// watchLockRemovals watches the Node and sends the time of every removal of its lock.
func watchLockRemovals(tb testing.TB, node string) <-chan time.Time {
	tb.Helper()
	ctx, cancel := context.WithCancel(tb.Context())
	w, err := cp.AdminClient().CoreV1().Nodes().Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", node).String(),
	})
	if err != nil {
		tb.Fatal(err)
	}
	gone := make(chan time.Time, podsPerOp)
	var wg sync.WaitGroup
	tb.Cleanup(func() {
		cancel()
		w.Stop()
		wg.Wait()
	})
	wg.Go(func() {
		locked := false
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok || ev.Type == watch.Error {
				continue
			}
			_, present := n.Annotations[nodelock.Key]
			if locked && !present {
				select {
				case gone <- time.Now():
				case <-ctx.Done():
					return
				}
			}
			locked = present
		}
	})
	return gone
}

// quantileMs is the q-quantile (nearest rank) of d, in milliseconds; with 20 samples the
// 0.99-quantile is the slowest.
func quantileMs(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := max(int(math.Ceil(q*float64(len(s))))-1, 0)
	return float64(s[i].Microseconds()) / 1000
}
