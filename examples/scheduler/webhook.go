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

	"github.com/spf13/cobra"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/schedcache"
)

// webhookFlags configure the webhook mode; the names are HAMi's scheduler flags where HAMi
// has one (examples/extender's), --bind excepted (HAMi's --http_bind serves its extender too).
type webhookFlags struct {
	bind, certFile, keyFile, kubeconfig  string
	schedulerName                        string
	forceOverwriteDefaultScheduler       bool
	defaultMem, defaultCores, defaultGPU int32
	kubeQPS                              float32
	kubeBurst                            int
}

func newWebhookCommand() *cobra.Command {
	f := &webhookFlags{}
	cmd := &cobra.Command{
		Use:   webhookMode,
		Short: "Serve HAMi's mutating admission webhook (GPU pods get schedulerName hami-scheduler)",
		Long: `Serve HAMi's mutating admission webhook on --bind: POST /webhook (the
MutatingWebhookConfiguration of deploy/webhook.yaml points at it), GET /healthz (the process
serves) and GET /readyz (the pod and quota caches synced). A pod that asks for an NVIDIA
resource gets spec.schedulerName --scheduler-name, HAMi's defaults for GPU count and cores,
and is denied when it would exceed a ResourceQuota on GPU memory or cores.`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, err := f.client()
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", f.bind)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runWebhook(klog.NewContext(ctx, klog.Background()), client, f, ln)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.bind, "bind", "0.0.0.0:443", "address the webhook listens on")
	fs.StringVar(&f.certFile, "cert-file", "", "TLS certificate (the API server calls webhooks over HTTPS); empty serves plain HTTP, for tests")
	fs.StringVar(&f.keyFile, "key-file", "", "TLS private key")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster")
	fs.StringVar(&f.schedulerName, "scheduler-name", extender.DefaultSchedulerName, "scheduler name the webhook gives GPU pods: the profile of deploy/config.yaml that enables HAMiGPU")
	fs.BoolVar(&f.forceOverwriteDefaultScheduler, "force-overwrite-default-scheduler", true, "the webhook overwrites schedulerName default-scheduler")
	fs.Int32Var(&f.defaultMem, "default-mem", 0, "MiB given to a container that asks for no memory (0: the whole GPU); keep equal to HAMiGPU's defaultMemory")
	fs.Int32Var(&f.defaultCores, "default-cores", 0, "core percentage of a container that asks for none; keep equal to HAMiGPU's defaultCores")
	fs.Int32Var(&f.defaultGPU, "default-gpu", 1, "GPU count the webhook adds to a container that asks for memory or cores only")
	fs.Float32Var(&f.kubeQPS, "kube-qps", 50, "client QPS to the API server (the webhook only lists and watches)")
	fs.IntVar(&f.kubeBurst, "kube-burst", 100, "client burst to the API server")
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
	return cmd
}

func (f *webhookFlags) client() (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	cfg.QPS, cfg.Burst = f.kubeQPS, f.kubeBurst
	return kubernetes.NewForConfig(cfg)
}

// webhookHandler serves only the admission routes of the extender's handler: kube-scheduler
// with the plugin does the filtering and binding, so /filter and /bind answer 404.
func webhookHandler(ext http.Handler) http.Handler {
	mux := http.NewServeMux()
	for _, p := range []string{extender.PathWebhook, extender.PathHealthz, extender.PathReadyz} {
		mux.Handle(p, ext)
	}
	return mux
}

// runWebhook serves the extender package's webhook on ln until ctx ends. The extender needs its
// node cache (the nodes' registrations) and counts the namespaces' GPU usage from the pod
// informer, which the quota check of admission reads; it writes nothing (no handshake, no
// bind: the plugin does those).
func runWebhook(ctx context.Context, client kubernetes.Interface, f *webhookFlags, ln net.Listener) error {
	factory := informers.NewSharedInformerFactory(client, 0)
	cache, err := schedcache.New(factory.Core().V1().Nodes(), schedcache.Options{})
	if err != nil {
		return err
	}
	ext, err := extender.New(client, cache, extender.Options{
		Config:        allocation.Config{DefaultMemory: f.defaultMem, DefaultCores: f.defaultCores, DefaultGPUNum: f.defaultGPU},
		SchedulerName: f.schedulerName, KeepDefaultScheduler: !f.forceOverwriteDefaultScheduler,
		Pods: factory.Core().V1().Pods(), Nodes: factory.Core().V1().Nodes().Lister(),
	})
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: webhookHandler(ext.Handler()), BaseContext: func(net.Listener) context.Context { return ctx }}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancelCause(ctx) // a part that fails stops the others
	defer cancel(nil)
	for _, r := range []schedcache.Runnable{cache, ext} {
		wg.Go(func() { cancel(r.Run(ctx)) })
	}
	wg.Go(func() { <-ctx.Done(); _ = srv.Shutdown(context.WithoutCancel(ctx)) })
	klog.FromContext(ctx).Info("Admission webhook listening", "address", ln.Addr().String(), "tls", f.certFile != "")
	if f.certFile != "" {
		err = srv.ServeTLS(ln, f.certFile, f.keyFile)
	} else {
		err = srv.Serve(ln)
	}
	if errors.Is(err, http.ErrServerClosed) {
		if cause := context.Cause(ctx); !errors.Is(cause, context.Canceled) {
			return cause
		}
		return nil
	}
	return err
}
