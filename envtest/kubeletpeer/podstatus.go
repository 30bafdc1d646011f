package kubeletpeer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
)

// ErrSyncRunning is returned by SyncPodStatus while another SyncPodStatus of the same
// manager runs: the manager has one updates channel, as the kubelet has one sync loop.
var ErrSyncRunning = errors.New("pod status sync already running")

// This file is the part of the kubelet that carries device health into pods
// (KEP-4680, the ResourceHealthStatus gate, beta and on in 1.36+): when a pod's status is
// computed (kubelet_pods.go convertToAPIContainerStatuses, then
// containerManager.UpdateAllocatedResourcesStatus), each manager writes the health of the
// pod's devices into status.containerStatuses[].allocatedResourcesStatus; and when a manager
// signals on its updates channel that a device's health changed, the kubelet's sync loop
// syncs the pods it names, which writes their status again.

// podRegistry is the pods a manager was given (Prepare, Allocate, Admit), by UID: the
// kubelet's pod manager, which SyncPodStatus needs to turn an update's pod UIDs into pods.
type podRegistry struct {
	mu   sync.Mutex
	pods map[types.UID]types.NamespacedName
}

func (r *podRegistry) add(pod *corev1.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pods == nil {
		r.pods = map[types.UID]types.NamespacedName{}
	}
	r.pods[pod.UID] = types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
}

func (r *podRegistry) remove(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pods, uid)
}

func (r *podRegistry) get(uid types.UID) (types.NamespacedName, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.pods[uid]
	return n, ok
}

// writePodStatus reads the pod named n, lets update set the allocatedResourcesStatus of a
// copy of its status (after adding a waiting status for every container the status lacks,
// as the kubelet reports every container), and writes the status when it changed, retrying
// on conflicts. Entries and resources are sorted by name and ID, so that the same health
// writes nothing.
func writePodStatus(ctx context.Context, pods corev1client.PodsGetter, n types.NamespacedName, update func(*corev1.Pod, *corev1.PodStatus) error) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := pods.Pods(n.Namespace).Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		status := pod.Status.DeepCopy()
		for _, c := range pod.Spec.Containers {
			if !slices.ContainsFunc(status.ContainerStatuses, func(s corev1.ContainerStatus) bool { return s.Name == c.Name }) {
				status.ContainerStatuses = append(status.ContainerStatuses, corev1.ContainerStatus{
					Name: c.Name, Image: c.Image,
					State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}},
				})
			}
		}
		if err := update(pod, status); err != nil {
			return err
		}
		for i := range status.ContainerStatuses {
			rs := status.ContainerStatuses[i].AllocatedResourcesStatus
			slices.SortFunc(rs, func(a, b corev1.ResourceStatus) int { return cmp.Compare(a.Name, b.Name) })
			for j := range rs {
				slices.SortFunc(rs[j].Resources, func(a, b corev1.ResourceHealth) int { return cmp.Compare(a.ResourceID, b.ResourceID) })
			}
		}
		if equality.Semantic.DeepEqual(*status, pod.Status) {
			return nil
		}
		pod.Status = *status
		_, err = pods.Pods(n.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("write the allocated resources' health of pod %s: %w", n, err)
	}
	return nil
}

// UpdateAllocatedResourcesStatus is the DRA manager's part of the kubelet's pod status
// (dra.Manager.UpdateAllocatedResourcesStatus): for each entry of status.ContainerStatuses
// whose container uses claims of pod that the manager prepared, it sets one
// allocatedResourcesStatus entry per claim (name "claim:<pod claim name>", or
// "claim:<name>/<request>" for a container that names a request) with the health of each
// allocated device (resourceID: the device's first CDI device ID, else
// <driver>/<pool>/<device>; health Healthy, Unhealthy or Unknown, as the driver reported it
// through its DRAResourceHealth stream and not older than the device's health check
// timeout). Other entries (device plugins') are kept. It changes nothing else and writes
// nothing to the API server.
func (m *DRAManager) UpdateAllocatedResourcesStatus(pod *corev1.Pod, status *corev1.PodStatus) {
	m.mgr.UpdateAllocatedResourcesStatus(m.logger, pod, status)
}

// WritePodStatus is the kubelet's status sync of pod as far as DRA device health goes: it
// reads the pod from the API server, adds a waiting container status (reason
// ContainerCreating) for each container the status lacks, sets the allocatedResourcesStatus
// of the containers with [DRAManager.UpdateAllocatedResourcesStatus] and writes the status
// (UpdateStatus, retried on conflicts) when it changed. pods needs get and update of
// pods/status.
func (m *DRAManager) WritePodStatus(ctx context.Context, pods corev1client.PodsGetter, pod *corev1.Pod) error {
	return writePodStatus(ctx, pods, types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, func(p *corev1.Pod, s *corev1.PodStatus) error {
		m.UpdateAllocatedResourcesStatus(p, s)
		return nil
	})
}

// SyncPodStatus is the kubelet's sync loop for device health (the DRA manager's updates
// channel, as kubelet.go's syncLoopIteration reads containerManager.Updates()): each time
// the manager reports that the health of devices changed, it writes the status of the pods
// that hold them ([DRAManager.WritePodStatus]) among the pods given to
// [DRAManager.Prepare] and not unprepared since. It blocks until ctx ends or the manager
// stops, then returns nil; a failed write is logged (klog.FromContext(ctx)) and the loop
// goes on. One SyncPodStatus at a time ([ErrSyncRunning]). The manager drops updates while
// no SyncPodStatus reads them (the kubelet's channel holds 10).
func (m *DRAManager) SyncPodStatus(ctx context.Context, pods corev1client.PodsGetter) error {
	if !m.syncing.CompareAndSwap(false, true) {
		return fmt.Errorf("sync pod status of the DRA manager: %w", ErrSyncRunning)
	}
	defer m.syncing.Store(false)
	logger := klog.FromContext(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-m.done:
			return nil
		case u := <-m.mgr.Updates():
			syncPods(ctx, logger, pods, u.PodUIDs, &m.status, m.WritePodStatus)
		}
	}
}

// syncPods writes the status of the registered pods among uids with write.
func syncPods(ctx context.Context, logger klog.Logger, pods corev1client.PodsGetter, uids []string, reg *podRegistry,
	write func(context.Context, corev1client.PodsGetter, *corev1.Pod) error) {
	for _, uid := range uids {
		n, ok := reg.get(types.UID(uid))
		if !ok {
			logger.V(4).Info("Device health update for a pod the peer does not know, ignored", "podUID", uid)
			continue
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: n.Namespace, Name: n.Name, UID: types.UID(uid)}}
		if err := write(ctx, pods, pod); err != nil {
			logger.Error(err, "Pod status sync after a device health update failed", "pod", klog.KRef(n.Namespace, n.Name))
			continue
		}
		logger.V(3).Info("Pod status synced after a device health update", "pod", klog.KRef(n.Namespace, n.Name))
	}
}
