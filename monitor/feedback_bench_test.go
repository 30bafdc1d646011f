package monitor

import (
	"fmt"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/hamicore/region"
)

const (
	fbBenchContainers = 110
	fbBenchGPUs       = 8
)

// benchNode writes fbBenchContainers regions, each on all fbBenchGPUs GPUs, priorities 0, 1
// and 2 in turn, with region.WriteFile.
func benchNode(b *testing.B) (*fbNode, []*corev1.Pod) {
	b.Helper()
	node := newFBNode(b)
	gpus := make([]string, fbBenchGPUs)
	for g := range gpus {
		gpus[g] = fmt.Sprintf("GPU-%08x-1111-2222-3333-444455556666", g)
	}
	var pods []*corev1.Pod
	for i := range fbBenchContainers {
		uid := fmt.Sprintf("7e1b0000-0000-4000-8000-%012d", i)
		node.putRegion(b, uid+"_main", fbRegion(b, gpus, int32(i%3), 2, 1))
		pods = append(pods, fbPod(uid, fmt.Sprintf("pod-%d", i), []string{"main"}, nil))
	}
	return node, pods
}

// BenchmarkFeedbackRound is one priority-feedback round on a node of 110 containers, each
// on 8 GPUs: every region read fresh from its file (region.ReadFile, what the monitor's scan
// gives a round), the decisions, and the writes (every container launched a kernel since
// the last round, so each has recent_kernel written, the lower priorities are blocked).
// hami-mmap is the baseline: HAMi's way, every region mapped once and its words read and
// stored in place, the table keyed by the 96-byte UUID string (feedback_mmap_bench_test.go).
func BenchmarkFeedbackRound(b *testing.B) {
	b.Run("hamireg", func(b *testing.B) {
		node, pods := benchNode(b)
		m := newFBMonitor(b, node.root, pods, Options{})
		ctx := klog.NewContext(b.Context(), logr.Discard())
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			n++
			b.StopTimer()
			for _, d := range node.dirs {
				node.setField(b, d, region.FieldRecentKernel, 2)
			}
			b.StartTimer()
			cs := node.containers(b, nil, pods)
			m.feedback(ctx, cs)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n)/1e6, "round-ms")
	})
	// reads is the part of hamireg that is the fresh read of the 110 regions alone.
	b.Run("reads", func(b *testing.B) {
		node, pods := benchNode(b)
		n := 0
		for b.Loop() {
			n++
			node.containers(b, nil, pods)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n)/1e6, "round-ms")
	})
	b.Run("hami-mmap", benchHAMiMmap)
}
