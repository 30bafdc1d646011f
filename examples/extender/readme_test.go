package main

import (
	"context"
	"net"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/schedcache"
)

// Example_readme compiles the README's snippet of this program's core (run in main.go, without
// its events broadcaster, logs and shutdown rules); the root module's TestSnippetsAreCompiled
// checks that the README shows this text.
func Example_readme() {
	run := func(ctx context.Context, client kubernetes.Interface, f *flags, recorder record.EventRecorder, id string, ln, metricsLn net.Listener) error {
		var wg sync.WaitGroup
		defer wg.Wait()
		// snippet: README
		factory := informers.NewSharedInformerFactory(client, 0)
		cache, err := schedcache.New(factory.Core().V1().Nodes(), schedcache.Options{NodeSelector: f.selector(), EventRecorder: recorder})
		if err != nil {
			return err
		}
		var leader schedcache.Runnable // leader-only handshake writes
		if leader, err = schedcache.NewHandshaker(client, cache, schedcache.HandshakerOptions{}); err == nil && f.leaderElect {
			// HAMi's shape: follow the Lease of kube-scheduler in the same pod
			leader, err = schedcache.NewLeaseFollower(client, leader, schedcache.FollowerOptions{Namespace: f.leaseNamespace, Name: f.leaseName, Identity: id})
		}
		if err != nil {
			return err
		}
		reg := prometheus.NewRegistry() // HAMi's /metrics families and the SDK's hamireg_* ones
		ext, err := extender.New(client, cache, extender.Options{Config: f.config(), SchedulerName: f.schedulerName,
			NodeLockTimeout: f.nodeLockTimeout, NodeLockWait: f.nodeLockWait, EventRecorder: recorder, Registerer: reg,
			Pods: factory.Core().V1().Pods(), Nodes: factory.Core().V1().Nodes().Lister()})
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: ext.Handler()} // /filter, /bind, /webhook, /healthz, /readyz
		factory.Start(ctx.Done())
		ctx, cancel := context.WithCancelCause(ctx) // a part that fails stops the others
		defer cancel(nil)
		for _, r := range []schedcache.Runnable{cache, leader, ext} {
			wg.Go(func() { cancel(r.Run(ctx)) })
		}
		msrv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})} // --metrics-bind-address, :9395
		wg.Go(func() { _ = msrv.Serve(metricsLn) })
		wg.Go(func() { <-ctx.Done(); _ = srv.Shutdown(context.WithoutCancel(ctx)) })
		wg.Go(func() { <-ctx.Done(); _ = msrv.Shutdown(context.WithoutCancel(ctx)) })
		return srv.ServeTLS(ln, f.certFile, f.keyFile) // or Serve without --cert_file
		// end snippet
	}
	_ = run
}
