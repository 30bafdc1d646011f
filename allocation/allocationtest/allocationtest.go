// Package allocationtest plays HAMi's scheduler for the tests of a device plugin, and HAMi's
// device plugin for the tests of a scheduler. Given a clientset, a pod, a node and the devices
// chosen for the pod, [Scheduler] writes exactly what HAMi's scheduler writes at filter and at
// bind, so that a vendor can test the plugin's Allocate against HAMi's protocol without running
// HAMi; [Plugin] does what HAMi's device plugin does when the kubelet calls Allocate, so that a
// scheduler or extender can be tested to the end of the protocol (entries consumed, bind-phase
// success, lock released) without a kubelet.
//
// At filter ([Scheduler.Filter]) one JSON merge patch of the pod sets hami.io/vgpu-node,
// hami.io/vgpu-time and the vendor's two device lists, and the label hami.io/vgpu-node; when
// devices carry MIG slots (allocation.MIGSlot), also HAMi master's MIG reservation
// hami.io/vgpu-mig-allocations (allocation.MIGAllocations). At
// bind ([Scheduler.Bind]) the node lock is taken (package nodelock), one merge patch sets
// hami.io/bind-phase: allocating and hami.io/bind-time, and the pods/binding subresource is
// created. [Schedule] does both. Times are Unix seconds from Options.Clock.
//
// It works with client-go's fake clientset, whose pods/binding does not set spec.nodeName:
// when the pod is still unbound after the Binding, the helper sets spec.nodeName itself, as
// the API server would. Against a real API server it needs what HAMi's scheduler needs:
// patch pods, create pods/binding, and the node lock's rules (nodelock.ClusterRoleRules).
package allocationtest

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nodelock"
)

// Options configure what the helper writes. The zero value is HAMi's scheduler for NVIDIA.
type Options struct {
	// Vendor names the device list keys. Default annotation.NVIDIA().
	Vendor annotation.Vendor
	// Clock gives hami.io/vgpu-time, hami.io/bind-time and the lock time. Default the real
	// clock.
	Clock clock.WithTicker
	// Version is the HAMi release whose device plugin [Plugin] plays: it reads the device
	// list as that release does and answers in its words. Default annotation.VersionMaster.
	Version annotation.Version
	// Mode is the operating mode of the device plugin [Plugin] plays: "" (HAMi-core, the
	// default) or allocation.ModeMIG. With ModeMIG and Version master, an entry with a device
	// that carries no MIG reservation (allocation.MIGSlot) is refused as HAMi v2.10.0's plugin
	// refuses it ([ErrMIGUnresolved]); HAMi v2.9.0 in mig mode serves such an entry. The
	// [Scheduler] ignores it.
	Mode string
}

func (o Options) withDefaults() Options {
	if o.Vendor.Name == "" {
		o.Vendor = annotation.NVIDIA()
	}
	o.Clock = cmp.Or[clock.WithTicker](o.Clock, clock.RealClock{})
	return o
}

// Schedule writes what HAMi's scheduler writes for pod at filter and at bind on node, with
// devices the pod's device list (one entry per container, init containers first), and
// returns the pod as the API server has it afterwards. It fails tb on any error; use a
// [Scheduler] to write one step at a time or to see the error.
func Schedule(tb testing.TB, client kubernetes.Interface, pod *corev1.Pod, node string, devices allocation.PodDevices, opts Options) *corev1.Pod {
	tb.Helper()
	out, err := NewScheduler(client, opts).Schedule(tb.Context(), pod, node, devices)
	if err != nil {
		tb.Fatalf("allocationtest: %v", err)
	}
	return out
}

// Scheduler writes what HAMi's scheduler writes, step by step.
type Scheduler struct {
	client kubernetes.Interface
	opts   Options
}

// NewScheduler returns a Scheduler that writes through client.
func NewScheduler(client kubernetes.Interface, opts Options) *Scheduler {
	return &Scheduler{client: client, opts: opts.withDefaults()}
}

// Schedule is [Scheduler.Filter] followed by [Scheduler.Bind].
func (s *Scheduler) Schedule(ctx context.Context, pod *corev1.Pod, node string, devices allocation.PodDevices) (*corev1.Pod, error) {
	if _, err := s.Filter(ctx, pod, node, devices); err != nil {
		return nil, err
	}
	return s.Bind(ctx, pod, node)
}

// Filter writes what HAMi's scheduler writes when its filter chooses node and devices for pod:
// one merge patch of the node annotation, the time and both device lists (identical), the MIG
// reservation of the devices with a MIG slot (HAMi master; none without), and the node label.
// It returns the patched pod.
func (s *Scheduler) Filter(ctx context.Context, pod *corev1.Pod, node string, devices allocation.PodDevices) (*corev1.Pod, error) {
	value := allocation.EncodePodDevices(devices)
	annotations := map[string]string{
		allocation.KeyNode:          node,
		allocation.KeyTime:          unix(s.opts.Clock),
		s.opts.Vendor.ToAllocateKey: value,
		s.opts.Vendor.AllocatedKey:  value,
	}
	if allocs := allocation.MIGAllocations(devices); len(allocs) > 0 {
		annotations[mig.KeyAllocations] = mig.EncodeAllocations(allocs)
	}
	return s.patchPod(ctx, pod, map[string]any{"metadata": map[string]any{
		"annotations": annotations,
		"labels":      map[string]string{allocation.KeyNode: node},
	}})
}

// Bind writes what HAMi's scheduler writes when it binds pod to node: the node lock for the
// pod, then bind-phase allocating with the bind time, then the Binding. It returns the bound
// pod. A lock held by another pod is the node lock's error (errors.Is nodelock.ErrLocked),
// and nothing else is written then.
func (s *Scheduler) Bind(ctx context.Context, pod *corev1.Pod, node string) (*corev1.Pod, error) {
	locker, err := nodelock.New(s.client.CoreV1(), nodelock.Options{Clock: s.opts.Clock})
	if err != nil {
		return nil, err
	}
	if err := locker.Acquire(ctx, node, types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}); err != nil {
		return nil, fmt.Errorf("bind %s/%s to %s: %w", pod.Namespace, pod.Name, node, err)
	}
	if _, err := s.patchPod(ctx, pod, map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		allocation.KeyBindPhase: string(allocation.PhaseAllocating),
		allocation.KeyBindTime:  unix(s.opts.Clock),
	}}}); err != nil {
		return nil, err
	}
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}
	pods := s.client.CoreV1().Pods(pod.Namespace)
	if err := pods.Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create the binding of %s/%s to %s: %w", pod.Namespace, pod.Name, node, err)
	}
	bound, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if bound.Spec.NodeName == "" { // client-go's fake clientset does not implement pods/binding
		bound.Spec.NodeName = node
		if bound, err = pods.Update(ctx, bound, metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("set spec.nodeName of %s/%s: %w", pod.Namespace, pod.Name, err)
		}
	}
	return bound, nil
}

func (s *Scheduler) patchPod(ctx context.Context, pod *corev1.Pod, patch map[string]any) (*corev1.Pod, error) {
	data, err := json.Marshal(patch)
	if err != nil {
		return nil, err
	}
	out, err := s.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, data, metav1.PatchOptions{})
	if err != nil {
		return nil, fmt.Errorf("patch %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return out, nil
}

func unix(c clock.PassiveClock) string {
	return strconv.FormatInt(c.Now().Unix(), 10)
}
