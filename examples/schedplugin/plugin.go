package schedplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/utils/clock"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/usage"
)

// Name is the plugin's name in a KubeSchedulerConfiguration.
const Name = "HAMiGPU"

// stateKey is where PreFilter keeps the pod's request for the other extension points.
const stateKey fwk.StateKey = Name

// Options configure a [Plugin]. The zero value is HAMi's chart, master, NVIDIA.
type Options struct {
	// Config is the device configuration (allocation.Config).
	Config allocation.Config
	// Vendor names the register and device annotations; zero means annotation.NVIDIA().
	Vendor annotation.Vendor
	// Clock gives hami.io/vgpu-time; nil means the real clock.
	Clock clock.PassiveClock
}

// Plugin places HAMi GPU pods. Create it with [New].
type Plugin struct {
	client  kubernetes.Interface
	tracker *usage.Tracker
	opts    Options
}

var (
	_ fwk.PreFilterPlugin = (*Plugin)(nil)
	_ fwk.FilterPlugin    = (*Plugin)(nil)
	_ fwk.ReservePlugin   = (*Plugin)(nil)
	_ fwk.PreBindPlugin   = (*Plugin)(nil)
)

// New returns a plugin that patches pods through client.
func New(client kubernetes.Interface, opts Options) (*Plugin, error) {
	if client == nil {
		return nil, fmt.Errorf("new %s plugin: nil client", Name)
	}
	cfg, err := opts.Config.WithDefaults()
	if err != nil {
		return nil, fmt.Errorf("new %s plugin: %w", Name, err)
	}
	opts.Config = cfg
	if opts.Vendor.Name == "" {
		opts.Vendor = annotation.NVIDIA()
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Plugin{client: client, opts: opts, tracker: usage.New(usage.Options{Vendor: opts.Vendor, Config: cfg})}, nil
}

// Tracker is the plugin's usage tracker.
func (p *Plugin) Tracker() *usage.Tracker { return p.tracker }

// PodHandler feeds the tracker from a pod informer.
func (p *Plugin) PodHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if pod, ok := obj.(*corev1.Pod); ok {
				p.tracker.Observe(pod)
			}
		},
		UpdateFunc: func(o, n any) {
			op, ok1 := o.(*corev1.Pod)
			np, ok2 := n.(*corev1.Pod)
			if ok1 && ok2 && p.tracker.Changed(op, np) {
				p.tracker.Observe(np)
			}
		},
		DeleteFunc: func(obj any) {
			if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
				p.tracker.Delete(key)
			}
		},
	}
}

// QuotaHandler feeds the tracker from a ResourceQuota informer.
func (p *Plugin) QuotaHandler() cache.ResourceEventHandler {
	set := func(obj any) {
		if q, ok := obj.(*corev1.ResourceQuota); ok {
			p.tracker.SetQuota(q)
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, n any) { set(n) },
		DeleteFunc: func(obj any) {
			key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
			if err != nil {
				return
			}
			if ns, name, err := cache.SplitMetaNamespaceKey(key); err == nil {
				p.tracker.DeleteQuota(ns, name)
			}
		},
	}
}

// Name implements fwk.Plugin.
func (p *Plugin) Name() string { return Name }

// state is one scheduling cycle's: the request, and what Reserve assumed.
type state struct {
	req     allocation.PodRequest
	devices allocation.PodDevices
	undo    func()
}

// Clone implements fwk.StateData: the state is only written by Reserve, after Filter.
func (s *state) Clone() fwk.StateData { return s }

func readState(cs fwk.CycleState) (*state, *fwk.Status) {
	d, err := cs.Read(stateKey)
	if err != nil {
		return nil, fwk.AsStatus(err)
	}
	s, ok := d.(*state)
	if !ok {
		return nil, fwk.NewStatus(fwk.Error, fmt.Sprintf("cycle state of type %T", d))
	}
	return s, nil
}

// PreFilter reads what the pod asks; a pod without GPUs skips the plugin.
func (p *Plugin) PreFilter(_ context.Context, cs fwk.CycleState, pod *corev1.Pod, _ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	req := allocation.Requests(pod, p.opts.Config)
	if !req.Any() {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	cs.Write(stateKey, &state{req: req})
	return nil, nil
}

// PreFilterExtensions implements fwk.PreFilterPlugin: none (preemption does not see GPUs here).
func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// fit fits the pod on node as of a tracker view.
func (p *Plugin) fit(v *usage.View, pod *corev1.Pod, node *corev1.Node, req allocation.PodRequest) (allocation.PodDevices, *fwk.Status) {
	devices, err := annotation.Decode(node.Annotations[p.opts.Vendor.RegisterKey])
	if err != nil || len(devices) == 0 {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, allocation.ReasonNodeUnregistered)
	}
	key := usage.Key(pod.Namespace, pod.Name)
	used, _ := v.Node(node.Name)
	if self, ok := v.Pod(key); ok && self.Node == node.Name { // a re-scheduled pod does not count against itself
		mine := map[string]allocation.Usage{}
		for gpu, u := range used {
			mine[gpu] = u.Sub(self.GPUs[gpu])
		}
		used = mine
	}
	q := v.Quota(pod.Namespace, key)
	pd, reason, ok := allocation.FitWith(allocation.WithUsage(devices, used), req, pod.Annotations, node.Annotations, p.opts.Config,
		allocation.FitOptions{Quota: &q})
	if !ok {
		return nil, fwk.NewStatus(fwk.Unschedulable, reason)
	}
	return pd, nil
}

// Filter fits the pod on the node's GPUs with HAMi's fit and the namespace's quota.
func (p *Plugin) Filter(_ context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	s, st := readState(cs)
	if st != nil {
		return st
	}
	v := p.tracker.Lock()
	defer v.Unlock()
	_, st = p.fit(v, pod, nodeInfo.Node(), s.req)
	return st
}

// Reserve fits again and assumes the devices under one lock of the tracker, so that what it
// reserves is what the next pod's Filter sees.
func (p *Plugin) Reserve(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) *fwk.Status {
	s, st := readState(cs)
	if st != nil {
		return st
	}
	node, err := p.client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{}) // a real plugin reads the snapshot
	if err != nil {
		return fwk.AsStatus(err)
	}
	v := p.tracker.Lock()
	defer v.Unlock()
	pd, st := p.fit(v, pod, node, s.req)
	if st != nil {
		return st
	}
	s.devices, s.undo = pd, v.Assume(pod, nodeName, pd)
	return nil
}

// Unreserve undoes Reserve's assumption (a later plugin or the bind failed).
func (p *Plugin) Unreserve(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, _ string) {
	if s, st := readState(cs); st == nil && s.undo != nil {
		s.undo()
		s.undo = nil
	}
}

// PreBindPreFlight implements fwk.PreBindPlugin: PreBind always writes.
func (p *Plugin) PreBindPreFlight(context.Context, fwk.CycleState, *corev1.Pod, string) (*fwk.PreBindPreFlightResult, *fwk.Status) {
	return nil, nil
}

// PreBind writes HAMi's filter annotations (node, time, both device lists) in one merge patch.
func (p *Plugin) PreBind(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) *fwk.Status {
	s, st := readState(cs)
	if st != nil {
		return st
	}
	devices := allocation.EncodePodDevices(s.devices)
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"annotations": map[string]string{
			allocation.KeyNode:          nodeName,
			allocation.KeyTime:          strconv.FormatInt(p.opts.Clock.Now().Unix(), 10),
			p.opts.Vendor.ToAllocateKey: devices,
			p.opts.Vendor.AllocatedKey:  devices,
		},
		"labels": map[string]string{allocation.KeyNode: nodeName},
	}})
	if err != nil {
		return fwk.AsStatus(err)
	}
	if _, err := p.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fwk.AsStatus(fmt.Errorf("prebind %s/%s: %w", pod.Namespace, pod.Name, err))
	}
	return nil
}
