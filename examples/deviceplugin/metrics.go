package main

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

	"github.com/hamireg/hamireg/nodeagent"
)

// defaultMetricsBindAddress is HAMi's monitor's --metrics-bind-address: the port that its
// Service hami-device-plugin-monitor (NodePort 31992) targets and its dashboards scrape.
const defaultMetricsBindAddress = ":9394"

// The metrics server's timeouts, HAMi master's monitor's (its PR #2100), and how long a
// stopping server waits for scrapes in flight.
const (
	metricsReadHeaderTimeout = 15 * time.Second
	metricsReadTimeout       = 60 * time.Second
	metricsShutdownTimeout   = 5 * time.Second
)

// pathMetrics is where the registry is served.
const pathMetrics = "/metrics"

// metricsAddress checks the value of --metrics-bind-address: "" and "0" turn the server off
// (""), anything else must be host:port with a numeric port (0 picks a free one).
func metricsAddress(addr string) (string, error) {
	if addr == "" || addr == "0" {
		return "", nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--metrics-bind-address %q: %w: want host:port, e.g. %s, or \"0\" for none", addr, err, defaultMetricsBindAddress)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", fmt.Errorf("--metrics-bind-address %q: port %q is not a number within [0, 65535]", addr, port)
	}
	return addr, nil
}

// runServing runs agent until ctx ends, serving /metrics of reg and the agent's probes on addr
// ("": no server) meanwhile. The server starts before the agent, so that the kubelet's probes
// find it at once, and stops after the agent returned; if it cannot listen, the agent does not
// run, and if it fails later, the agent is stopped and the server's error returned.
func runServing(ctx context.Context, agent *nodeagent.Agent, reg prometheus.Gatherer, addr string) error {
	if addr == "" {
		return agent.Run(ctx)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--metrics-bind-address: %w", err)
	}
	agentCtx, stopAgent := context.WithCancelCause(ctx)
	defer stopAgent(nil)
	srvCtx, stopServer := context.WithCancel(context.WithoutCancel(ctx))
	var (
		wg       sync.WaitGroup
		serveErr error
	)
	wg.Go(func() {
		if serveErr = serveMetrics(srvCtx, lis, reg, nodeagent.ProbeHandler(agent.Healthy, readiness(agent))); serveErr != nil {
			stopAgent(serveErr)
		}
	})
	err = agent.Run(agentCtx)
	stopServer()
	wg.Wait()
	return errors.Join(err, serveErr)
}

// readiness is the agent's readiness and, with a node monitor, the monitor's: its last scan
// read the containers folder and listed the node's pods.
func readiness(agent *nodeagent.Agent) func() error {
	return func() error {
		err := agent.Ready()
		if m := agent.Monitor(); m != nil {
			err = errors.Join(err, m.Ready())
		}
		return err
	}
}

// serveMetrics serves GET /metrics (reg), /healthz and /readyz (probes) on lis until ctx ends,
// then shuts the server down, closes lis and returns nil; it returns the server's error if it
// stops by itself.
func serveMetrics(ctx context.Context, lis net.Listener, reg prometheus.Gatherer, probes http.Handler) error {
	mux := http.NewServeMux()
	mux.Handle("GET "+pathMetrics, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle(nodeagent.PathHealthz, probes)
	mux.Handle(nodeagent.PathReadyz, probes)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: metricsReadHeaderTimeout, ReadTimeout: metricsReadTimeout,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	logger := klog.FromContext(ctx)
	logger.Info("Serving metrics and probes", "address", "http://"+lis.Addr().String(), "paths", []string{pathMetrics, nodeagent.PathHealthz, nodeagent.PathReadyz})
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
