package nodeagent

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/monitor"
)

// newMonitor builds the node monitor of Options.Monitor: the agent's node name unless the
// options name one, the DRA world's prepared claims when the world resolves them
// ([monitor.Claims], as nodedra's World does), the agent's pod informer, and the agent's
// Registerer for its metrics.
func newMonitor(a *Agent, opts Options) (*monitor.Monitor, error) {
	mo := *opts.Monitor
	if mo.NodeName == "" {
		mo.NodeName = a.node
	}
	if mo.Claims == nil && opts.DRA != nil {
		if c, ok := opts.DRA.(monitor.Claims); ok {
			mo.Claims = c
		}
	}
	if mo.Clock == nil {
		mo.Clock = a.clock
	}
	m, err := monitor.New(monitor.PodsFunc(a.monitorPods), mo)
	if err != nil {
		return nil, err
	}
	if opts.Registerer != nil {
		if err := m.Register(opts.Registerer); err != nil {
			return nil, fmt.Errorf("register node monitor: %w", err)
		}
	}
	return m, nil
}

// monitorPods lists every pod the agent's informer holds for the node, finished ones
// included (a finished pod's folder is kept until it ages out, as HAMi does); before the
// first LIST the error wraps [ErrPodsNotSynced].
func (a *Agent) monitorPods() ([]*corev1.Pod, error) {
	if a.pods == nil || !a.pods.synced.Load() || !a.pods.informer.HasSynced() {
		return nil, fmt.Errorf("read the pods of node %s: %w", a.node, ErrPodsNotSynced)
	}
	objs := a.pods.informer.GetStore().List()
	out := make([]*corev1.Pod, 0, len(objs))
	for _, obj := range objs {
		if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName == a.node {
			out = append(out, p)
		}
	}
	return out, nil
}

// Monitor returns the agent's node monitor, nil without Options.Monitor: a program asks it
// for readiness ([monitor.Monitor.Ready]) or reads its containers.
func (a *Agent) Monitor() *monitor.Monitor { return a.monitor }

// runMonitor runs the node monitor once the pod informer synced, until ctx ends.
func (a *Agent) runMonitor(ctx context.Context, podsSynced func(context.Context) bool) error {
	if !podsSynced(ctx) {
		return nil
	}
	if err := a.monitor.Run(ctx); err != nil {
		return fmt.Errorf("run node monitor: %w", err)
	}
	return nil
}
