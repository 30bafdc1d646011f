package drarobust_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// nsWatch keeps the claims and pods of one namespace through informers and says when they
// change (a channel closed and replaced at each event), so that many churns wait on one
// watch each instead of polling.
type nsWatch struct {
	claims cache.Indexer
	pods   cache.Indexer

	mu      sync.Mutex
	changed chan struct{}
}

func watchNamespace(tb testing.TB, ns string) *nsWatch {
	tb.Helper()
	f := informers.NewSharedInformerFactoryWithOptions(cp.AdminClient(), 0, informers.WithNamespace(ns))
	w := &nsWatch{changed: make(chan struct{})}
	notify := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { w.notify() },
		UpdateFunc: func(any, any) { w.notify() },
		DeleteFunc: func(any) { w.notify() },
	}
	ci := f.Resource().V1().ResourceClaims().Informer()
	pi := f.Core().V1().Pods().Informer()
	for _, i := range []cache.SharedIndexInformer{ci, pi} {
		if _, err := i.AddEventHandler(notify); err != nil {
			tb.Fatal(err)
		}
	}
	w.claims, w.pods = ci.GetIndexer(), pi.GetIndexer()
	ctx, cancel := context.WithCancel(context.WithoutCancel(tb.Context()))
	f.Start(ctx.Done())
	tb.Cleanup(func() {
		cancel()
		f.Shutdown()
	})
	if !cache.WaitForCacheSync(tb.Context().Done(), ci.HasSynced, pi.HasSynced) {
		tb.Fatal("the namespace's informers did not sync")
	}
	return w
}

func (w *nsWatch) notify() {
	w.mu.Lock()
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}

// claimAndPod returns the claim and pod ns/name from the caches (nil when absent).
func (w *nsWatch) claimAndPod(ns, claim, pod string) (*resourcev1.ResourceClaim, *corev1.Pod) {
	var c *resourcev1.ResourceClaim
	var p *corev1.Pod
	if o, ok, _ := w.claims.GetByKey(ns + "/" + claim); ok {
		c = o.(*resourcev1.ResourceClaim)
	}
	if o, ok, _ := w.pods.GetByKey(ns + "/" + pod); ok {
		p = o.(*corev1.Pod)
	}
	return c, p
}

// waitFor waits until cond holds, for at most harness.DRAWait.
func (w *nsWatch) waitFor(ctx context.Context, what string, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, harness.DRAWait)
	defer cancel()
	for {
		w.mu.Lock()
		changed := w.changed
		w.mu.Unlock()
		if cond() {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		}
	}
}

// churnClaim is the claim of one churn: 1 GiB and 1% of a GPU.
func churnClaim(ns, name string, p dra.Profile) *resourcev1.ResourceClaim {
	return harness.Claim(ns, name, p.Driver, harness.ClaimRequest{Count: 1, Memory: "1Gi", Cores: "1"})
}

// churnOnce is one claim's life: a pod, then its claim owned by it (dra.SetPodOwner), both
// scheduled by kube-scheduler, prepared through the kubelet's DRA manager, unprepared,
// released and deleted. It returns the time from the claim's create to the answer of
// NodePrepareResources (claimFirst: the claim is created before the pod, without an owner).
func (n *robustNode) churnOnce(tb testing.TB, w *nsWatch, name string, claimFirst bool) (churnTimes, error) {
	tb.Helper()
	ctx := tb.Context()
	ns := n.name
	released := false
	defer func() {
		if !released {
			cp.ReleaseClaim(tb, ns, name, name)
		}
	}()
	claimName := name
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeSelector:   map[string]string{corev1.LabelHostname: n.name},
			ResourceClaims: []corev1.PodResourceClaim{{Name: harness.ClaimRequestName, ResourceClaimName: &claimName}},
			Containers: []corev1.Container{{Name: "cuda", Image: "registry.invalid/cuda:0",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: harness.ClaimRequestName}}}}},
		},
	}
	claim := churnClaim(ns, name, n.profile)
	createClaim := func() error {
		_, err := cp.AdminClient().ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create claim %s: %w", name, err)
		}
		return nil
	}
	var start time.Time
	if claimFirst { // the baseline: no owner, the claim stays when the pod goes
		start = time.Now()
		if err := createClaim(); err != nil {
			return churnTimes{}, err
		}
	}
	pod, err := cp.AdminClient().CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return churnTimes{}, fmt.Errorf("create pod %s: %w", name, err)
	}
	if !claimFirst {
		if err := dra.SetPodOwner(claim, pod); err != nil {
			return churnTimes{}, err
		}
		start = time.Now()
		if err := createClaim(); err != nil {
			return churnTimes{}, err
		}
	}
	var bound *corev1.Pod
	if err := w.waitFor(ctx, "claim "+name+" allocated and reserved, its pod bound", func() bool {
		c, p := w.claimAndPod(ns, name, name)
		if c == nil || p == nil || c.Status.Allocation == nil || len(c.Status.ReservedFor) == 0 || p.Spec.NodeName == "" {
			return false
		}
		bound = p
		return true
	}); err != nil {
		return churnTimes{}, err
	}
	prepStart := time.Now()
	ids, err := n.prepare(ctx, bound)
	took := churnTimes{total: time.Since(start), prepare: time.Since(prepStart)}
	if err != nil {
		return churnTimes{}, err
	}
	if len(ids) != 1 || !strings.HasPrefix(ids[0], "k8s.hamireg.io/claim=") {
		return churnTimes{}, fmt.Errorf("pod %s: CDI IDs %q, want one of the claim's spec", name, ids)
	}
	if err := n.dra.Unprepare(ctx, bound); err != nil {
		return churnTimes{}, fmt.Errorf("unprepare pod %s: %w", name, err)
	}
	released = true
	cp.ReleaseClaim(tb, ns, name, name)
	return took, nil
}

// churnTimes are a churn's times: from the claim's create to the answer of
// NodePrepareResources, and the kubelet's Prepare call alone.
type churnTimes struct{ total, prepare time.Duration }

// churn runs count churns, workers at a time, and returns their claim-to-prepared times and
// their Prepare times, each sorted.
func (n *robustNode) churn(tb testing.TB, prefix string, count, workers int, claimFirst bool) (lat, prep []time.Duration) {
	tb.Helper()
	w := watchNamespace(tb, n.name)
	next := make(chan int)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				d, err := n.churnOnce(tb, w, fmt.Sprintf("%s-%04d", prefix, i), claimFirst)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					lat = append(lat, d.total)
					prep = append(prep, d.prepare)
				}
				mu.Unlock()
			}
		})
	}
	for i := range count {
		mu.Lock()
		failed := len(errs) > 0
		mu.Unlock()
		if failed {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		tb.Fatalf("%d of %d churns failed: %v", len(errs), count, err)
	}
	slices.Sort(lat)
	slices.Sort(prep)
	return lat, prep
}

// quantile is the q-quantile of sorted durations in milliseconds.
func quantile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return float64(sorted[int(q*float64(len(sorted)-1))]) / float64(time.Millisecond)
}

// orphans counts what the churn left: claims in the node's namespace and prepared claims on
// the node (checkpoint entries).
func (n *robustNode) orphans(tb testing.TB) (claims int, l leftovers) {
	tb.Helper()
	list, err := cp.AdminClient().ResourceV1().ResourceClaims(n.name).List(tb.Context(), metav1.ListOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	return len(list.Items), n.leftovers(tb)
}

// TestChurn: 1,000 claims created, scheduled, prepared, unprepared, released and deleted, 25
// at a time, leave no claim, checkpoint entry, CDI spec or state folder behind, and the
// stale-claim cleanup had nothing to do.
func TestChurn(t *testing.T) {
	t.Parallel()
	const churns = 1000
	n := startNode(t)
	n.startAgent(t, agentOptions{})
	lat, prep := n.churn(t, "churn", churns, 25, false)
	if len(lat) != churns {
		t.Fatalf("%d churns done, want %d", len(lat), churns)
	}
	claims, l := n.orphans(t)
	if claims != 0 || l != (leftovers{}) {
		t.Errorf("after %d churns: %d claims, %+v left; want none", churns, claims, l)
	}
	if got := n.currentPlugin().PreparedGPUs(); len(got) != 0 {
		t.Errorf("prepared GPUs after the churn: %v", got)
	}
	st := n.currentPlugin().Stats()
	if st.Prepared < churns || st.Unprepared < churns || st.StaleUnprepared != 0 || st.OrphansRemoved != 0 || st.OrphansAdopted != 0 {
		t.Errorf("plugin stats %+v: want %d prepared and unprepared, nothing for the cleanup", st, churns)
	}
	t.Logf("claim-to-prepared over %d churns, 25 at a time: p50 %.1f ms, p99 %.1f ms, max %.1f ms; the kubelet's Prepare alone: p50 %.1f ms, p99 %.1f ms",
		churns, quantile(lat, 0.5), quantile(lat, 0.99), quantile(lat, 1), quantile(prep, 0.5), quantile(prep, 0.99))
}

// BenchmarkClaimToPrepared runs b.N claim churns, one at a time, on one node and reports the
// time from a claim's create to the answer of NodePrepareResources through the kubelet's DRA
// manager (kube-scheduler's allocation and binding included), p50 and p99, and the claims the
// churn left behind (orphaned-claims: claims in the API plus prepared claims on the node), and
// prepare-p99-ms, the kubelet's Prepare call alone (the plugin's share). owned-by-pod creates the pod first and then its claim, owned by it (as the SDK does);
// claim-first, the baseline, creates the claim first, without an owner. Run it with
// -benchtime=100x or more.
func BenchmarkClaimToPrepared(b *testing.B) {
	for _, bc := range []struct {
		name       string
		claimFirst bool
	}{{"owned-by-pod", false}, {"claim-first", true}} {
		b.Run(bc.name, func(b *testing.B) {
			n := startNode(b)
			n.startAgent(b, agentOptions{})
			b.ResetTimer()
			lat, prep := n.churn(b, fmt.Sprintf("bench-%d", b.N), b.N, 1, bc.claimFirst)
			b.StopTimer()
			claims, l := n.orphans(b)
			b.ReportMetric(quantile(lat, 0.5), "claim-to-prepared-p50-ms")
			b.ReportMetric(quantile(lat, 0.99), "claim-to-prepared-p99-ms")
			b.ReportMetric(quantile(prep, 0.99), "prepare-p99-ms")
			b.ReportMetric(float64(claims+l.checkpoint), "orphaned-claims")
		})
	}
}
