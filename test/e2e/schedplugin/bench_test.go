package schedplugin_test

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// BenchmarkThroughput measures pods bound per second by examples/scheduler on 8 API-object
// GPU nodes, 200 pods per iteration, created at once: "hami-gpu" are 1-GPU 1000 MiB pods of
// the HAMiGPU profile, counted once bound and allocated (the fake allocator plays HAMi's
// device plugin, so each node's lock is the floor); "default-plain" are the same pods without
// GPUs in the same binary's default-scheduler profile, the baseline of the same run.
//
//	go test -run '^$' -bench Throughput -benchtime 3x ./schedplugin/
func BenchmarkThroughput(b *testing.B) {
	const nodes, pods = 8, 200
	test := harness.UniqueName("bench")
	for i := range nodes {
		apiGPUNode(b, test, fmt.Sprintf("%s-%d", test, i))
	}
	startFakeAllocator(b, test)
	sched := startScheduler(b, map[string]any{"nodeSchedulerPolicy": "spread"})
	for _, mode := range []struct {
		name, sched string
		ask         map[string]int64
	}{
		{"hami-gpu", sched, map[string]int64{resGPU: 1, resMem: 1000}},
		{"default-plain", corev1.DefaultSchedulerName, nil},
	} {
		b.Run(mode.name, func(b *testing.B) {
			var total time.Duration
			for i := range b.N {
				b.StopTimer()
				ns := namespace(b, fmt.Sprintf("%s-%d", mode.name, i))
				batch := make([]*corev1.Pod, pods)
				for j := range batch {
					batch[j] = gpuPod(ns, fmt.Sprintf("p-%03d", j), mode.sched, test, mode.ask)
				}
				b.StartTimer()
				start := time.Now()
				createPods(b, batch)
				harness.Eventually(b, fmt.Sprintf("%d pods bound", pods), 5*time.Minute, func() bool {
					list, err := cp.AdminClient().CoreV1().Pods(ns).List(b.Context(), metav1.ListOptions{ResourceVersion: "0"})
					if err != nil || len(list.Items) != pods {
						return false
					}
					for _, p := range list.Items {
						if p.Spec.NodeName == "" || (mode.ask != nil && p.Annotations[allocation.KeyBindPhase] != string(allocation.PhaseSuccess)) {
							return false
						}
					}
					return true
				})
				total += time.Since(start)
				b.StopTimer()
				// Free the nodes for the next iteration.
				if err := cp.AdminClient().CoreV1().Pods(ns).DeleteCollection(b.Context(), metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{}); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(pods*b.N)/total.Seconds(), "pods/s")
		})
	}
}
