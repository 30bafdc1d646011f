package preemption_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// requeueRig is one GPU node of one GPU (10000 MiB) and the scheduler whose pods use it.
type requeueRig struct {
	c    *cluster
	s    *scheduler
	ns   string
	node string
	n    int // trials run, for unique pod names
}

func newRequeueRig(tb testing.TB, start func(testing.TB) *scheduler) *requeueRig {
	tb.Helper()
	r := &requeueRig{c: newCluster(tb), s: start(tb), ns: namespace(tb, "requeue")}
	r.node, _ = r.c.node(tb, nodeOptions{gpus: 1, mem: 10000})
	return r
}

// trial schedules a blocker that takes the whole GPU (bound, allocated, lock released), then a
// waiting pod of 5000 MiB of the same priority, which the scheduler must reject for memory;
// after hold (while whatever the caller runs keeps going) it deletes the blocker with grace 0
// and returns how long after the delete call the waiting pod was seen bound. It leaves the
// node empty and unlocked.
func (r *requeueRig) trial(tb testing.TB, hold time.Duration) time.Duration {
	tb.Helper()
	r.n++
	i := r.n
	c := r.c
	blocker := create(tb, c.pod(podOptions{ns: r.ns, name: fmt.Sprintf("blocker-%d", i), scheduler: r.s.name, gpus: 1, mem: 10000}))
	if node, _ := c.waitBound(tb, r.ns, blocker.Name, 30*time.Second); node != r.node {
		tb.Fatalf("blocker bound to %s, want %s", node, r.node)
	}
	c.waitUnlocked(tb)
	waiter := create(tb, c.pod(podOptions{ns: r.ns, name: fmt.Sprintf("waiter-%d", i), scheduler: r.s.name, gpus: 1, mem: 5000}))
	c.waitUnschedulable(tb, r.ns, waiter.Name, 30*time.Second)
	if hold > 0 {
		time.Sleep(hold)
	}
	if p, err := c.pods.Pods(r.ns).Get(waiter.Name); err != nil || p.Spec.NodeName != "" {
		tb.Fatalf("waiter bound while the GPU was full: %v %v", p, err)
	}
	start := time.Now()
	deletePod(tb, r.ns, blocker.Name)
	node, at := c.waitBound(tb, r.ns, waiter.Name, 60*time.Second)
	if node != r.node {
		tb.Fatalf("waiter bound to %s, want %s", node, r.node)
	}
	deletePod(tb, r.ns, waiter.Name)
	c.waitGone(tb, types.NamespacedName{Namespace: r.ns, Name: blocker.Name}, types.NamespacedName{Namespace: r.ns, Name: waiter.Name})
	c.waitUnlocked(tb)
	return at.Sub(start)
}

// TestRequeue: a pod waiting for GPU memory on a full node is bound after its blocker is
// deleted, through the plugin (its AssignedPod/Delete hint requeues the pod) and through the
// SDK's extender with a stock kube-scheduler (the "Extender" rejector requeues on any event).
// The latency from the delete call to the bind is logged; BenchmarkRequeue measures it.
func TestRequeue(t *testing.T) {
	for name, start := range map[string]func(testing.TB) *scheduler{
		"plugin":   func(tb testing.TB) *scheduler { return startPlugin(tb, nil) },
		"extender": startExtender,
	} {
		t.Run(name, func(t *testing.T) {
			r := newRequeueRig(t, start)
			took := r.trial(t, 0)
			t.Logf("%s: waiting pod bound %v after the blocker's delete", name, took.Round(time.Millisecond))
			if name == "plugin" && took > 5*time.Second {
				t.Errorf("plugin: waiting pod bound %v after the delete, want well under 5 s (goal 1 s)", took)
			}
		})
	}
}

// churn patches a label of the given nodes (not the test's GPU nodes) every interval until
// the returned stop is called: Node/UpdateNodeLabel events that concern no GPU pod.
func churn(tb testing.TB, nodes []string, interval time.Duration) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(tb.Context()))
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			patch := fmt.Appendf(nil, `{"metadata":{"labels":{"e2e.hamireg.io/churn":%q}}}`, strconv.Itoa(i))
			_, _ = cp.AdminClient().CoreV1().Nodes().Patch(ctx, nodes[i%len(nodes)], types.MergePatchType, patch, metav1.PatchOptions{})
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}
}
