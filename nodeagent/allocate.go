package nodeagent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/kubeletplugin"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nodelock"
)

// FieldManager is the field manager named in the agent's pod patches.
const FieldManager = "hamireg-nodeagent"

// apiBackoff is how Allocate retries a request that failed for a transient reason (the API
// server restarting, a timeout, 429/5xx): 7 tries over about 6 s (waits of 0.1, 0.2, ...,
// 3.2 s), so that a restarting API server does not fail a pod, while the kubelet's
// admission, which waits for Allocate, is held up for seconds at most. No Cap: wait.Backoff
// ends the schedule (Steps = 0) at the first wait that would exceed its Cap, so a 2 s cap
// made it 5 tries over about 3 s (seen in test/e2e/nodeagent).
var apiBackoff = wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 7}

// transient reports whether a request error is worth retrying.
func transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	switch {
	case apierrors.IsNotFound(err), apierrors.IsUnauthorized(err),
		apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsConflict(err):
		return false
	}
	// Timeouts, 429, 5xx, connection refused or reset; and Forbidden, which a restarted API
	// server answers until its RBAC authorizer has caught up (a real denial fails a few
	// seconds later, with the same error).
	return true
}

// call runs one API request with the Allocate retry schedule.
func (a *Agent) call(ctx context.Context, f func() error) error {
	return retry.OnError(a.backoff, func(err error) bool { return transient(err) && ctx.Err() == nil }, f)
}

// allocate is the device plugin's Allocate: one container per request (the kubelet sends
// one), served one at a time.
func (a *Agent) allocate(ctx context.Context, devices []annotation.Device, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	a.allocMu.Lock()
	defer a.allocMu.Unlock()
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.GetContainerRequests() {
		var (
			r   *pluginapi.ContainerAllocateResponse
			err error
		)
		if a.vendor.ToAllocateKey == "" {
			r, err = a.allocateDirect(ctx, devices, cr.GetDevicesIds())
		} else {
			r, err = a.allocateContainer(ctx, devices, cr.GetDevicesIds())
		}
		if err != nil {
			if ae, ok := errors.AsType[*AllocateError](err); ok && (errors.Is(ae.Kind, ErrAPI) || ae.finishing && (!ae.PhaseFailed || !ae.LockReleased)) {
				a.needCleanup(a.clock.Now(), types.NamespacedName{})
			}
			a.stats.allocateFailures.Add(1)
			a.metrics.allocateFailed(err)
			klog.FromContext(ctx).Error(err, "Allocate failed")
			return nil, err
		}
		a.stats.allocations.Add(1)
		a.metrics.allocated()
		resp.ContainerResponses = append(resp.ContainerResponses, r)
	}
	return resp, nil
}

// bound is the pod the node lock names, checked to be the one to serve.
type bound struct {
	pod   *corev1.Pod
	owner types.NamespacedName
}

// findPod finds the pod to serve through the node lock, no LIST: the lock is read from the
// register writer's watch of the Node, and only when the pod it names is not the one to serve
// (the watch may lag) from a GET of the Node; then one GET of the pod. It checks that the
// pod is bound to this node and being allocated; a pod that is past allocation has its stale
// lock released.
func (a *Agent) findPod(ctx context.Context) (bound, *AllocateError) {
	if b, ok := a.fromWatch(ctx); ok {
		return b, nil
	}
	return a.findPodFresh(ctx)
}

// fromWatch returns the pod that the node lock in the watch's copy of the Node names, when it
// is bound to this node and being allocated. It changes nothing.
func (a *Agent) fromWatch(ctx context.Context) (bound, bool) {
	node := a.writer.Node()
	if node == nil {
		return bound{}, false
	}
	lock, present, err := nodelock.FromAnnotations(node.Annotations)
	if !present || err != nil {
		return bound{}, false
	}
	owner, ok := lock.Owner()
	if !ok {
		return bound{}, false
	}
	pod, err := a.client.CoreV1().Pods(owner.Namespace).Get(ctx, owner.Name, metav1.GetOptions{})
	if err != nil || pod.Spec.NodeName != a.node || allocation.BindPhase(pod.Annotations[allocation.KeyBindPhase]) != allocation.PhaseAllocating {
		return bound{}, false
	}
	return bound{pod: pod, owner: owner}, true
}

// findPodFresh is findPod with the Node read from the API server.
func (a *Agent) findPodFresh(ctx context.Context) (bound, *AllocateError) {
	var node *corev1.Node
	err := a.call(ctx, func() (err error) {
		node, err = a.client.CoreV1().Nodes().Get(ctx, a.node, metav1.GetOptions{})
		return err
	})
	if err != nil {
		return bound{}, &AllocateError{Node: a.node, Kind: ErrAPI, Detail: "get node", Err: err}
	}
	lock, present, err := nodelock.FromAnnotations(node.Annotations)
	if !present {
		return bound{}, &AllocateError{Node: a.node, Kind: ErrNoBindingPod, Detail: fmt.Sprintf(
			"the node carries no %s: the pod was not bound by a HAMi-compatible scheduler (check its schedulerName), or its lock was already removed", nodelock.Key)}
	}
	if err != nil {
		return bound{}, &AllocateError{Node: a.node, Kind: ErrMalformed, Detail: "node lock " + nodelock.Key, Err: err}
	}
	owner, ok := lock.Owner()
	if !ok {
		return bound{}, &AllocateError{Node: a.node, Kind: ErrNoBindingPod, Detail: fmt.Sprintf(
			"the node lock %q names no pod (legacy format); this agent serves only the pod the lock names", lock)}
	}
	var pod *corev1.Pod
	err = a.call(ctx, func() (err error) {
		pod, err = a.client.CoreV1().Pods(owner.Namespace).Get(ctx, owner.Name, metav1.GetOptions{})
		return err
	})
	switch {
	case apierrors.IsNotFound(err):
		e := &AllocateError{Node: a.node, Pod: owner, Kind: ErrPodGone, Detail: "deleted between bind and Allocate"}
		e.LockReleased = a.release(ctx, owner)
		return bound{}, e
	case err != nil:
		return bound{}, &AllocateError{Node: a.node, Pod: owner, Kind: ErrAPI, Detail: "get pod", Err: err}
	}
	b := bound{pod: pod, owner: owner}
	if pod.Spec.NodeName != a.node {
		// The scheduler may still be between taking the lock and the Binding: leave both alone.
		return bound{}, &AllocateError{Node: a.node, Pod: owner, Kind: ErrNoBindingPod, Detail: fmt.Sprintf(
			"the node lock names this pod, but it is bound to %q, not to this node; the container being admitted is not the locked pod's (its devices are not handed to another pod)", pod.Spec.NodeName)}
	}
	switch phase := allocation.BindPhase(pod.Annotations[allocation.KeyBindPhase]); phase {
	case allocation.PhaseAllocating:
		return b, nil
	case allocation.PhaseSuccess, allocation.PhaseFailed:
		e := &AllocateError{Node: a.node, Pod: owner, Kind: ErrNoBindingPod, Detail: fmt.Sprintf(
			"the node lock names this pod, which is past allocation (%s %s); the container being admitted is not the locked pod's", allocation.KeyBindPhase, phase)}
		e.LockReleased = a.release(ctx, owner)
		return bound{}, e
	default:
		return bound{}, a.fail(ctx, b, &AllocateError{Node: a.node, Pod: owner, Kind: ErrNoBindingPod, Detail: fmt.Sprintf(
			"the pod has %s %q, not %q: it was not bound by a HAMi-compatible scheduler", allocation.KeyBindPhase, phase, allocation.PhaseAllocating)})
	}
}

// allocateContainer serves the pod's next container entry.
func (a *Agent) allocateContainer(ctx context.Context, devices []annotation.Device, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	logger := klog.FromContext(ctx)
	b, aerr := a.findPod(ctx)
	if aerr != nil {
		return nil, aerr
	}
	pod, key := b.pod, a.vendor.ToAllocateKey
	logger = klog.LoggerWithValues(logger, "pod", klog.KObj(pod))
	failure := func(kind error, ctr, detail string, err error) error {
		return a.fail(ctx, b, &AllocateError{Node: a.node, Pod: b.owner, Container: ctr, Kind: kind, Detail: detail, Err: err})
	}
	pd, err := allocation.DecodePodDevices(pod.Annotations[key], a.version)
	if err != nil {
		a.metrics.decodeFailed()
		return nil, failure(ErrMalformed, "", "annotation "+key, err)
	}
	i, ok := pd.Next()
	if !ok {
		return nil, failure(ErrNoPendingEntry, "", fmt.Sprintf("%s has no container entry with devices left", key), nil)
	}
	ctr, ok := allocation.ContainerAt(pod, i)
	if !ok {
		return nil, failure(ErrMalformed, "", fmt.Sprintf("%s has entry %d, the pod only %d containers", key, i, len(pod.Spec.InitContainers)+len(pod.Spec.Containers)), nil)
	}
	entry := pd[i]
	if len(entry) != len(ids) {
		return nil, failure(ErrDeviceCountMismatch, ctr.Name, fmt.Sprintf("the kubelet asked for %d device(s), the scheduler assigned %d", len(ids), len(entry)), nil)
	}
	if err := a.ownershipConflict(entryUUIDs(entry)); err != nil {
		return nil, failure(ErrOwnership, ctr.Name, "devices "+strings.Join(entryUUIDs(entry), ","), err)
	}
	if !sameGPUs(entry, ids) {
		logger.V(2).Info("The kubelet chose other replicas than the scheduler's GPUs; serving the scheduler's", "kubelet", ids, "scheduler", entryUUIDs(entry))
	}
	isMIG, err := migEntry(entry, devices)
	if err != nil {
		return nil, failure(ErrMIG, ctr.Name, "devices "+strings.Join(entryUUIDs(entry), ","), err)
	}
	var realised *migRealisation
	if a.version == annotation.VersionV290 && (isMIG || legacyMIGEntry(entry)) {
		return nil, failure(ErrMIG, ctr.Name, fmt.Sprintf(
			"the entry %v is HAMi v2.9.0 MIG (a GPU in MIG mode, \"[template-position]\" geometries of nvidia-mig-parted), which this agent does not serve: run HAMi master's dynamic MIG (Options.Version VersionMaster, reservations in %s)",
			entryUUIDs(entry), mig.KeyAllocations), nil)
	}
	if isMIG {
		r, aerr := a.realiseMIG(ctx, b, i, ctr, entry)
		if aerr != nil {
			aerr.Node, aerr.Pod, aerr.Container = a.node, b.owner, ctr.Name
			return nil, a.fail(ctx, b, aerr)
		}
		realised = r
	}
	req := ContainerRequest{Pod: pod, Container: ctr, Devices: entry, NodeDevices: devices, DeviceIDs: ids}
	if realised != nil {
		req.MIG = realised.instances
	}
	resp, aerr := a.answer(ctx, req)
	if aerr != nil {
		a.undoMIG(ctx, realised)
		aerr.Node, aerr.Pod, aerr.Container = a.node, b.owner, ctr.Name
		return nil, a.fail(ctx, b, aerr)
	}
	if realised != nil {
		if err := a.recordMIG(ctx, b, realised); err != nil {
			a.undoMIG(ctx, realised)
			return nil, failure(ErrAPI, ctr.Name, "record the MIG devices' runtime identity in "+mig.KeyAllocations, err)
		}
	}
	rest := pd.Consume(i)
	patch := map[string]string{key: allocation.EncodePodDevices(rest)}
	_, more := rest.Next()
	if !more { // the last entry: bind-phase success in the same write
		patch[allocation.KeyBindPhase] = string(allocation.PhaseSuccess)
	}
	if err := a.patchPod(ctx, b.owner, patch); err != nil {
		a.undoMIG(ctx, realised)
		return nil, failure(ErrAPI, ctr.Name, "write back "+key, err)
	}
	logger.V(2).Info("Allocated container devices", "container", ctr.Name, "devices", entryUUIDs(entry))
	if !more {
		a.complete(ctx, b)
	}
	return resp, nil
}

// answer asks the Allocator for the container's answer and converts it; the error is the
// AllocateError to fail with (its pod fields unset).
func (a *Agent) answer(ctx context.Context, req ContainerRequest) (*pluginapi.ContainerAllocateResponse, *AllocateError) {
	r, err := a.alloc.Allocate(ctx, req)
	if err != nil {
		kind := ErrAllocator
		if errors.Is(err, ErrHost) {
			kind = ErrHost
		}
		return nil, &AllocateError{Kind: kind, Detail: fmt.Sprintf("the vendor's Allocator (%T) failed for devices %v", a.alloc, entryUUIDs(req.Devices)), Err: err}
	}
	resp, err := containerResponse(r)
	if err != nil {
		return nil, &AllocateError{Kind: ErrAllocator, Detail: fmt.Sprintf("the vendor's Allocator (%T) answered what the kubelet cannot use", a.alloc), Err: err}
	}
	return resp, nil
}

// allocateDirect serves a container of a vendor without a to-allocate annotation: no pod
// names the devices, so the kubelet's replica IDs are mapped to the node's devices and the
// Allocator is asked for them; there is no lock, entry or bind-phase to handle.
func (a *Agent) allocateDirect(ctx context.Context, devices []annotation.Device, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	entry := make(allocation.ContainerDevices, 0, len(ids))
	for _, id := range ids {
		u, _, err := kubeletplugin.ParseVirtualDeviceID(id)
		if err == nil && !slices.ContainsFunc(devices, func(d annotation.Device) bool { return d.ID == u }) {
			err = fmt.Errorf("device %s is not one of the node's %d device(s)", u, len(devices))
		}
		if err != nil {
			return nil, &AllocateError{Node: a.node, Kind: ErrMalformed, Detail: fmt.Sprintf("the kubelet asked for replica %q", id), Err: err}
		}
		entry = append(entry, allocation.ContainerDevice{UUID: u, Type: a.vendor.Name})
	}
	if err := a.ownershipConflict(entryUUIDs(entry)); err != nil {
		return nil, &AllocateError{Node: a.node, Kind: ErrOwnership, Detail: "devices " + strings.Join(entryUUIDs(entry), ","), Err: err}
	}
	resp, aerr := a.answer(ctx, ContainerRequest{Devices: entry, NodeDevices: devices, DeviceIDs: ids})
	if aerr != nil {
		aerr.Node = a.node
		return nil, aerr
	}
	klog.FromContext(ctx).V(2).Info("Allocated container devices", "devices", entryUUIDs(entry))
	return resp, nil
}

// complete ends the protocol for a pod whose last entry was served and whose bind-phase is
// success: the lock is released. A failed release is logged and left to the cleanup loop;
// the container's Allocate still succeeds.
func (a *Agent) complete(ctx context.Context, b bound) {
	released := a.release(ctx, b.owner)
	if !released {
		a.needCleanup(time.Time{}, b.owner)
	}
	a.stats.podsCompleted.Add(1)
	klog.FromContext(ctx).V(2).Info("Pod allocated", "lockReleased", released)
}

// fail ends the protocol for a pod that cannot be served: bind-phase failed and the lock
// released, an Event on the pod; it returns e with what was done.
func (a *Agent) fail(ctx context.Context, b bound, e *AllocateError) *AllocateError {
	logger := klog.FromContext(ctx)
	e.finishing = true
	if err := a.patchPod(ctx, b.owner, map[string]string{allocation.KeyBindPhase: string(allocation.PhaseFailed)}); err != nil {
		logger.Error(err, "Failed to set bind-phase failed", "pod", klog.KRef(b.owner.Namespace, b.owner.Name))
	} else {
		e.PhaseFailed = true
	}
	e.LockReleased = a.release(ctx, b.owner)
	a.events.Event(b.pod, corev1.EventTypeWarning, EventReasonAllocateFailed, truncate(e.Error()))
	return e
}

// release removes the node lock if owner holds it, and reports whether the node is unlocked
// (or locked by someone else) afterwards.
func (a *Agent) release(ctx context.Context, owner types.NamespacedName) bool {
	err := a.locks.Release(ctx, a.node, owner)
	if err == nil {
		return true
	}
	if !errors.Is(err, nodelock.ErrNotOwner) {
		klog.FromContext(ctx).Error(err, "Failed to release the node lock", "pod", klog.KRef(owner.Namespace, owner.Name))
	}
	return false
}

// patchPod merge-patches annotations of the pod.
func (a *Agent) patchPod(ctx context.Context, pod types.NamespacedName, annotations map[string]string) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return fmt.Errorf("encode patch of pod %s: %w", pod, err)
	}
	return a.call(ctx, func() error {
		_, err := a.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, body, metav1.PatchOptions{FieldManager: FieldManager})
		return err
	})
}

// sameGPUs reports whether the kubelet's ids are replicas of exactly the entry's GPUs.
func sameGPUs(entry allocation.ContainerDevices, ids []string) bool {
	want := entryUUIDs(entry)
	got := make([]string, 0, len(ids))
	for _, id := range ids {
		u, _, err := kubeletplugin.ParseVirtualDeviceID(id)
		if err != nil {
			return false
		}
		got = append(got, u)
	}
	slices.Sort(want)
	slices.Sort(got)
	return slices.Equal(want, got)
}

func entryUUIDs(entry allocation.ContainerDevices) []string {
	out := make([]string, len(entry))
	for i, d := range entry {
		out[i] = d.GPU()
	}
	return out
}

// preferredAllocation answers GetPreferredAllocation: for the container being admitted, the
// replica ids of the GPUs the scheduler assigned to the pod's next entry, so that the
// kubelet's accounting and HAMi's agree. When the pod cannot be found or the sizes differ, it
// answers no preference for that container (the kubelet then picks, and Allocate still serves
// the scheduler's GPUs). It changes nothing.
func (a *Agent) preferredAllocation(ctx context.Context, _ []annotation.Device, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	logger := klog.FromContext(ctx)
	var entries []allocation.ContainerDevices
	if b, err := a.peekPod(ctx); err != nil {
		logger.V(3).Info("No preferred allocation", "reason", err.Error())
	} else if pd, err := allocation.DecodePodDevices(b.pod.Annotations[a.vendor.ToAllocateKey], a.version); err == nil {
		for _, e := range pd {
			if len(e) > 0 {
				entries = append(entries, e)
			}
		}
	}
	resp := &pluginapi.PreferredAllocationResponse{}
	for k, cr := range req.GetContainerRequests() {
		var ids []string
		if k < len(entries) {
			ids = pick(entries[k], cr)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// peekPod finds the pod as Allocate does, without changing anything.
func (a *Agent) peekPod(ctx context.Context) (bound, error) {
	if b, ok := a.fromWatch(ctx); ok {
		return b, nil
	}
	node, err := a.client.CoreV1().Nodes().Get(ctx, a.node, metav1.GetOptions{})
	if err != nil {
		return bound{}, err
	}
	lock, present, err := nodelock.FromAnnotations(node.Annotations)
	if !present || err != nil {
		return bound{}, fmt.Errorf("no usable node lock (present %v): %w", present, err)
	}
	owner, ok := lock.Owner()
	if !ok {
		return bound{}, errors.New("the node lock names no pod")
	}
	pod, err := a.client.CoreV1().Pods(owner.Namespace).Get(ctx, owner.Name, metav1.GetOptions{})
	if err != nil {
		return bound{}, err
	}
	if pod.Spec.NodeName != a.node || allocation.BindPhase(pod.Annotations[allocation.KeyBindPhase]) != allocation.PhaseAllocating {
		return bound{}, fmt.Errorf("pod %s is not being allocated on this node", owner)
	}
	return bound{pod: pod, owner: owner}, nil
}

// pick returns, for each GPU of entry, one replica id of it: the must-include ids first, then
// the available ones in order; nil when the size differs or a GPU has no replica left.
func pick(entry allocation.ContainerDevices, cr *pluginapi.ContainerPreferredAllocationRequest) []string {
	if int(cr.GetAllocationSize()) != len(entry) {
		return nil
	}
	pool := append(slices.Clone(cr.GetMustIncludeDeviceIDs()), sortedIDs(cr.GetAvailableDeviceIDs())...)
	used := map[string]bool{}
	out := make([]string, 0, len(entry))
	for _, d := range entry {
		found := false
		for _, id := range pool {
			if used[id] {
				continue
			}
			if u, _, err := kubeletplugin.ParseVirtualDeviceID(id); err == nil && u == d.GPU() {
				used[id], found = true, true
				out = append(out, id)
				break
			}
		}
		if !found {
			return nil
		}
	}
	return out
}

// sortedIDs orders replica ids by GPU and replica number, so that the choice does not depend
// on the kubelet's set order.
func sortedIDs(ids []string) []string {
	out := slices.Clone(ids)
	slices.SortFunc(out, func(x, y string) int {
		ux, ix, ex := kubeletplugin.ParseVirtualDeviceID(x)
		uy, iy, ey := kubeletplugin.ParseVirtualDeviceID(y)
		if ex != nil || ey != nil {
			return cmp.Compare(x, y)
		}
		if c := cmp.Compare(ux, uy); c != 0 {
			return c
		}
		return ix - iy
	})
	return out
}

// needCleanup records an Allocate that could not finish the protocol because the API server
// did not answer. A failure at failedAt (non-zero): the pod it served is rejected by the
// kubelet, and its bind-phase and the node lock must still be set right once the API server
// is back. A completed pod done (non-zero): its bind-phase success or lock release is owed.
func (a *Agent) needCleanup(failedAt time.Time, done types.NamespacedName) {
	a.cleanupMu.Lock()
	if failedAt.After(a.cleanupAt) {
		a.cleanupAt = failedAt
	}
	if done.Name != "" {
		a.cleanupDone = done
	}
	a.cleanupMu.Unlock()
	select {
	case a.cleanupKick <- struct{}{}:
	default:
	}
}

// cleanupLoop finishes the protocol for pods whose Allocate failed while the API server was
// away, retrying every second, doubling up to the period, until it succeeds.
func (a *Agent) cleanupLoop(ctx context.Context) {
	logger := klog.FromContext(ctx)
	timer := a.clock.NewTimer(a.period)
	timer.Stop()
	defer timer.Stop()
	var wait time.Duration
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.cleanupKick:
		case <-timer.C():
		}
		a.cleanupMu.Lock()
		at, done := a.cleanupAt, a.cleanupDone
		a.cleanupMu.Unlock()
		if at.IsZero() && done.Name == "" {
			continue
		}
		a.allocMu.Lock()
		err := a.cleanup(ctx, at, done)
		a.allocMu.Unlock()
		if err == nil {
			a.cleanupMu.Lock()
			if a.cleanupAt.Equal(at) {
				a.cleanupAt = time.Time{}
			}
			if a.cleanupDone == done {
				a.cleanupDone = types.NamespacedName{}
			}
			a.cleanupMu.Unlock()
			wait = 0
			continue
		}
		if ctx.Err() != nil {
			return
		}
		wait = min(max(2*wait, DefaultRetryInitial), a.period)
		logger.Error(err, "Failed to clean up after a failed Allocate; retrying", "retryIn", wait)
		timer.Reset(wait)
	}
}

// cleanup finishes the protocol for the pod the node lock names: done (its last container was
// served) gets bind-phase success; a pod that took the lock no later than at (its Allocate
// failed then), is bound here and still allocating gets bind-phase failed; either way, and
// for a pod past allocation or deleted, the lock is released.
func (a *Agent) cleanup(ctx context.Context, at time.Time, done types.NamespacedName) error {
	node, err := a.client.CoreV1().Nodes().Get(ctx, a.node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get node: %w", err)
	}
	lock, present, err := nodelock.FromAnnotations(node.Annotations)
	if !present || err != nil {
		return nil //nolint:nilerr // no lock, or a malformed one: nothing this agent may judge
	}
	owner, ok := lock.Owner()
	if !ok || (owner != done && (at.IsZero() || lock.Time.After(at))) {
		return nil // a later pod's lock
	}
	pod, err := a.client.CoreV1().Pods(owner.Namespace).Get(ctx, owner.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if err := a.locks.Release(ctx, a.node, owner); err != nil && !errors.Is(err, nodelock.ErrNotOwner) {
			return fmt.Errorf("release the lock of deleted pod %s: %w", owner, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("get pod %s: %w", owner, err)
	}
	if pod.Spec.NodeName != a.node {
		return nil
	}
	phase := allocation.BindPhase(pod.Annotations[allocation.KeyBindPhase])
	if owner == done && phase != allocation.PhaseSuccess {
		if err := a.patchPod(ctx, owner, map[string]string{allocation.KeyBindPhase: string(allocation.PhaseSuccess)}); err != nil {
			return fmt.Errorf("set bind-phase success of pod %s: %w", owner, err)
		}
		phase = allocation.PhaseSuccess
	}
	if phase != allocation.PhaseAllocating {
		if err := a.locks.Release(ctx, a.node, owner); err != nil && !errors.Is(err, nodelock.ErrNotOwner) {
			return fmt.Errorf("release the lock of pod %s: %w", owner, err)
		}
		return nil
	}
	e := a.fail(ctx, bound{pod: pod, owner: owner}, &AllocateError{Node: a.node, Pod: owner, Kind: ErrAPI,
		Detail: "Allocate failed while the API server did not answer; the kubelet rejected the pod"})
	if !e.PhaseFailed || !e.LockReleased {
		return e
	}
	klog.FromContext(ctx).Info("Cleaned up after a failed Allocate", "pod", klog.KObj(pod))
	return nil
}
