package nodelock_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// BenchmarkAcquireRelease measures one lock cycle on a free node against a real
// kube-apiserver, the way a bind followed by the device plugin's release does it: for this
// SDK's Locker ("hamireg": GET + PATCH to lock, GET + PATCH to unlock) and for the requests
// HAMi v2.9.0 sends for the same cycle ("hami-baseline": LockNode's GET, SetNodeLock's GET
// and its GET + PATCH try; ReleaseNodeLock's GET and its GET + PATCH try, as recorded in
// allocate.json), side by side. Reported: lock-cycle-p99-ms and requests/op.
func BenchmarkAcquireRelease(b *testing.B) {
	b.Run("hamireg", func(b *testing.B) {
		ctx := klog.NewContext(b.Context(), logr.Discard())
		node, pod := benchNode(b)
		l := newLocker(b, cp.AdminClient(), nodelock.Options{})
		lockCycles(b, 4, func() error {
			if err := l.Acquire(ctx, node, pod); err != nil {
				return err
			}
			return l.Release(ctx, node, pod)
		})
	})
	b.Run("hami-baseline", func(b *testing.B) {
		ctx := b.Context()
		node, pod := benchNode(b)
		nodes := cp.AdminClient().CoreV1().Nodes()
		// write sends gets GETs of the Node and a merge patch with the last one's version.
		write := func(gets int, value *string) error {
			for range gets - 1 { // the checks before HAMi's retry loop
				if _, err := nodes.Get(ctx, node, metav1.GetOptions{}); err != nil {
					return err
				}
			}
			n, err := nodes.Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return err
			}
			body, _ := json.Marshal(map[string]any{"metadata": map[string]any{
				"annotations": map[string]*string{nodelock.Key: value}, "resourceVersion": n.ResourceVersion,
			}})
			_, err = nodes.Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{})
			return err
		}
		lockCycles(b, 7, func() error {
			v := nodelock.NewLock(time.Now(), pod).String()
			if err := write(3, &v); err != nil { // LockNode, SetNodeLock, its try
				return err
			}
			return write(2, nil) // ReleaseNodeLock, its try
		})
	})
}

// benchNode creates a Node for one benchmark and names the pod that locks it (the pod need
// not exist: the node is free in every cycle).
func benchNode(b *testing.B) (string, types.NamespacedName) {
	b.Helper()
	node := harness.UniqueName("lock-bench")
	createNode(b, node, map[string]string{"hami.io/node-nvidia-register": "[]"})
	return node, types.NamespacedName{Namespace: "default", Name: "bench-pod"}
}

// lockCycles runs cycle b.N times and reports the 99th percentile of its duration.
func lockCycles(b *testing.B, requests int, cycle func() error) {
	b.Helper()
	durations := make([]time.Duration, 0, b.N)
	for b.Loop() {
		start := time.Now()
		if err := cycle(); err != nil {
			b.Fatal(err)
		}
		durations = append(durations, time.Since(start))
	}
	slices.Sort(durations)
	p99 := durations[min(len(durations)-1, len(durations)*99/100)]
	b.ReportMetric(float64(p99.Microseconds())/1000, "lock-cycle-p99-ms")
	b.ReportMetric(float64(requests), "requests/op")
}
