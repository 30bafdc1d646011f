package controlplane_test

import (
	"fmt"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/hamireg/hamireg/test/e2e/harness"
)

// 2,000 Nodes (a large HAMi cluster) are created with the raised client QPS and a
// label-selected Node informer syncs all of them: the scale the scheduler-side cache and
// the diagnose tool are tested at.
func TestTwoThousandNodesAndAnInformerSyncs(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const count = 2000
	prefix := harness.UniqueName("scale")
	set := map[string]string{harness.TestLabel: prefix}

	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for i := range count {
		g.Go(func() error {
			_, err := cp.AdminClient().CoreV1().Nodes().Create(gctx, &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%04d", prefix, i), Labels: set},
			}, metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("create nodes: %v", err)
	}
	created := time.Since(start)

	start = time.Now()
	factory := informers.NewSharedInformerFactoryWithOptions(cp.AdminClient(), 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = harness.TestLabel + "=" + prefix }))
	nodes := factory.Core().V1().Nodes()
	informer := nodes.Informer()
	factory.Start(ctx.Done())
	t.Cleanup(factory.Shutdown)
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		t.Fatal("node informer did not sync")
	}
	synced := time.Since(start)
	list, err := nodes.Lister().List(labels.SelectorFromSet(set))
	if err != nil {
		t.Fatalf("list from cache: %v", err)
	}
	if len(list) != count {
		t.Errorf("informer cache holds %d nodes, want %d", len(list), count)
	}
	t.Logf("created %d nodes in %v; informer synced in %v", count, created.Round(time.Millisecond), synced.Round(time.Millisecond))
}
