package schedcache_test

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/schedcache"
)

// Example_usage compiles the package documentation's snippet; Example runs the same parts.
func Example_usage() {
	run := func(ctx context.Context, client kubernetes.Interface, recorder record.EventRecorder, podName string) error {
		// snippet: doc
		var wg sync.WaitGroup
		defer wg.Wait()
		factory := informers.NewSharedInformerFactory(client, 0)
		c, err := schedcache.New(factory.Core().V1().Nodes(), schedcache.Options{EventRecorder: recorder})
		if err != nil {
			return err
		}
		h, err := schedcache.NewHandshaker(client, c, schedcache.HandshakerOptions{})
		if err != nil {
			return err
		}
		elector, err := schedcache.NewElector(client, h, schedcache.ElectorOptions{
			Namespace: "kube-system", Name: "hamireg-schedcache", Identity: podName})
		if err != nil {
			return err
		}
		factory.Start(ctx.Done())
		defer factory.Shutdown()
		ctx, cancel := context.WithCancelCause(ctx) // a part that fails stops the other
		defer cancel(nil)
		wg.Go(func() { cancel(c.Run(ctx)) })
		wg.Go(func() { cancel(elector.Run(ctx)) }) // h.Run while this replica leads
		if err := c.WaitForSync(ctx); err != nil {
			return err
		}
		if n, ok := c.Snapshot().Node("gpu-1"); ok {
			fmt.Println(n.Devices(annotation.NVIDIA())) // nil unless registered
		}
		// end snippet
		return nil
	}
	_ = run
}
