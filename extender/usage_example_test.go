package extender_test

import (
	"context"
	"net/http"
	"sync"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/schedcache"
)

// Example_usage compiles the package documentation's snippet; Example runs the same parts.
func Example_usage() {
	run := func(ctx context.Context, client kubernetes.Interface) error {
		// snippet: doc
		var wg sync.WaitGroup
		defer wg.Wait()
		factory := informers.NewSharedInformerFactory(client, 0)
		cache, err := schedcache.New(factory.Core().V1().Nodes(), schedcache.Options{})
		if err != nil {
			return err
		}
		ext, err := extender.New(client, cache, extender.Options{Pods: factory.Core().V1().Pods(), Nodes: factory.Core().V1().Nodes().Lister()})
		if err != nil {
			return err
		}
		factory.Start(ctx.Done())
		ctx, cancel := context.WithCancelCause(ctx) // a part that fails stops the others
		defer cancel(nil)
		wg.Go(func() { cancel(cache.Run(ctx)) })
		wg.Go(func() { cancel(ext.Run(ctx)) })
		return http.ListenAndServe("127.0.0.1:8080", ext.Handler())
		// end snippet
	}
	_ = run
}
