// Command extender is a HAMi-compatible scheduler extender and admission webhook: run it beside
// kube-scheduler in one pod (deploy/), with HAMi's scheduler flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/schedcache"
)

func main() {
	f := newFlags(pflag.CommandLine)
	klogFlags := flag.NewFlagSet("klog", flag.ExitOnError)
	klog.InitFlags(klogFlags)
	pflag.CommandLine.AddGoFlagSet(klogFlags)
	pflag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	client, eventClient, err := f.clients()
	if err == nil {
		var ln, metricsLn net.Listener
		if ln, err = net.Listen("tcp", f.httpBind); err == nil && f.metricsBind != "" {
			metricsLn, err = net.Listen("tcp", f.metricsBind)
		}
		if err == nil {
			err = run(klog.NewContext(ctx, klog.Background()), client, eventClient, f, ln, metricsLn)
		}
	}
	stop()
	if err != nil {
		klog.Background().Error(err, "Scheduler extender failed")
		os.Exit(1)
	}
}

// run serves the extender on ln and, when metricsLn is not nil, /metrics on metricsLn until ctx
// ends: the node cache and the extender on every replica, the handshakes only while leading.
// Events go through eventClient.
func run(ctx context.Context, client, eventClient kubernetes.Interface, f *flags, ln, metricsLn net.Listener) error {
	events := record.NewBroadcaster(record.WithContext(ctx))
	defer events.Shutdown()
	events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: eventClient.CoreV1().Events("")})
	recorder := events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: f.schedulerName})
	factory := informers.NewSharedInformerFactory(client, 0)
	cache, err := schedcache.New(factory.Core().V1().Nodes(), schedcache.Options{NodeSelector: f.selector(), EventRecorder: recorder,
		Vendors: []annotation.Vendor{f.vendor()}})
	if err != nil {
		return err
	}
	var leader schedcache.Runnable
	if leader, err = schedcache.NewHandshaker(client, cache, schedcache.HandshakerOptions{}); err == nil && f.leaderElect {
		var id string
		if id, err = identity(); err == nil {
			leader, err = schedcache.NewLeaseFollower(client, leader, schedcache.FollowerOptions{Namespace: f.leaseNamespace, Name: f.leaseName, Identity: id})
		}
	}
	if err != nil {
		return err
	}
	// HAMi's /metrics: a registry of its own (no Go or process collectors, as HAMi), HAMi's
	// families beside the SDK's hamireg_* ones.
	reg := prometheus.NewRegistry()
	tlsCfg, err := f.tlsConfig()
	if err != nil {
		return err
	}
	opts := extender.Options{Config: f.config(), Vendor: f.vendor(), SchedulerName: f.schedulerName,
		Registerer: reg, LegacyMetrics: f.legacyMetrics, SimulationLiveUsage: f.simulationLiveUsage, TrustedUsers: nonNil(f.trustedUsers), TrustedGroups: nonNil(f.trustedGroups),
		KeepDefaultScheduler: !f.forceOverwriteDefaultScheduler, NodeLockTimeout: f.nodeLockTimeout, NodeLockWait: f.nodeLockWait, EventRecorder: recorder,
		Pods: factory.Core().V1().Pods(), Nodes: factory.Core().V1().Nodes().Lister()}
	if f.extendedResourceMapping {
		opts.DeviceClasses = factory.Resource().V1().DeviceClasses()
	}
	ext, err := extender.New(client, cache, opts)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: ext.Handler(), TLSConfig: tlsCfg, BaseContext: func(net.Listener) context.Context { return ctx }}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancelCause(ctx) // a part that fails stops the others
	defer cancel(nil)
	for _, r := range []schedcache.Runnable{cache, leader, ext} {
		wg.Go(func() { cancel(r.Run(ctx)) })
	}
	wg.Go(func() { <-ctx.Done(); _ = srv.Shutdown(context.WithoutCancel(ctx)) })
	if metricsLn != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		// The probes here too: the kubelet presents no client certificate.
		mux.Handle(extender.PathHealthz, ext.Handler())
		mux.Handle(extender.PathReadyz, ext.Handler())
		msrv := &http.Server{Handler: mux, BaseContext: func(net.Listener) context.Context { return ctx }}
		wg.Go(func() {
			if err := msrv.Serve(metricsLn); !errors.Is(err, http.ErrServerClosed) {
				cancel(fmt.Errorf("serve metrics: %w", err))
			}
		})
		wg.Go(func() { <-ctx.Done(); _ = msrv.Shutdown(context.WithoutCancel(ctx)) })
		klog.FromContext(ctx).Info("Metrics listening", "address", metricsLn.Addr().String())
	}
	klog.FromContext(ctx).Info("Scheduler extender listening", "address", ln.Addr().String(), "tls", f.certFile != "",
		"clientCertificates", tlsCfg != nil, "allowedClientNames", f.allowedClientNames)
	if f.certFile != "" {
		err = srv.ServeTLS(ln, f.certFile, f.keyFile)
	} else {
		err = srv.Serve(ln)
	}
	if errors.Is(err, http.ErrServerClosed) && !errors.Is(context.Cause(ctx), context.Canceled) {
		return context.Cause(ctx)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// nonNil is s, or an empty list for nil: an empty flag (--trusted_users=) trusts nobody, where a
// nil Option would mean the defaults.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
