package kubeletpeer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	resourcev1client "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	plugincache "k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"

	"github.com/hamireg/hamireg/envtest"
)

const draTempPrefix = "hamireg-dra-"

// DRAManagerOptions configures [StartDRAManager]. Client and NodeName are required.
type DRAManagerOptions struct {
	// Client is the kubelet's client: the manager reads ResourceClaims and the Node with
	// it, and deletes the node's ResourceSlices at start. Required.
	Client kubernetes.Interface
	// NodeName is the node the manager runs on. Required; the Node object need not exist
	// yet (the start-up wipe of ResourceSlices waits for it).
	NodeName string
	// StateDir holds the manager's checkpoint (dra_manager_state). Default: a new folder
	// under os.TempDir(), removed by Stop. A DRAManager started again on the same StateDir
	// is a kubelet restart: it knows the claims it prepared before.
	StateDir string
	// RegistryDir is the folder the plugin manager watches for registration sockets
	// (the kubelet's /var/lib/kubelet/plugins_registry). Default: a new folder under
	// os.TempDir(), removed by Stop. Keep it short: a unix socket path has at most 107
	// bytes, and drivers put <driver>-reg.sock here.
	RegistryDir string
	// ActivePods lists the pods that run on the node; every 60 s the manager unprepares
	// the claims of prepared pods that are not in the list. Default: the pods of NodeName
	// from the API server (spec.nodeName), without those in phase Succeeded or Failed; a
	// failed list skips that round.
	ActivePods func() []*corev1.Pod
	// EventRecorder receives the plugin manager's events (failed registrations). Default:
	// events are dropped.
	EventRecorder record.EventRecorder
}

// DRAManager is the kubelet's DRA manager (k8s.io/kubernetes/pkg/kubelet/cm/dra) with the
// kubelet's plugin manager (pkg/kubelet/pluginmanager) watching RegistryDir, in-process,
// wired as the kubelet's container manager wires them. DRA drivers register by putting
// their registration socket in [DRAManager.RegistryDir]; [DRAManager.Prepare],
// [DRAManager.GetResources] and [DRAManager.Unprepare] are the kubelet admitting a pod,
// creating its containers and tearing it down.
type DRAManager struct {
	opts           DRAManagerOptions
	ownedDirs      []string
	mgr            *dra.Manager
	handler        *draHandler
	cancel         context.CancelCauseFunc
	stopPlugins    chan struct{}
	pluginsStopped chan struct{}
	wiped          chan struct{}
	stopOnce       sync.Once
	stopErr        error

	logger  klog.Logger
	done    <-chan struct{} // closed by Stop
	status  podRegistry     // pods prepared, for SyncPodStatus
	syncing atomic.Bool     // a SyncPodStatus runs
}

// StartDRAManager starts the DRA manager and the plugin manager. It returns once both run;
// the manager's start-up deletion of the node's ResourceSlices runs in the background
// ([DRAManager.WaitForWipe]). The manager logs through klog.FromContext(ctx) and runs
// until [DRAManager.Stop], not until ctx is done.
func StartDRAManager(ctx context.Context, opts DRAManagerOptions) (_ *DRAManager, err error) {
	if opts.Client == nil {
		return nil, errors.New("start DRA manager: Options.Client is required")
	}
	if opts.NodeName == "" {
		return nil, errors.New("start DRA manager: Options.NodeName is required")
	}
	m := &DRAManager{
		opts:           opts,
		stopPlugins:    make(chan struct{}),
		pluginsStopped: make(chan struct{}),
		wiped:          make(chan struct{}),
	}
	defer func() {
		if err != nil {
			_ = m.Stop()
		}
	}()
	for _, d := range []*string{&m.opts.StateDir, &m.opts.RegistryDir} {
		if err := m.ensureDir(d); err != nil {
			return nil, err
		}
	}
	if m.opts.EventRecorder == nil {
		m.opts.EventRecorder = &record.FakeRecorder{} // no channel: events are dropped
	}
	logger := klog.FromContext(ctx)
	runCtx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	m.cancel = cancel
	m.logger, m.done = logger, runCtx.Done()
	sources := config.NewSourcesReady(func(sets.Set[string]) bool { return true })
	activePods := m.opts.ActivePods
	if activePods == nil {
		np := &nodePods{ctx: runCtx, client: opts.Client, nodeName: opts.NodeName}
		activePods, sources = np.list, np
	}

	client := &wipeWatchingClient{Interface: opts.Client, nodeName: opts.NodeName, wiped: m.wiped}
	mgr, err := dra.NewManager(logger, client, m.opts.StateDir)
	if err != nil {
		return nil, fmt.Errorf("start DRA manager: %w", err)
	}
	getNode := func(ctx context.Context) (*corev1.Node, error) {
		return opts.Client.CoreV1().Nodes().Get(ctx, opts.NodeName, metav1.GetOptions{})
	}
	if err := mgr.Start(runCtx, dra.ActivePodsFunc(activePods), getNode, sources); err != nil {
		cancel(err)
		mgr.Stop()
		return nil, fmt.Errorf("start DRA manager: %w", err)
	}
	m.mgr = mgr

	// As the kubelet: the container manager's handler for type DRAPlugin, added to the
	// plugin manager before it runs (kubelet.go initializeRuntimeDependentModules).
	m.handler = newDRAHandler(mgr.GetWatcherHandler())
	pm := pluginmanager.NewPluginManager(m.opts.RegistryDir, m.opts.EventRecorder)
	pm.AddHandler(pluginwatcherapi.DRAPlugin, m.handler)
	go func() {
		defer close(m.pluginsStopped)
		pm.Run(runCtx, sources, m.stopPlugins)
	}()
	return m, nil
}

// ensureDir creates *dir, or a temp folder (recorded for Stop) when it is empty.
func (m *DRAManager) ensureDir(dir *string) error {
	if *dir == "" {
		envtest.RemoveStaleDirs(draTempPrefix)
		d, err := envtest.MakeTempDir(draTempPrefix)
		if err != nil {
			return fmt.Errorf("start DRA manager: %w", err)
		}
		m.ownedDirs = append(m.ownedDirs, d)
		*dir = d
		return nil
	}
	abs, err := filepath.Abs(*dir)
	if err != nil {
		return fmt.Errorf("start DRA manager: resolve %s: %w", *dir, err)
	}
	if err := os.MkdirAll(abs, 0o750); err != nil {
		return fmt.Errorf("start DRA manager: create %s: %w", abs, err)
	}
	*dir = abs
	return nil
}

// RegistryDir is the folder the plugin manager watches: a driver's RegistrarDirectoryPath.
func (m *DRAManager) RegistryDir() string { return m.opts.RegistryDir }

// StateDir is the folder of the manager's checkpoint.
func (m *DRAManager) StateDir() string { return m.opts.StateDir }

// Prepare is the kubelet admitting pod: for each of its claims (which must be allocated
// and reserved for pod) it calls NodePrepareResources of the claim's drivers and records
// the CDI devices they return (DRA manager PrepareResources).
func (m *DRAManager) Prepare(ctx context.Context, pod *corev1.Pod) error {
	if err := m.mgr.PrepareResources(ctx, pod); err != nil {
		return err
	}
	m.status.add(pod)
	return nil
}

// GetResources is what the kubelet hands the container runtime for the container named
// container of pod: the CDI device IDs (<vendor>/<class>=<name>) of the claim requests the
// container uses, in the manager's order. The pod must have been prepared.
func (m *DRAManager) GetResources(pod *corev1.Pod, container string) ([]string, error) {
	var c *corev1.Container
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			if list[i].Name == container {
				c = &list[i]
			}
		}
	}
	if c == nil {
		return nil, fmt.Errorf("get DRA resources: pod %s/%s has no container %q", pod.Namespace, pod.Name, container)
	}
	info, err := m.mgr.GetResources(pod, c)
	if err != nil {
		return nil, fmt.Errorf("get DRA resources of %s/%s container %s: %w", pod.Namespace, pod.Name, container, err)
	}
	ids := make([]string, 0, len(info.CDIDevices))
	for _, d := range info.CDIDevices {
		ids = append(ids, d.Name)
	}
	return ids, nil
}

// Unprepare is the kubelet after pod's containers stopped: NodeUnprepareResources for each
// claim pod holds that no other prepared pod holds (DRA manager UnprepareResources).
// Idempotent.
func (m *DRAManager) Unprepare(ctx context.Context, pod *corev1.Pod) error {
	if err := m.mgr.UnprepareResources(ctx, pod); err != nil {
		return err
	}
	m.status.remove(pod.UID)
	return nil
}

// WaitForDriver waits until a plugin of driverName has registered through RegistryDir
// (the DRA manager accepted it), or ctx is done.
func (m *DRAManager) WaitForDriver(ctx context.Context, driverName string) error {
	for {
		ok, changed := m.handler.registered(driverName)
		if ok {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("wait for DRA driver %s to register: %w", driverName, context.Cause(ctx))
		}
	}
}

// Registrations is how often a plugin of driverName has registered since Start: a driver
// restarted registers again.
func (m *DRAManager) Registrations(driverName string) int {
	m.handler.mu.Lock()
	defer m.handler.mu.Unlock()
	return m.handler.count[driverName]
}

// WaitForWipe waits until the manager's start-up deletion of the node's ResourceSlices
// (all drivers) has succeeded, or ctx is done. A driver that publishes before that sees
// its slices deleted once; the upstream resourceslice controller recreates them.
func (m *DRAManager) WaitForWipe(ctx context.Context) error {
	select {
	case <-m.wiped:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for the DRA manager to delete the ResourceSlices of node %s: %w", m.opts.NodeName, context.Cause(ctx))
	}
}

// Stop stops the plugin manager and the DRA manager (closing its connections to the
// plugins) and removes the folders Start created. Idempotent. Registered plugins are not
// told; their sockets stay.
func (m *DRAManager) Stop() error {
	m.stopOnce.Do(func() {
		if m.cancel != nil {
			m.cancel(errors.New("DRA manager stopped"))
		}
		if m.mgr != nil {
			close(m.stopPlugins)
			select {
			case <-m.pluginsStopped:
			case <-time.After(30 * time.Second):
				m.stopErr = errors.New("stop DRA manager: the plugin manager did not stop within 30s")
			}
			m.mgr.Stop()
		}
		for _, d := range m.ownedDirs {
			if err := os.RemoveAll(d); err != nil && m.stopErr == nil {
				m.stopErr = fmt.Errorf("stop DRA manager: %w", err)
			}
		}
	})
	return m.stopErr
}

// draHandler is the DRA manager's plugin handler with a record of the registered
// plugins, so that WaitForDriver can wait on a change.
type draHandler struct {
	inner plugincache.PluginHandler

	mu        sync.Mutex
	endpoints map[string][]string // driver → endpoints registered
	count     map[string]int      // driver → successful registrations
	changed   chan struct{}       // closed and replaced at every change
}

var _ plugincache.PluginHandler = (*draHandler)(nil)

func newDRAHandler(inner plugincache.PluginHandler) *draHandler {
	return &draHandler{inner: inner, endpoints: map[string][]string{}, count: map[string]int{}, changed: make(chan struct{})}
}

func (h *draHandler) registered(driver string) (bool, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.endpoints[driver]) > 0, h.changed
}

func (h *draHandler) notifyLocked() {
	close(h.changed)
	h.changed = make(chan struct{})
}

func (h *draHandler) ValidatePlugin(ctx context.Context, name, endpoint string, versions []string) error {
	return h.inner.ValidatePlugin(ctx, name, endpoint, versions)
}

func (h *draHandler) RegisterPlugin(ctx context.Context, name, endpoint string, versions []string, timeout *time.Duration) error {
	if err := h.inner.RegisterPlugin(ctx, name, endpoint, versions, timeout); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.endpoints[name] = append(h.endpoints[name], endpoint)
	h.count[name]++
	h.notifyLocked()
	return nil
}

func (h *draHandler) DeRegisterPlugin(ctx context.Context, name, endpoint string) {
	h.inner.DeRegisterPlugin(ctx, name, endpoint)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.endpoints[name] = slices.DeleteFunc(h.endpoints[name], func(e string) bool { return e == endpoint })
	h.notifyLocked()
}

// nodePods is the default ActivePods: the node's pods from the API server. It is also the
// manager's SourcesReady: the reconcile loop asks AllReady right before ActivePods, so a
// failed list makes that round a no-op instead of an empty list (which would unprepare
// every claim).
type nodePods struct {
	client   kubernetes.Interface
	nodeName string
	ctx      context.Context //nolint:containedctx // the manager's lifetime; the kubelet's interfaces take none

	mu   sync.Mutex
	pods []*corev1.Pod
}

var _ config.SourcesReady = (*nodePods)(nil)

func (p *nodePods) AddSource(string) {}

func (p *nodePods) AllReady() bool {
	list, err := p.client.CoreV1().Pods(metav1.NamespaceAll).List(p.ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", p.nodeName).String(),
	})
	if err != nil {
		klog.FromContext(p.ctx).V(3).Info("Listing the node's pods failed, skipping the DRA manager's reconcile round", "node", p.nodeName, "err", err)
		return false
	}
	pods := make([]*corev1.Pod, 0, len(list.Items))
	for i := range list.Items {
		if ph := list.Items[i].Status.Phase; ph == corev1.PodSucceeded || ph == corev1.PodFailed {
			continue
		}
		pods = append(pods, &list.Items[i])
	}
	p.mu.Lock()
	p.pods = pods
	p.mu.Unlock()
	return true
}

func (p *nodePods) list() []*corev1.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pods
}

// wipeWatchingClient is the manager's client: it closes wiped after the first successful
// deletion of all of the node's ResourceSlices (the start-up wipe; the per-driver wipes
// after a deregistration also select on the driver).
type wipeWatchingClient struct {
	kubernetes.Interface
	nodeName string
	once     sync.Once
	wiped    chan struct{}
}

func (c *wipeWatchingClient) ResourceV1() resourcev1client.ResourceV1Interface {
	return resourceV1{ResourceV1Interface: c.Interface.ResourceV1(), c: c}
}

type resourceV1 struct {
	resourcev1client.ResourceV1Interface
	c *wipeWatchingClient
}

func (r resourceV1) ResourceSlices() resourcev1client.ResourceSliceInterface {
	return resourceSlices{ResourceSliceInterface: r.ResourceV1Interface.ResourceSlices(), c: r.c}
}

type resourceSlices struct {
	resourcev1client.ResourceSliceInterface
	c *wipeWatchingClient
}

func (s resourceSlices) DeleteCollection(ctx context.Context, opts metav1.DeleteOptions, listOpts metav1.ListOptions) error {
	err := s.ResourceSliceInterface.DeleteCollection(ctx, opts, listOpts)
	all := fields.OneTermEqualSelector(resourcev1.ResourceSliceSelectorNodeName, s.c.nodeName).String()
	if (err == nil || apierrors.IsNotFound(err)) && listOpts.FieldSelector == all {
		s.c.once.Do(func() { close(s.c.wiped) })
	}
	return err
}
