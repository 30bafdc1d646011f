package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/client-go/util/retry"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/envtest/kubeletpeer"
)

// DRAWait bounds the DRA helpers' waits: generous, since CI machines are slow and a
// scheduler retries an unschedulable pod with back-off.
const DRAWait = 90 * time.Second

// ClaimRequest is the one request ("gpu") of a test claim: Count GPUs (0: 1), each with
// Memory and Cores from its capacity (quantities as kubectl writes them, "10Gi", "30"; empty:
// the capacity's default), and CEL Selectors.
type ClaimRequest struct {
	Count         int64
	Memory, Cores string
	Selectors     []string
}

// ClaimRequestName is the name of a test claim's request, and of the pod's claim entry.
const ClaimRequestName = "gpu"

// Claim is the ResourceClaim ns/name asking class for r.
func Claim(ns, name, class string, r ClaimRequest) *resourcev1.ResourceClaim {
	req := &resourcev1.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: max(r.Count, 1)}
	caps := map[resourcev1.QualifiedName]resource.Quantity{}
	if r.Memory != "" {
		caps[dra.CapacityMemory] = resource.MustParse(r.Memory)
	}
	if r.Cores != "" {
		caps[dra.CapacityCores] = resource.MustParse(r.Cores)
	}
	if len(caps) > 0 {
		req.Capacity = &resourcev1.CapacityRequirements{Requests: caps}
	}
	for _, cel := range r.Selectors {
		req.Selectors = append(req.Selectors, resourcev1.DeviceSelector{CEL: &resourcev1.CELDeviceSelector{Expression: cel}})
	}
	return &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: ClaimRequestName, Exactly: req}}}},
	}
}

// CreateDeviceClass creates dra.DeviceClass(p) unless a class of that name exists. Classes
// are cluster-wide and named after the driver, so the tests of a binary share them; they
// are never deleted (the control plane goes with the binary).
func (cp *ControlPlane) CreateDeviceClass(tb testing.TB, p dra.Profile) *resourcev1.DeviceClass {
	tb.Helper()
	classes := cp.AdminClient().ResourceV1().DeviceClasses()
	c, err := classes.Create(tb.Context(), dra.DeviceClass(p), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		c, err = classes.Get(tb.Context(), p.Driver, metav1.GetOptions{})
	}
	if err != nil {
		tb.Fatalf("create DeviceClass %s: %v", p.Driver, err)
	}
	return c
}

// CreateClaimPod creates a pod ns/podName that uses claim (container "cuda", through the pod
// claim entry [ClaimRequestName] naming the claim) and is pinned to node by its
// kubernetes.io/hostname label, for kube-scheduler to place, then claim, owned by the pod
// (dra.SetPodOwner), so that a garbage collector deletes it with the pod. When tb ends, the
// pod and the claim are released ([ControlPlane.ReleaseClaim]).
func (cp *ControlPlane) CreateClaimPod(tb testing.TB, node, podName string, claim *resourcev1.ResourceClaim) (*resourcev1.ResourceClaim, *corev1.Pod) {
	tb.Helper()
	ctx := tb.Context()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName, Namespace: claim.Namespace},
		Spec: corev1.PodSpec{
			NodeSelector:   map[string]string{corev1.LabelHostname: node},
			ResourceClaims: []corev1.PodResourceClaim{{Name: ClaimRequestName, ResourceClaimName: &claim.Name}},
			Containers: []corev1.Container{{
				Name: "cuda", Image: "registry.invalid/cuda:0",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: ClaimRequestName}}},
			}},
		},
	}
	p, err := cp.AdminClient().CoreV1().Pods(claim.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("create pod %s: %v", podName, err)
	}
	tb.Cleanup(func() { cp.ReleaseClaim(tb, p.Namespace, p.Name, claim.Name) })
	owned := claim.DeepCopy()
	if err := dra.SetPodOwner(owned, p); err != nil {
		tb.Fatal(err)
	}
	c, err := cp.AdminClient().ResourceV1().ResourceClaims(claim.Namespace).Create(ctx, owned, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("create ResourceClaim %s: %v", claim.Name, err)
	}
	return c, p
}

// WaitForClaim waits until the claim ns/name satisfies cond and returns it; it fails tb,
// naming what, after [DRAWait].
func (cp *ControlPlane) WaitForClaim(tb testing.TB, ns, name, what string, cond func(*resourcev1.ResourceClaim) bool) *resourcev1.ResourceClaim {
	tb.Helper()
	claims := cp.AdminClient().ResourceV1().ResourceClaims(ns)
	lw := nameListWatch(name, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return claims.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return claims.Watch(ctx, o) })
	return waitForObject(tb, lw, &resourcev1.ResourceClaim{}, fmt.Sprintf("claim %s/%s %s", ns, name, what), cond)
}

// WaitForAllocation waits until kube-scheduler has allocated the claim ns/name and reserved
// it (status.allocation and reservedFor set) and returns it.
func (cp *ControlPlane) WaitForAllocation(tb testing.TB, ns, name string) *resourcev1.ResourceClaim {
	tb.Helper()
	return cp.WaitForClaim(tb, ns, name, "allocated and reserved", func(c *resourcev1.ResourceClaim) bool {
		return c.Status.Allocation != nil && len(c.Status.ReservedFor) > 0
	})
}

// WaitForPod waits until the pod ns/name satisfies cond and returns it; it fails tb, naming
// what, after [DRAWait].
func (cp *ControlPlane) WaitForPod(tb testing.TB, ns, name, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	tb.Helper()
	pods := cp.AdminClient().CoreV1().Pods(ns)
	lw := nameListWatch(name, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return pods.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return pods.Watch(ctx, o) })
	return waitForObject(tb, lw, &corev1.Pod{}, fmt.Sprintf("pod %s/%s %s", ns, name, what), cond)
}

// WaitForBound waits until the pod ns/name is bound to a node and returns it.
func (cp *ControlPlane) WaitForBound(tb testing.TB, ns, name string) *corev1.Pod {
	tb.Helper()
	return cp.WaitForPod(tb, ns, name, "bound", func(p *corev1.Pod) bool { return p.Spec.NodeName != "" })
}

// WaitForUnschedulable waits until kube-scheduler has marked the pod ns/name unschedulable
// (condition PodScheduled False, reason Unschedulable) and returns the condition's message,
// e.g. "0/1 nodes are available: 1 cannot allocate all claims. …".
func (cp *ControlPlane) WaitForUnschedulable(tb testing.TB, ns, name string) string {
	tb.Helper()
	pod := cp.WaitForPod(tb, ns, name, "unschedulable", func(p *corev1.Pod) bool { return unschedulable(p) != "" })
	return unschedulable(pod)
}

func unschedulable(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return c.Message
		}
	}
	return ""
}

// ReleaseClaim does what kube-controller-manager and the kubelet would when a pod using a
// claim goes away, which this control plane lacks: it force-deletes the pod ns/pod (no
// kubelet confirms the deletion), clears the claim's status (allocation and reservedFor),
// removes its finalizers (kube-scheduler's resource.kubernetes.io/delete-protection) and
// deletes it. Objects already gone are fine; other errors fail tb.
func (cp *ControlPlane) ReleaseClaim(tb testing.TB, ns, pod, claim string) {
	tb.Helper()
	ctx := context.WithoutCancel(tb.Context())
	client := cp.AdminClient()
	if err := client.CoreV1().Pods(ns).Delete(ctx, pod, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil && !apierrors.IsNotFound(err) {
		tb.Errorf("force-delete pod %s/%s: %v", ns, pod, err)
	}
	claims := client.ResourceV1().ResourceClaims(ns)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := claims.Get(ctx, claim, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c.Status.Allocation != nil || len(c.Status.ReservedFor) > 0 || len(c.Status.Devices) > 0 {
			c.Status = resourcev1.ResourceClaimStatus{}
			if c, err = claims.UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
				return err
			}
		}
		if len(c.Finalizers) > 0 {
			c.Finalizers = nil
			if _, err := claims.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
				return err
			}
		}
		return claims.Delete(ctx, claim, metav1.DeleteOptions{})
	})
	if err != nil && !apierrors.IsNotFound(err) {
		tb.Errorf("release claim %s/%s: %v", ns, claim, err)
	}
}

// StartDRAManagerForTest starts the kubelet's DRA manager (kubeletpeer.StartDRAManager) for
// one test, with the admin client when opts.Client is nil; it waits until the manager has
// wiped the node's ResourceSlices (the Node must exist) and stops it when tb ends.
func (cp *ControlPlane) StartDRAManagerForTest(tb testing.TB, opts kubeletpeer.DRAManagerOptions) *kubeletpeer.DRAManager {
	tb.Helper()
	if opts.Client == nil {
		opts.Client = cp.AdminClient()
	}
	m, err := kubeletpeer.StartDRAManager(Context(tb), opts)
	if err != nil {
		tb.Fatalf("start the kubelet DRA manager: %v", err)
	}
	tb.Cleanup(func() {
		if err := m.Stop(); err != nil {
			tb.Errorf("stop the DRA manager: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(tb.Context(), DRAWait)
	defer cancel()
	if err := m.WaitForWipe(ctx); err != nil {
		tb.Fatal(err)
	}
	return m
}

// WaitForDriver waits until a plugin of driver has registered with m.
func WaitForDriver(tb testing.TB, m *kubeletpeer.DRAManager, driver string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), DRAWait)
	defer cancel()
	if err := m.WaitForDriver(ctx, driver); err != nil {
		tb.Fatal(err)
	}
}

// CDIEdits are the container edits a CDI device ID resolves to: the spec's and the
// device's, as a container runtime applies them.
type CDIEdits struct {
	// Path is the spec file the device is in.
	Path string
	// Env and Mounts are the spec-level edits followed by the device's.
	Env    []string
	Mounts []*cdispec.Mount
}

// EnvMap is Env as a map (the last value of a name wins, as in a container).
func (e CDIEdits) EnvMap() map[string]string {
	m := make(map[string]string, len(e.Env))
	for _, kv := range e.Env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// ResolveCDI finds the CDI device id ("<vendor>/<class>=<name>") among the JSON spec files
// in dir, as containerd does, and returns its edits; it fails tb when no spec has it.
func ResolveCDI(tb testing.TB, dir, id string) CDIEdits {
	tb.Helper()
	kind, name, ok := strings.Cut(id, "=")
	if !ok {
		tb.Fatalf("CDI device id %q: no '='", id)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		tb.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		var spec cdispec.Spec
		if err := json.Unmarshal(b, &spec); err != nil {
			tb.Fatalf("CDI spec %s: %v", f, err)
		}
		if spec.Kind != kind {
			continue
		}
		for _, d := range spec.Devices {
			if d.Name != name {
				continue
			}
			e := CDIEdits{Path: f}
			for _, ce := range []cdispec.ContainerEdits{spec.ContainerEdits, d.ContainerEdits} {
				e.Env = append(e.Env, ce.Env...)
				e.Mounts = append(e.Mounts, ce.Mounts...)
			}
			return e
		}
	}
	tb.Fatalf("CDI device %s: not in any spec in %s (%d files)", id, dir, len(files))
	return CDIEdits{}
}

// CDISpecFiles lists the JSON spec files in dir.
func CDISpecFiles(tb testing.TB, dir string) []string {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		tb.Fatal(err)
	}
	return files
}

// SliceWatch watches the ResourceSlices of one driver on one node from the moment it is
// made, counts the writes it sees (each ADDED, MODIFIED and DELETED event is one write) and
// keeps the latest slice.
type SliceWatch struct {
	writes atomic.Int64

	mu      sync.Mutex
	slices  map[string]*resourcev1.ResourceSlice // name → latest
	changed chan struct{}                        // closed and replaced at every event
}

// WatchSlices starts a SliceWatch of driver's slices on node; it stops when tb ends.
func (cp *ControlPlane) WatchSlices(tb testing.TB, driver, node string) *SliceWatch {
	tb.Helper()
	ctx, cancel := context.WithCancel(tb.Context())
	slicesClient := cp.AdminClient().ResourceV1().ResourceSlices()
	sel := fields.AndSelectors(
		fields.OneTermEqualSelector(resourcev1.ResourceSliceSelectorNodeName, node),
		fields.OneTermEqualSelector(resourcev1.ResourceSliceSelectorDriver, driver)).String()
	list, err := slicesClient.List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		cancel()
		tb.Fatalf("list ResourceSlices: %v", err)
	}
	w := &SliceWatch{slices: map[string]*resourcev1.ResourceSlice{}, changed: make(chan struct{})}
	for i := range list.Items {
		w.slices[list.Items[i].Name] = &list.Items[i]
	}
	rw, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return slicesClient.Watch(ctx, o)
		},
	})
	if err != nil {
		cancel()
		tb.Fatalf("watch ResourceSlices: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range rw.ResultChan() {
			s, ok := ev.Object.(*resourcev1.ResourceSlice)
			if !ok {
				continue
			}
			w.mu.Lock()
			switch ev.Type {
			case watch.Added, watch.Modified:
				w.slices[s.Name] = s
			case watch.Deleted:
				delete(w.slices, s.Name)
			default:
				w.mu.Unlock()
				continue
			}
			w.writes.Add(1)
			close(w.changed)
			w.changed = make(chan struct{})
			w.mu.Unlock()
		}
	}()
	tb.Cleanup(func() {
		cancel()
		rw.Stop()
		<-done
	})
	return w
}

// Writes is the number of slice writes seen so far.
func (w *SliceWatch) Writes() int64 { return w.writes.Load() }

// Slices returns the latest slices, in no order.
func (w *SliceWatch) Slices() []*resourcev1.ResourceSlice {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]*resourcev1.ResourceSlice, 0, len(w.slices))
	for _, s := range w.slices {
		out = append(out, s)
	}
	return out
}

// WaitFor waits until cond holds for the latest slices and returns them; it fails tb,
// naming what, after [DRAWait].
func (w *SliceWatch) WaitFor(tb testing.TB, what string, cond func([]*resourcev1.ResourceSlice) bool) []*resourcev1.ResourceSlice {
	tb.Helper()
	timeout := time.NewTimer(DRAWait)
	defer timeout.Stop()
	for {
		w.mu.Lock()
		changed := w.changed
		w.mu.Unlock()
		if s := w.Slices(); cond(s) {
			return s
		}
		select {
		case <-changed:
		case <-timeout.C:
			tb.Fatalf("timed out after %v waiting for ResourceSlices: %s (%d slices, %d writes)", DRAWait, what, len(w.Slices()), w.Writes())
		case <-tb.Context().Done():
			tb.Fatalf("test ended while waiting for ResourceSlices: %s", what)
		}
	}
}

// nameListWatch lists and watches the one object called name.
func nameListWatch(name string, list func(context.Context, metav1.ListOptions) (runtime.Object, error), wt func(context.Context, metav1.ListOptions) (watch.Interface, error)) *cache.ListWatch {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return wt(ctx, o)
		},
	}
}

// waitForObject waits, through a list and watch, until the object of lw (of the type of
// into) satisfies cond.
func waitForObject[T runtime.Object](tb testing.TB, lw *cache.ListWatch, into T, what string, cond func(T) bool) T {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), DRAWait)
	defer cancel()
	var last T
	ev, err := watchtools.UntilWithSync(ctx, lw, into, nil, func(ev watch.Event) (bool, error) {
		o, ok := ev.Object.(T)
		if !ok || ev.Type == watch.Deleted {
			return false, nil
		}
		last = o
		return cond(o), nil
	})
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, watchtools.ErrWatchClosed) || ctx.Err() != nil {
			tb.Fatalf("timed out after %v waiting for %s (last seen: %s)", DRAWait, what, describe(last))
		}
		tb.Fatalf("wait for %s: %v", what, err)
	}
	return ev.Object.(T)
}

func describe(o any) string {
	b, err := json.Marshal(o)
	if err != nil || len(b) > 4000 {
		return fmt.Sprintf("%T", o)
	}
	return string(b)
}
