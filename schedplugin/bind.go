package schedplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/mig"
)

// rollbackTimeout bounds Unreserve's API calls, which run even when the binding cycle's context
// was cancelled (preemption of a pod in PreBind).
const rollbackTimeout = 10 * time.Second

// PreBindPreFlight skips PreBind for pods without the plugin's state; GPU pods are bound one
// plugin after the other (AllowParallel false: PreBind waits for the node lock).
func (p *Plugin) PreBindPreFlight(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, _ string) (*fwk.PreBindPreFlightResult, *fwk.Status) {
	if readState(cs) == nil {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	return &fwk.PreBindPreFlightResult{AllowParallel: false}, nil
}

// needsLock reports whether a regular container asks for devices: HAMi takes the node lock
// only then.
func needsLock(req allocation.PodRequest) bool {
	for _, r := range req.Containers[req.Init:] {
		if r.Count > 0 {
			return true
		}
	}
	return false
}

// PreBind takes HAMi's node lock for the pod when a regular container asks for a GPU (waiting
// behind the node's other binds, at most Args.NodeLockWait), then writes HAMi's annotations in
// one merge patch: hami.io/vgpu-node, vgpu-time, the vendor's to-allocate and allocated lists
// (identical), the MIG reservation when the devices are MIG instances, bind-phase
// "allocating", bind-time, and the hami.io/vgpu-node label. Any failure is an Error status;
// Unreserve then gives the lock back. No state (not our pod) or a DRA node (see
// [Plugin.Filter]): nothing to do.
func (p *Plugin) PreBind(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) *fwk.Status {
	s := readState(cs)
	if s == nil || s.onDRA {
		return nil
	}
	if s.reserved == nil {
		return fwk.AsStatus(fmt.Errorf("prebind %s on %s: no reservation", klog.KObj(pod), nodeName))
	}
	name := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
	now := strconv.FormatInt(p.sh.clock.Now().Unix(), 10)
	s.bindTime = now
	if needsLock(s.req) {
		done, err := p.sh.locks.Acquire(ctx, nodeName, name, p.s.nodeLockWait)
		if err != nil {
			return fwk.AsStatus(fmt.Errorf("prebind %s on %s: %w", name, nodeName, err))
		}
		defer done()
		s.locked = true
	}
	v := p.s.vendors[s.vendor].vendor
	devices := allocation.EncodePodDevices(s.reserved.devices)
	annotations := map[string]any{
		allocation.KeyNode:      nodeName,
		allocation.KeyTime:      now,
		allocation.KeyBindPhase: string(allocation.PhaseAllocating),
		allocation.KeyBindTime:  now,
	}
	for _, k := range []string{v.ToAllocateKey, v.AllocatedKey} {
		if k != "" {
			annotations[k] = devices
		}
	}
	if r := mig.EncodeAllocations(allocation.MIGAllocations(s.reserved.devices)); r != "" {
		annotations[mig.KeyAllocations] = r
	} else if _, stale := pod.Annotations[mig.KeyAllocations]; stale {
		annotations[mig.KeyAllocations] = nil // null deletes it
	}
	patch := map[string]any{"metadata": map[string]any{
		"annotations": annotations,
		"labels":      map[string]string{allocation.KeyNode: nodeName},
	}}
	if err := p.patchPod(ctx, pod.Namespace, pod.Name, patch); err != nil {
		return fwk.AsStatus(fmt.Errorf("prebind %s on %s: %w", name, nodeName, err))
	}
	klog.FromContext(ctx).V(3).Info("Wrote HAMi's annotations", "pod", klog.KObj(pod), "node", nodeName, "devices", devices)
	return nil
}

func (p *Plugin) patchPod(ctx context.Context, namespace, name string, patch any) error {
	data, err := json.Marshal(patch)
	if err != nil {
		return fmt.Errorf("patch pod %s/%s: %w", namespace, name, err)
	}
	if _, err := p.h.ClientSet().CoreV1().Pods(namespace).Patch(ctx, name, types.MergePatchType, data, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patch pod %s/%s: %w", namespace, name, err)
	}
	return nil
}

// rollback undoes PreBind's lock (spec §7.6): a pod already bound to the node keeps its lock and
// annotations (the kubelet will call Allocate); otherwise the lock is released and bind-phase
// set to "failed". Errors are logged.
func (p *Plugin) rollback(ctx context.Context, pod *corev1.Pod, nodeName, bindTime string) {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	cur, err := p.h.ClientSet().CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err == nil && cur.UID == pod.UID && cur.Spec.NodeName == nodeName {
		logger.V(2).Info("Pod is bound already, keeping its node lock", "pod", klog.KObj(pod), "node", nodeName)
		return
	}
	name := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
	if err := p.sh.locker.Release(ctx, nodeName, name); err != nil {
		logger.Error(err, "Failed to release the node lock after a failed bind", "pod", klog.KObj(pod), "node", nodeName)
	}
	if err := p.patchPod(ctx, pod.Namespace, pod.Name, map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		allocation.KeyBindPhase: string(allocation.PhaseFailed),
		allocation.KeyBindTime:  bindTime,
	}}}); err != nil {
		logger.Error(err, "Failed to mark the bind failed", "pod", klog.KObj(pod))
	}
}
