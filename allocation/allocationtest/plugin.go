package allocationtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nodelock"
)

// Errors of [Plugin.Allocate], with HAMi's device plugin's words; test with errors.Is.
var (
	// ErrNoBindingPod: the node lock names no pod and no pod of the node is being bound.
	ErrNoBindingPod = errors.New("no binding pod found")
	// ErrMalformedLock: the node lock is neither HAMi's "time,namespace,name" nor a legacy
	// time alone.
	ErrMalformedLock = errors.New("malformed lock annotation")
	// ErrNoDeviceRequest: the pod has no to-allocate annotation, or (v2.9.0) no entry left.
	ErrNoDeviceRequest = errors.New("device request not found")
	// ErrNoPendingEntry: every entry of the pod's to-allocate list is empty (master's words).
	ErrNoPendingEntry = errors.New("no pending device allocation found")
	// ErrDeviceCountMismatch: the kubelet asked for another number of devices than the entry
	// holds.
	ErrDeviceCountMismatch = errors.New("device number not matched")
	// ErrMIGUnresolved: in operating mode mig (Options.Mode, HAMi master) a device of the
	// entry carries no MIG reservation, so HAMi's plugin has no MIG instance to resolve it to.
	// The error reads as HAMi's: "resolve allocated NVIDIA devices: MIG allocation requires an
	// initialized manager and Pod".
	ErrMIGUnresolved = errors.New("MIG allocation requires an initialized manager and Pod")
)

// Plugin plays HAMi's device plugin on one node, for the tests of a scheduler or extender.
// Create it with [NewPlugin]; each [Plugin.Allocate] is one Allocate call of the kubelet.
type Plugin struct {
	client kubernetes.Interface
	node   string
	opts   Options
}

// NewPlugin returns a Plugin for node that reads and writes through client. opts.Vendor names
// the to-allocate key, opts.Version the HAMi release.
func NewPlugin(client kubernetes.Interface, node string, opts Options) *Plugin {
	return &Plugin{client: client, node: node, opts: opts.withDefaults()}
}

// Allocation is what one [Plugin.Allocate] served.
type Allocation struct {
	// Pod is the pod served, zero when none was found.
	Pod types.NamespacedName
	// Container is the name of the container whose entry was served ("" when not known) and
	// Devices its devices, with their MIG slots when the pod has a MIG reservation.
	Container string
	Devices   allocation.ContainerDevices
	// Last is true when the entry was the pod's last: bind-phase success was set and the node
	// lock released.
	Last bool
	// Failed is true when the pod's bind-phase was set to failed (after an error).
	Failed bool
}

// Allocate does what HAMi's device plugin does when the kubelet calls Allocate for one
// container that asks for count devices (0: as many as the entry holds, no check):
//
//  1. It GETs the Node and reads the node lock (hami.io/mutex.lock), which names the pod.
//     Without a lock (or with a legacy lock of a time alone) it LISTs the node's pods and takes
//     the first Pending one with hami.io/bind-time, bind-phase allocating or success and
//     hami.io/vgpu-node naming the node (HAMi's fallback); without one, [ErrNoBindingPod]. A
//     lock it cannot read is [ErrMalformedLock], and nothing is written.
//  2. It GETs the pod and decodes its to-allocate list (Options.Vendor.ToAllocateKey) as HAMi
//     does, takes the first entry with devices and checks its size. A MIG reservation
//     (hami.io/vgpu-mig-allocations, HAMi master) is read onto the devices
//     (allocation.WithMIG); one that does not decode or does not match the list fails the
//     call (an error wrapping mig.ErrMalformed). In operating mode mig (Options.Mode) with
//     Version master, an entry with a device that has no MIG reservation fails the call
//     ([ErrMIGUnresolved]), as HAMi v2.10.0's plugin fails it. The instances themselves are
//     not played.
//  3. It writes the list back with that entry emptied, re-encoded as HAMi re-encodes it: HAMi
//     keeps the empty piece after the last ';' as an entry, so every write adds one ';'
//     ("a:;b:;" becomes ";b:;;", then ";;;;").
//  4. After the last entry it sets bind-phase success and releases the lock (when there was
//     one), as two more writes.
//
// Once the pod is known, every failure sets bind-phase failed and releases the lock, and the
// error says why ([ErrNoDeviceRequest], [ErrNoPendingEntry], [ErrDeviceCountMismatch],
// [ErrMIGUnresolved], or the decoding error). Errors of the API server are returned as they are.
func (p *Plugin) Allocate(ctx context.Context, count int) (Allocation, error) {
	node, err := p.client.CoreV1().Nodes().Get(ctx, p.node, metav1.GetOptions{})
	if err != nil {
		return Allocation{}, fmt.Errorf("get node %s: %w", p.node, err)
	}
	pod, locked, err := p.findPod(ctx, node)
	if err != nil {
		return Allocation{}, err
	}
	a := Allocation{Pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}}
	fail := func(err error) (Allocation, error) {
		if perr := p.patch(ctx, pod, map[string]any{allocation.KeyBindPhase: string(allocation.PhaseFailed)}); perr != nil {
			return a, errors.Join(err, perr)
		}
		a.Failed = true
		if locked {
			if rerr := p.release(ctx, a.Pod); rerr != nil {
				return a, errors.Join(err, rerr)
			}
		}
		return a, err
	}
	key := p.opts.Vendor.ToAllocateKey
	value, ok := pod.Annotations[key]
	if !ok {
		return fail(fmt.Errorf("%w: pod %s has no %s", ErrNoDeviceRequest, a.Pod, key))
	}
	pd, err := allocation.DecodePodDevices(value, p.opts.Version)
	if err != nil {
		return fail(fmt.Errorf("pod %s: %w", a.Pod, err))
	}
	if reservation, has := pod.Annotations[mig.KeyAllocations]; has {
		allocs, err := mig.DecodeAllocations(reservation)
		if err == nil {
			pd, err = allocation.WithMIG(pd, allocs)
		}
		if err != nil {
			return fail(fmt.Errorf("pod %s: %w", a.Pod, err))
		}
	}
	i, ok := pd.Next()
	if !ok {
		if p.opts.Version == annotation.VersionV290 {
			return fail(fmt.Errorf("%w: pod %s", ErrNoDeviceRequest, a.Pod))
		}
		return fail(fmt.Errorf("%w: pod %s", ErrNoPendingEntry, a.Pod))
	}
	if ctr, ok := allocation.ContainerAt(pod, i); ok {
		a.Container = ctr.Name
	}
	a.Devices = pd[i]
	if count != 0 && count != len(pd[i]) {
		return fail(fmt.Errorf("%w: pod %s: the kubelet asked for %d, the entry holds %d", ErrDeviceCountMismatch, a.Pod, count, len(pd[i])))
	}
	if p.opts.Mode == allocation.ModeMIG && p.opts.Version == annotation.VersionMaster &&
		slices.ContainsFunc(pd[i], func(d allocation.ContainerDevice) bool { return d.MIG.IsZero() }) {
		return fail(fmt.Errorf("resolve allocated NVIDIA devices: %w", ErrMIGUnresolved))
	}
	rest := pd.Consume(i)
	next := allocation.EncodePodDevices(rest)
	if strings.HasSuffix(value, ";") { // HAMi's extra empty entry
		next += ";"
	}
	if err := p.patch(ctx, pod, map[string]any{key: next}); err != nil {
		return a, err
	}
	if _, more := rest.Next(); more {
		return a, nil
	}
	if _, err := p.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); err != nil {
		return a, fmt.Errorf("get pod %s: %w", a.Pod, err)
	}
	if err := p.patch(ctx, pod, map[string]any{allocation.KeyBindPhase: string(allocation.PhaseSuccess)}); err != nil {
		return a, err
	}
	a.Last = true
	if locked {
		if err := p.release(ctx, a.Pod); err != nil {
			return a, err
		}
	}
	return a, nil
}

// findPod returns the pod to serve and whether the node lock named it.
func (p *Plugin) findPod(ctx context.Context, node *corev1.Node) (*corev1.Pod, bool, error) {
	if value, ok := node.Annotations[nodelock.Key]; ok {
		parts := strings.Split(value, ",")
		switch len(parts) {
		case 3:
			pod, err := p.client.CoreV1().Pods(parts[1]).Get(ctx, parts[2], metav1.GetOptions{})
			if err != nil {
				return nil, false, fmt.Errorf("get pod %s/%s of the node lock: %w", parts[1], parts[2], err)
			}
			return pod, true, nil
		case 1: // legacy: no pod named
		default:
			return nil, false, fmt.Errorf("%w: expected 3 parts, got %d from %s", ErrMalformedLock, len(parts), value)
		}
	}
	pods, err := p.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + p.node})
	if err != nil {
		return nil, false, fmt.Errorf("list pods of node %s: %w", p.node, err)
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		phase := allocation.BindPhase(pod.Annotations[allocation.KeyBindPhase])
		_, hasTime := pod.Annotations[allocation.KeyBindTime]
		if pod.Spec.NodeName == p.node && pod.Status.Phase == corev1.PodPending && hasTime &&
			(phase == allocation.PhaseAllocating || phase == allocation.PhaseSuccess) && pod.Annotations[allocation.KeyNode] == p.node {
			return pod, false, nil
		}
	}
	return nil, false, fmt.Errorf("%w on node %s", ErrNoBindingPod, p.node)
}

// patch merge-patches annotations of pod.
func (p *Plugin) patch(ctx context.Context, pod *corev1.Pod, annotations map[string]any) error {
	_, err := (&Scheduler{client: p.client, opts: p.opts}).patchPod(ctx, pod, map[string]any{"metadata": map[string]any{"annotations": annotations}})
	return err
}

// release removes the node lock of pod; a lock held by another pod is left alone.
func (p *Plugin) release(ctx context.Context, pod types.NamespacedName) error {
	locker, err := nodelock.New(p.client.CoreV1(), nodelock.Options{Clock: p.opts.Clock})
	if err != nil {
		return err
	}
	if err := locker.Release(ctx, p.node, pod); err != nil && !errors.Is(err, nodelock.ErrNotOwner) {
		return fmt.Errorf("release the lock of node %s: %w", p.node, err)
	}
	return nil
}
