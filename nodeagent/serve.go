package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"
)

// The metrics server's timeouts, HAMi master's node monitor's (its PR #2100), and how long a
// stopping server waits for scrapes in flight.
const (
	MetricsReadHeaderTimeout = 15 * time.Second
	MetricsReadTimeout       = 60 * time.Second
	metricsShutdownTimeout   = 5 * time.Second
)

// PathMetrics is where [Agent.RunServing] serves the registry.
const PathMetrics = "/metrics"

// ErrInvalidAddress is a metrics address that is not host:port with a numeric port.
var ErrInvalidAddress = errors.New("invalid metrics address")

// ParseMetricsAddress checks a program's metrics address flag: "" and "0" turn the server
// off (it returns ""), anything else must be host:port with a numeric port within [0, 65535]
// (0 picks a free one). The error wraps [ErrInvalidAddress].
func ParseMetricsAddress(addr string) (string, error) {
	if addr == "" || addr == "0" {
		return "", nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%w %q: %w: want host:port, e.g. :9394, or \"0\" for none", ErrInvalidAddress, addr, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", fmt.Errorf("%w %q: port %q is not a number within [0, 65535]", ErrInvalidAddress, addr, port)
	}
	return addr, nil
}

// RunServing runs the agent until ctx ends, serving on addr ("": no server, only Run) GET
// [PathMetrics] (g, e.g. the registry given as Options.Registerer) and the probes
// [PathHealthz] and [PathReadyz] ([ProbeHandler] of [Agent.Healthy] and [Agent.Ready]), on
// one HTTP server with HAMi's node-monitor timeouts. The server listens before the agent
// starts, so the kubelet's probes find it at once, and stops after the agent returned; if it
// cannot listen, the agent does not run, and if it fails later, the agent stops and the
// server's error is returned with Run's.
func (a *Agent) RunServing(ctx context.Context, addr string, g prometheus.Gatherer) error {
	if addr == "" {
		return a.Run(ctx)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on the metrics address %s: %w", addr, err)
	}
	agentCtx, stopAgent := context.WithCancelCause(ctx)
	defer stopAgent(nil)
	srvCtx, stopServer := context.WithCancel(context.WithoutCancel(ctx))
	var (
		wg       sync.WaitGroup
		serveErr error
	)
	wg.Go(func() {
		if serveErr = serveMetrics(srvCtx, lis, g, ProbeHandler(a.Healthy, a.Ready)); serveErr != nil {
			stopAgent(serveErr)
		}
	})
	err = a.Run(agentCtx)
	stopServer()
	wg.Wait()
	return errors.Join(err, serveErr)
}

// serveMetrics serves GET /metrics (g), /healthz and /readyz (probes) on lis until ctx ends,
// then shuts the server down, closes lis and returns nil; it returns the server's error if it
// stops by itself.
func serveMetrics(ctx context.Context, lis net.Listener, g prometheus.Gatherer, probes http.Handler) error {
	mux := http.NewServeMux()
	mux.Handle("GET "+PathMetrics, promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.Handle(PathHealthz, probes)
	mux.Handle(PathReadyz, probes)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: MetricsReadHeaderTimeout, ReadTimeout: MetricsReadTimeout,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	logger := klog.FromContext(ctx)
	logger.Info("Serving metrics and probes", "address", "http://"+lis.Addr().String(), "paths", []string{PathMetrics, PathHealthz, PathReadyz})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve metrics and probes on %s: %w", lis.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), metricsShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		logger.V(2).Info("Metrics server not drained, closing it", "err", err)
		_ = srv.Close()
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		logger.V(2).Info("Metrics server stopped", "err", err)
	}
	return nil
}
