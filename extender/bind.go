package extender

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/hamireg/hamireg/allocation"
)

// decodeBindArgs reads an ExtenderBindingArgs and checks that it names a pod and a node.
func decodeBindArgs(body io.Reader) (*extenderv1.ExtenderBindingArgs, error) {
	var args extenderv1.ExtenderBindingArgs
	if err := decodeJSON(body, &args); err != nil {
		return nil, err
	}
	if args.PodName == "" || args.PodNamespace == "" || args.Node == "" {
		return nil, errors.New("binding arguments need PodName, PodNamespace and Node")
	}
	return &args, nil
}

func (e *Extender) serveBind(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeJSON(w, http.StatusMethodNotAllowed, &extenderv1.ExtenderBindingResult{Error: "bind: method " + r.Method + " not allowed, use POST"})
		return
	}
	args, err := decodeBindArgs(http.MaxBytesReader(w, r.Body, e.opts.MaxBodyBytes))
	if err != nil {
		err = &RequestError{Route: PathBind, Err: err}
		klog.FromContext(r.Context()).V(2).Info("Refused a bind request", "err", err)
		writeJSON(w, requestStatus(err), &extenderv1.ExtenderBindingResult{Error: err.Error()})
		return
	}
	res := &extenderv1.ExtenderBindingResult{}
	if err := e.Bind(r.Context(), args); err != nil {
		klog.FromContext(r.Context()).Error(err, "Failed to bind", "pod", klog.KRef(args.PodNamespace, args.PodName), "node", args.Node)
		res.Error = err.Error()
	}
	writeJSON(w, http.StatusOK, res)
}

// Bind binds a pod as HAMi's scheduler does: it takes the node lock for the pod when a regular
// container asks for a GPU (package nodelock; a node locked by another live pod within the
// lock timeout fails the bind with HAMi's "node <node> has been locked within 5m0s", after
// Options.NodeLockWait), and creates the pods/binding carrying hami.io/bind-phase "allocating"
// and hami.io/bind-time as annotations, which the API server writes onto the pod together with
// spec.nodeName (HAMi merge-patches them first, one more request; the pod ends up the same).
// The lock stays for the device plugin to release after Allocate. On a failure after the lock
// was taken, Bind releases the lock and sets bind-phase "failed" (HAMi leaves "allocating"),
// records BindingFailed and returns the error; the pod's devices and quota usage count until
// it is filtered again or deleted, as HAMi counts them.
//
// On a node that serves the vendor's count resource through DRA (Options.DeviceClasses, see
// [Extender.Filter]) Bind creates a plain Binding: no node lock, no bind annotations; the
// kubelet's DRA manager prepares the claim kube-scheduler allocated.
func (e *Extender) Bind(ctx context.Context, args *extenderv1.ExtenderBindingArgs) (err error) {
	defer func(start time.Time) { e.metrics.bound(start, err) }(e.opts.Clock.Now())
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "pod", klog.KRef(args.PodNamespace, args.PodName), "node", args.Node)
	pod, err := e.pod(ctx, args)
	if err != nil {
		e.stats.bindErrors.Add(1)
		return err
	}
	if err := e.bind(ctx, pod, args.Node); err != nil {
		e.stats.bindErrors.Add(1)
		// The pod keeps holding what its annotations say until it is filtered again (which
		// replaces it) or deleted, as HAMi counts it.
		if e.opts.EventRecorder != nil {
			e.opts.EventRecorder.Eventf(pod, corev1.EventTypeWarning, EventBindingFailed, "Failed to bind node [%s] to %s/%s: %v", args.Node, pod.Namespace, pod.Name, err)
		}
		return err
	}
	e.stats.binds.Add(1)
	logger.V(2).Info("Bound pod")
	if e.opts.EventRecorder != nil {
		e.opts.EventRecorder.Eventf(pod, corev1.EventTypeNormal, EventBindingSucceed, "Successfully binding node [%s] to %s/%s", args.Node, pod.Namespace, pod.Name)
	}
	return nil
}

// pod returns the pod to bind: from the informer, else (not delivered yet) from the API.
//
// A bind names its pod by namespace and name, and the UID only confirms it: a request is
// never matched to a cached reservation by UID (HAMi v2.10.0's Bind frees the reservation of
// whatever pod has the UID sent when the name does not exist, HAMi #3030). The only
// reservation a bind may drop is the one cached under the request's own namespace/name, and
// only once the API server answers NotFound for that name (dropGone); a pod that exists
// under the name with another UID keeps what it holds (the pod informer replaces or removes
// it).
func (e *Extender) pod(ctx context.Context, args *extenderv1.ExtenderBindingArgs) (*corev1.Pod, error) {
	pod, err := e.podLister.Pods(args.PodNamespace).Get(args.PodName)
	if apierrors.IsNotFound(err) {
		pod, err = e.client.CoreV1().Pods(args.PodNamespace).Get(ctx, args.PodName, metav1.GetOptions{})
	}
	switch {
	case apierrors.IsNotFound(err):
		e.dropGone(ctx, args.PodNamespace, args.PodName)
		return nil, fmt.Errorf("bind %s/%s: %w", args.PodNamespace, args.PodName, ErrPodNotFound)
	case err != nil:
		return nil, fmt.Errorf("bind %s/%s: get pod: %w", args.PodNamespace, args.PodName, err)
	case args.PodUID != "" && pod.UID != args.PodUID:
		return nil, fmt.Errorf("bind %s/%s: pod has UID %s, not %s: %w", args.PodNamespace, args.PodName, pod.UID, args.PodUID, ErrPodNotFound)
	}
	return pod, nil
}

func (e *Extender) bind(ctx context.Context, pod *corev1.Pod, node string) error {
	if e.draNode(e.mapping(), node) {
		return e.bindDRA(ctx, pod, node)
	}
	name := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
	req := allocation.Requests(pod, e.opts.Config)
	locked := false
	for _, r := range req.Containers[req.Init:] { // HAMi locks when a regular container asks
		if r.Count > 0 {
			locked = true
			break
		}
	}
	if locked {
		waitStart := e.opts.Clock.Now()
		// The binds of one node take turns (nodelock.Queue): the lock admits one pod per node
		// until that pod's Allocate anyway.
		done, err := e.lockQueue.Acquire(ctx, node, name, e.opts.NodeLockWait)
		e.metrics.nodeLockWaited(waitStart)
		if err != nil {
			return fmt.Errorf("bind %s to %s: %w", name, node, err)
		}
		defer done()
	}
	// The API server merges a Binding's annotations into the pod with spec.nodeName, in one
	// write: HAMi's bind-phase patch and the Binding are one request here, and no pod is ever
	// "allocating" without a node.
	bindTime := strconv.FormatInt(e.opts.Clock.Now().Unix(), 10)
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Annotations: map[string]string{
			allocation.KeyBindPhase: string(allocation.PhaseAllocating),
			allocation.KeyBindTime:  bindTime,
		}},
		Target: corev1.ObjectReference{Kind: "Node", Name: node},
	}
	err := e.client.CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{})
	if err == nil {
		return nil
	}
	err = fmt.Errorf("bind %s to %s: create binding: %w", name, node, err)
	if locked {
		e.rollback(ctx, pod, node, bindTime)
	}
	return err
}

// rollback releases the pod's lock and marks the bind failed (bind-phase "failed" with the
// bind-time); errors are logged, the bind's error is what the caller returns.
func (e *Extender) rollback(ctx context.Context, pod *corev1.Pod, node, bindTime string) {
	logger := klog.FromContext(ctx)
	name := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
	if err := e.locker.Release(ctx, node, name); err != nil {
		logger.Error(err, "Failed to release the node lock after a failed bind", "pod", klog.KObj(pod), "node", node)
	}
	if err := e.patchPod(ctx, pod.Namespace, pod.Name, map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		allocation.KeyBindPhase: string(allocation.PhaseFailed),
		allocation.KeyBindTime:  bindTime,
	}}}); err != nil {
		logger.Error(err, "Failed to mark the bind failed", "pod", klog.KObj(pod))
	}
}

// dropGone drops what the usage holds under namespace/name once the API server confirms that
// no pod of that name exists: a reservation assumed at filter for a pod deleted before the
// informer delivered it. Nothing is cached under the name (every request naming a pod that
// never existed): nothing to do, no request. Otherwise the API is asked again while the
// filter's lock is held, so that a pod created under the name meanwhile, and filtered, keeps
// its reservation: its filter assumes only after this drop.
func (e *Extender) dropGone(ctx context.Context, namespace, name string) {
	key := podKey(namespace, name)
	if _, held := e.usage.Pod(key); !held {
		return
	}
	e.filterMu.Lock()
	defer e.filterMu.Unlock()
	if _, err := e.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		return
	}
	e.usage.Delete(key)
	klog.FromContext(ctx).V(2).Info("Dropped the reservation of a pod that no longer exists", "pod", klog.KRef(namespace, name))
}
