package schedplugin

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/hamireg/hamireg/allocation"
)

// selectionKeys are the pod annotations that steer HAMi's fit.
var selectionKeys = []string{
	allocation.KeyGPUSchedulerPolicy, allocation.KeyNodeSchedulerPolicy, allocation.KeyUseGPUType, allocation.KeyNoUseGPUType,
	allocation.KeyUseGPUUUID, allocation.KeyNoUseGPUUUID, allocation.KeyNUMABind, allocation.KeyVGPUMode,
}

// EventsToRegister implements fwk.EnqueueExtensions (spec §7.7). A ResourceQuota change is not
// a registered event: the plugin's own ResourceQuota handler activates (Handle.Activate) the
// pods that a Filter or Reserve rejected for quota in that namespace, so the scheduler needs
// no dynamic informer.
func (p *Plugin) EventsToRegister(context.Context) ([]fwk.ClusterEventWithHint, error) {
	return []fwk.ClusterEventWithHint{
		{Event: fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Delete}, QueueingHintFn: p.hintAssignedPodDelete},
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add}, QueueingHintFn: p.hintNodeAdd},
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.UpdateNodeAnnotation}, QueueingHintFn: p.hintNodeAnnotation},
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.UpdateNodeAllocatable}, QueueingHintFn: p.hintNodeAllocatable},
		{Event: fwk.ClusterEvent{Resource: fwk.TargetPod, ActionType: fwk.Update}, QueueingHintFn: p.hintTargetPodUpdate},
	}, nil
}

// hintAssignedPodDelete queues when the deleted pod held HAMi devices or asked for them (a
// forgotten assumed pod has no annotations yet).
func (p *Plugin) hintAssignedPodDelete(_ klog.Logger, _ *corev1.Pod, oldObj, _ any) (fwk.QueueingHint, error) {
	pod, ok := oldObj.(*corev1.Pod)
	if !ok {
		return fwk.Queue, nil
	}
	if pod.Annotations[allocation.KeyNode] != "" {
		for _, vc := range p.s.vendors {
			if _, has := pod.Annotations[vc.vendor.AllocatedKey]; has {
				return fwk.Queue, nil
			}
		}
	}
	if p.asksDevices(pod) {
		return fwk.Queue, nil
	}
	return fwk.QueueSkip, nil
}

// asksDevices reports whether a container of pod names a configured vendor's count resource.
func (p *Plugin) asksDevices(pod *corev1.Pod) bool {
	asks := func(cs []corev1.Container) bool {
		for i := range cs {
			for _, vc := range p.s.vendors {
				name := corev1.ResourceName(vc.cfg.ResourceCount)
				if _, ok := cs[i].Resources.Limits[name]; ok {
					return true
				}
				if _, ok := cs[i].Resources.Requests[name]; ok {
					return true
				}
			}
		}
		return false
	}
	return asks(pod.Spec.InitContainers) || asks(pod.Spec.Containers)
}

// hintNodeAdd queues when the new node carries a configured vendor's register annotation.
func (p *Plugin) hintNodeAdd(_ klog.Logger, _ *corev1.Pod, _, newObj any) (fwk.QueueingHint, error) {
	n, ok := newObj.(*corev1.Node)
	if !ok {
		return fwk.Queue, nil
	}
	for _, vc := range p.s.vendors {
		if _, has := n.Annotations[vc.vendor.RegisterKey]; has {
			return fwk.Queue, nil
		}
	}
	return fwk.QueueSkip, nil
}

// hintNodeAnnotation queues when a register, score or device-cordon annotation changed; the
// node lock and the handshake, which every bind and register pass writes, are skipped.
func (p *Plugin) hintNodeAnnotation(_ klog.Logger, _ *corev1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	o, ok1 := oldObj.(*corev1.Node)
	n, ok2 := newObj.(*corev1.Node)
	if !ok1 || !ok2 {
		return fwk.Queue, nil
	}
	changed := func(k string) bool { return k != "" && o.Annotations[k] != n.Annotations[k] }
	if changed(allocation.KeyDeviceCordon) {
		return fwk.Queue, nil
	}
	for _, vc := range p.s.vendors {
		if changed(vc.vendor.RegisterKey) || changed(vc.vendor.ScoreKey) {
			return fwk.Queue, nil
		}
	}
	return fwk.QueueSkip, nil
}

// hintNodeAllocatable queues when a configured vendor's allocatable count rose.
func (p *Plugin) hintNodeAllocatable(_ klog.Logger, _ *corev1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	o, ok1 := oldObj.(*corev1.Node)
	n, ok2 := newObj.(*corev1.Node)
	if !ok1 || !ok2 {
		return fwk.Queue, nil
	}
	for _, vc := range p.s.vendors {
		name := corev1.ResourceName(vc.vendor.ResourceName)
		was, nw := o.Status.Allocatable[name], n.Status.Allocatable[name]
		if nw.Cmp(was) > 0 {
			return fwk.Queue, nil
		}
	}
	return fwk.QueueSkip, nil
}

// hintTargetPodUpdate queues when the rejected pod's device requests or HAMi selection
// annotations changed.
func (p *Plugin) hintTargetPodUpdate(_ klog.Logger, _ *corev1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	o, ok1 := oldObj.(*corev1.Pod)
	n, ok2 := newObj.(*corev1.Pod)
	if !ok1 || !ok2 {
		return fwk.Queue, nil
	}
	for _, k := range selectionKeys {
		if o.Annotations[k] != n.Annotations[k] {
			return fwk.Queue, nil
		}
	}
	for _, vc := range p.s.vendors {
		if !sameRequests(allocation.Requests(o, vc.cfg), allocation.Requests(n, vc.cfg)) {
			return fwk.Queue, nil
		}
	}
	return fwk.QueueSkip, nil
}

func sameRequests(a, b allocation.PodRequest) bool {
	if a.Init != b.Init || len(a.Containers) != len(b.Containers) {
		return false
	}
	for i := range a.Containers {
		if a.Containers[i] != b.Containers[i] {
			return false
		}
	}
	return true
}
