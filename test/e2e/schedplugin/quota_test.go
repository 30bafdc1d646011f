package schedplugin_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// The ResourceQuota keys HAMi enforces, with the chart's resource names.
var quotaMemKey, quotaCoresKey = allocation.QuotaKeys(allocation.Config{})

// 150 GPU pods from 3 namespaces under ResourceQuotas, created at once on 3 API-object GPU
// nodes whose locks a fake allocator releases as HAMi's device plugin does: "a" is bounded
// by its GPU-memory quota, "b" by the GPUs' memory (every pod asks 30000 of a GPU's 40960
// MiB), "c" by its GPU-cores quota. Once every pod is bound and allocated or Unschedulable:
// no GPU holds more pods, memory or cores than it registered, no namespace's bound pods hold
// more than its quota, and the quota-bounded namespaces are full.
func TestManyPodsUnderQuotaNeverOvercommit(t *testing.T) {
	t.Parallel()
	const perNS, nodes = 50, 3
	test := harness.UniqueName("quota")
	registered := map[string]annotation.Device{} // GPU UUID → its registration
	gpuNode := map[string]string{}               // GPU UUID → node
	for i := range nodes {
		node := fmt.Sprintf("%s-%d", test, i)
		for _, d := range apiGPUNode(t, test, node) {
			registered[d.ID], gpuNode[d.ID] = d, node
		}
	}
	alloc := startFakeAllocator(t, test)
	sizesA := []int64{500, 800, 1200, 2000}
	specs := []struct {
		prefix string
		hard   map[string]int64
		ask    func(j int) map[string]int64
	}{
		{"quota-a", map[string]int64{quotaMemKey: 12000}, func(j int) map[string]int64 {
			return map[string]int64{resGPU: 1, resMem: sizesA[j%len(sizesA)]}
		}},
		{"quota-b", map[string]int64{quotaMemKey: 10_000_000}, func(int) map[string]int64 {
			return map[string]int64{resGPU: 1, resMem: 30000}
		}},
		{"quota-c", map[string]int64{quotaMemKey: 100_000, quotaCoresKey: 400}, func(int) map[string]int64 {
			return map[string]int64{resGPU: 1, resMem: 1000, resCores: 20}
		}},
	}
	namespaces := make([]string, len(specs))
	for i, sp := range specs {
		namespaces[i] = namespace(t, sp.prefix)
		rl := corev1.ResourceList{}
		for k, v := range sp.hard {
			rl[corev1.ResourceName(k)] = *resource.NewQuantity(v, resource.DecimalSI)
		}
		rq := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "gpu-quota", Namespace: namespaces[i]}, Spec: corev1.ResourceQuotaSpec{Hard: rl}}
		if _, err := cp.AdminClient().CoreV1().ResourceQuotas(namespaces[i]).Create(t.Context(), rq, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Spread nodes, so that the binds do not queue on one node's lock.
	sched := startScheduler(t, map[string]any{"nodeSchedulerPolicy": "spread"})

	var pods []*corev1.Pod
	for j := range perNS {
		for i, sp := range specs {
			pods = append(pods, gpuPod(namespaces[i], fmt.Sprintf("p-%02d", j), sched, test, sp.ask(j)))
		}
	}
	start := time.Now()
	createPods(t, pods)

	var settled map[string][]*corev1.Pod // namespace → its pods
	harness.Eventually(t, "every pod allocated or Unschedulable", 4*time.Minute, func() bool {
		settled = map[string][]*corev1.Pod{}
		for _, ns := range namespaces {
			list, err := cp.AdminClient().CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
			if err != nil || len(list.Items) != perNS {
				return false
			}
			for i := range list.Items {
				p := &list.Items[i]
				if p.Spec.NodeName != "" && p.Annotations[allocation.KeyBindPhase] != string(allocation.PhaseSuccess) {
					return false
				}
				if _, ok := unschedulable(p); p.Spec.NodeName == "" && !ok {
					return false
				}
				settled[ns] = append(settled[ns], p)
			}
		}
		return true
	})
	t.Logf("150 pods settled in %v", time.Since(start).Round(time.Millisecond))

	used := map[string]allocation.Usage{} // GPU UUID → what the pods hold
	for i, ns := range namespaces {
		var held allocation.QuotaAmount
		bound := 0
		for _, p := range settled[ns] {
			node, counts := allocation.PodNode(p)
			if p.Spec.NodeName == "" {
				if counts {
					t.Errorf("pod %s/%s Unschedulable with %s = %q: a reservation left behind", ns, p.Name, allocation.KeyNode, node)
				}
				continue
			}
			bound++
			if node != p.Spec.NodeName {
				t.Errorf("pod %s/%s bound to %s, %s = %q", ns, p.Name, p.Spec.NodeName, allocation.KeyNode, node)
			}
			pd, _, err := allocation.Allocated(p, annotation.NVIDIA(), allocation.VersionMaster)
			if err != nil {
				t.Errorf("pod %s/%s: %v", ns, p.Name, err)
				continue
			}
			for gpu, u := range pd.Usage() {
				if gpuNode[gpu] != node {
					t.Errorf("pod %s/%s holds GPU %s, not of its node %s", ns, p.Name, gpu, node)
				}
				used[gpu] = used[gpu].Add(u)
			}
			held = held.Add(quotaAsk(p))
		}
		lim := allocation.QuotaAmount{Memory: specs[i].hard[quotaMemKey], Cores: specs[i].hard[quotaCoresKey]}
		t.Logf("%s: %d of %d pods bound, holding %d MiB and %d %% cores (quota %d MiB, %d %%)", ns, bound, perNS, held.Memory, held.Cores, lim.Memory, lim.Cores)
		if held.Memory > lim.Memory || (lim.Cores > 0 && held.Cores > lim.Cores) {
			t.Errorf("%s: bound pods hold %+v, over the quota %+v", ns, held, lim)
		}
		switch specs[i].prefix {
		case "quota-a":
			if largest := sizesA[len(sizesA)-1]; held.Memory <= lim.Memory-largest {
				t.Errorf("%s: the quota has %d MiB left, pods asking at most %d MiB stay Pending", ns, lim.Memory-held.Memory, largest)
			}
		case "quota-c":
			if held.Cores <= lim.Cores-20 {
				t.Errorf("%s: the quota has %d %% cores left, pods asking 20 %% stay Pending", ns, lim.Cores-held.Cores)
			}
		}
		if bound == perNS {
			t.Errorf("%s: every pod bound; the test wants each namespace short of room", ns)
		}
	}
	// The allocator's counter moves after its last write: every bound pod was served by it.
	boundAll := 0
	for _, ns := range namespaces {
		for _, p := range settled[ns] {
			if p.Spec.NodeName != "" {
				boundAll++
			}
		}
	}
	harness.Eventually(t, fmt.Sprintf("the fake allocator to count %d pods", boundAll), 10*time.Second, func() bool {
		return alloc.allocated.Load() == int64(boundAll)
	})
	if err := alloc.errorsSeen(); err != nil {
		t.Errorf("fake allocator: %v", err)
	}
	for gpu, u := range used {
		d := registered[gpu]
		if u.Used > int64(d.Count) || u.Usedmem > int64(d.Devmem) || u.Usedcores > int64(d.Devcore) {
			t.Errorf("GPU %s over-committed: %d pods, %d MiB, %d %% cores (registered %d, %d MiB, %d %%)", gpu, u.Used, u.Usedmem, u.Usedcores, d.Count, d.Devmem, d.Devcore)
		}
	}
}

// quotaAsk is what a pod counts against its namespace's GPU quota: memory and cores of each
// container times its GPU count.
func quotaAsk(p *corev1.Pod) allocation.QuotaAmount {
	var out allocation.QuotaAmount
	for _, r := range allocation.Requests(p, allocation.Config{}).Containers {
		out = out.Add(allocation.QuotaAmount{Memory: int64(r.Memory) * int64(r.Count), Cores: int64(r.Cores) * int64(r.Count)})
	}
	return out
}

// unschedulable reports whether kube-scheduler marked the pod PodScheduled=False/Unschedulable,
// and returns the condition's message.
func unschedulable(p *corev1.Pod) (string, bool) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return c.Message, true
		}
	}
	return "", false
}

// createPods creates pods with 8 concurrent clients and returns when all are created.
func createPods(tb testing.TB, pods []*corev1.Pod) {
	tb.Helper()
	work := make(chan *corev1.Pod)
	errs := make(chan error, len(pods))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for p := range work {
				if _, err := cp.AdminClient().CoreV1().Pods(p.Namespace).Create(tb.Context(), p, metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("create pod %s/%s: %w", p.Namespace, p.Name, err)
				}
			}
		})
	}
	for _, p := range pods {
		work <- p
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
}
